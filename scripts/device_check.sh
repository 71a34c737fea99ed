#!/usr/bin/env bash
# One call on a GPU machine: build for the local GPU, run the tests (CPU and GPU) and (optionally) benchmarks.
# Logs and result files are written to a staging folder and packed into $OUT/results.tgz at exit
# (the device tool returns at most 8 files), with the console summary in $OUT/summary.txt. Usage:
#   scripts/device_check.sh [build] [test[=PYTEST_ARGS]] [demo[=ARGS]] [sanitize=SCRIPT] [bench=NAME[:ARGS]]
#                           [ncu=KERNEL_REGEX@NAME[:ARGS]] ...
# demo/bench/ncu ARGS are comma-separated (commas become spaces; a doubled comma is a literal one, e.g.
# bench=prefill:--patterns,dense,,random passes `--patterns dense,random`). ncu profiles the 21st matching launch of
# bench/NAME.py with the full section set and source counters into ncu_NAME.ncu-rep, and exports its
# details and per-line source page (SASS with CUDA lines) as text beside it (a second ncu stage's files end
# in _2, a third's in _3), e.g.
#   ncu=token_decode_kernel@decode:--only,D-B1,--iters,3
# e.g. MSA_COMMIT=<sha as git shows it here> scripts/device_check.sh build test bench=decode:--quick
# (set MSA_COMMIT from this machine: the copy of the tree on the device carries a stale .git, if any)
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/out}
OUT=$(mktemp -d)
mkdir -p "$FINAL"
pack() { tar -C "$OUT" -czf "$FINAL/results.tgz" . ; }
trap pack EXIT
trap 'exit 124' TERM INT  # a timeout still packs what was written
exec > >(tee "$FINAL/summary.txt") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/build/python:$PWD/tests/python OUT
ARCH=${MSA_CUDA_ARCH:-90a-real}
rc=0
# Comma-separated stage arguments -> words; ",," stands for a literal comma inside one word.
words() { local a=${1//,,/$'\x1f'}; a=${a//,/ }; printf '%s\n' "${a//$'\x1f'/,}"; }
step() { echo "== $* ($(date +%T))"; }
for stage in "$@"; do
  case "$stage" in
    build)
      step build
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
      cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DMSA_BUILD_TESTS=ON > "$OUT/cmake.log" 2>&1 \
        || { tail -30 "$OUT/cmake.log"; exit 1; }
      ( time cmake --build build -j"$(nproc)" ) > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
      tail -3 "$OUT/build.log" ;;
    test|test=*)
      args=${stage#test}; args=${args#=}
      # The CPU tests too (no -m gpu): the device's toolchain and Python differ from CI's (its /opt/gcc links
      # libstdc++ statically, which crashes repr(msa.Plan) and every error message with a number unless the
      # module hides those symbols; only the CPU tests exercise them).
      step "pytest $args"
      python3 -m pytest -q -rs -p no:cacheprovider ${args:-tests/python} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
      [ "${PIPESTATUS[0]}" = 0 ] || rc=1 ;;
    demo|demo=*)
      dargs=${stage#demo}; dargs=${dargs#=}; tag=${dargs//[^a-z0-9]/_}
      step "demo $dargs"
      ./build/msa demo $(words "$dargs") 2>&1 | tee "$OUT/demo$tag.log" | tail -15
      [ "${PIPESTATUS[0]}" = 0 ] || rc=1 ;;
    sanitize=*)
      script=${stage#sanitize=}
      for tool in memcheck racecheck synccheck; do
        step "compute-sanitizer $tool $script"
        log="$OUT/sanitize_$(basename "$script" .py)_${tool}.log"
        compute-sanitizer --tool $tool --error-exitcode 9 python3 "$script" > "$log" 2>&1
        r=$?; grep -E "SUMMARY" "$log" | tail -2; [ $r = 0 ] || rc=1
      done ;;
    bench=*)
      spec=${stage#bench=}; name=${spec%%:*}; bargs=""; [ "$spec" != "$name" ] && bargs=${spec#*:}
      step "bench $name $bargs"
      python3 "bench/$name.py" $(words "$bargs") 2>&1 | tee "$OUT/bench_$name.log" | tail -40
      [ "${PIPESTATUS[0]}" = 0 ] || rc=1 ;;
    ncu=*)
      spec=${stage#ncu=}; regex=${spec%%@*}; spec=${spec#*@}; name=${spec%%:*}; bargs=""
      [ "$spec" != "$name" ] && bargs=${spec#*:}
      step "ncu $regex on bench $name $bargs"
      n_ncu=$((${n_ncu:-0} + 1)); tag=$name; [ "$n_ncu" -gt 1 ] && tag=${name}_$n_ncu  # several ncu stages: _2, _3, ...
      rep="$OUT/ncu_$tag"
      ncu -k "regex:$regex" --launch-skip 20 --launch-count 1 --set full --import-source yes -f -o "$rep" \
        python3 "bench/$name.py" $(words "$bargs") > "$OUT/ncu_${tag}_run.log" 2>&1 || rc=1
      ncu -i "$rep.ncu-rep" --page details --print-details all > "$OUT/ncu_${tag}_details.txt" 2>&1
      ncu -i "$rep.ncu-rep" --page source --print-source cuda,sass --csv > "$OUT/ncu_${tag}_source.csv" 2>&1
      grep -E "Duration|Registers Per|Achieved Occ" "$OUT/ncu_${tag}_details.txt" | head -5 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
exit $rc
