#!/usr/bin/env bash
# A/B of two builds on a GPU machine with one bench (decode unless AB_BENCH names another), in alternating
# processes. Single runs of one build differ by 0.1-0.4 us at D-B1 between processes (the floors move with
# them), so a 0.2 us change shows only as A, B, A, B, ... in one call (docs/decode.md, "Alternatives measured"). Usage, from this tree (= B):
#   scripts/ab_bench.sh A_DIR[,A_DIR2,...] [REPS] [bench/decode.py args ...]
# A_DIR is another checkout, e.g. made here with `git worktree add ab_main main` and passed in the device
# call's carry list (several, comma-separated: each run then cycles A, A2, ..., B; lines are labelled by
# directory); default args: --quick --floor --only D-B1,D-B32,D-mixed --iters 100. AB_TESTS=1 first
# runs the decode GPU tests and compute-sanitizer (sanitize_decode.py) on B through device_check.sh. Writes $OUT/ab.txt (a line per
# run: workload:shape:pattern:impl=us of each row) and $OUT/abr.tgz (logs and each run's JSON). Both sides run this
# tree's bench script. AB_BENCH=prefill (or another bench/NAME.py) compares with that bench instead (give its
# args, e.g. --quick --workload P-chunk --patterns random --no-peers).
set -u
A=${1:?usage: scripts/ab_bench.sh A_DIR [REPS] [bench args]}; shift
REPS=3; if [[ ${1:-} =~ ^[0-9]+$ ]]; then REPS=$1; shift; fi  # REPS only when given: else the bench args start here
BENCH=${AB_BENCH:-decode}
ARGS=("$@"); [ ${#ARGS[@]} -eq 0 ] && [ "$BENCH" = decode ] && ARGS=(--quick --floor --only D-B1,D-B32,D-mixed --iters 100)
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; W=$(mktemp -d); mkdir -p "$R"
build() { (cd "$1" && cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES="${MSA_CUDA_ARCH:-90a-real}" > /dev/null &&
           cmake --build build -j"$(nproc)" > /dev/null) || { echo "build of $1 failed"; exit 1; }; }
IFS=, read -r -a DIRS <<< "$A"
for d in "${DIRS[@]}"; do build "$d" & done; build .; wait
if [ "${AB_TESTS:-0}" = 1 ]; then  # device_check's stages on B's build (its logs: $OUT/results.tgz, summary.txt)
  OUT=$R scripts/device_check.sh "test=tests/python/gpu/test_gpu_token_decode.py tests/python/gpu/test_gpu_graph.py \
tests/python/dropin/test_gpu_dropin.py tests/python/gpu/test_gpu_attention.py -n 8 --timeout 300 -rf" \
    sanitize=tests/python/sanitize_decode.py | grep -E "passed|failed|SUMMARY"
fi
for rep in $(seq "$REPS"); do
  for d in "${DIRS[@]}" .; do
    side=$(basename "$(cd "$d" && pwd)"); [ "$d" = . ] && side=B
    PYTHONPATH=$d/build/python python3 "bench/$BENCH.py" "${ARGS[@]}" --out-dir "$W/$side-r$rep" > "$W/$side-r$rep.log" 2>&1
    echo "$rep $side $(grep -E '^[DPIL]-' "$W/$side-r$rep.log" | awk '{printf "%s:%s:%s:%s=%s ", $1, $2, $3, $4, $5}') $(grep ceilings "$W/$side-r$rep.log")"
  done
done | tee "$R/ab.txt"
cp "$R/ab.txt" "$W/ab.txt"
tar -C "$W" -czf "$R/abr.tgz" .
python3 scripts/ab_table.py "$W" "scripts/ab_bench.sh $A $REPS ${ARGS[*]}" --json "$R/ab.json" > "$R/ab.md"
