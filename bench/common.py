"""Shared helpers of the msa benchmarks: ceilings, timing, result files.

Every benchmark measures its ceilings in the same run as the kernels (absolute figures drift between
machines and runs) and writes its rows as JSON plus a .md table:
  --record   the run of record: the bench's default options only, no MSA_* knob in the environment; writes
             bench/results/<bench>.json and .md (overwriting; git keeps the history), and a copy under $OUT when
             $OUT is set (the device machine hands back only $OUT).
  otherwise  any other run (subsets, sweeps, variants, A/B): <bench>-<date>-<time>-<commit>.json and .md under
             --out-dir, else $OUT, else bench/scratch/ (git-ignored); never under bench/results/.
The commit is taken from $MSA_COMMIT (the device copy of the tree has no .git) or `git rev-parse`.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from cli import add_output_options  # noqa: F401,E402  (re-exported for the benches)

RESULTS = Path(__file__).resolve().parent / "results"  # the runs of record, <bench>.json / .md
SCRATCH = Path(__file__).resolve().parent / "scratch"  # every other run when neither --out-dir nor $OUT is given


def commit() -> str:
    c = os.environ.get("MSA_COMMIT")
    if c:
        return c
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=Path(__file__).parent).strip()
    except Exception:
        return "unknown"


def capture_graph(calls, warmup: int = 3) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of the argument-free callables `calls`, in order, after `warmup` eager rounds on a side
    stream (capture needs the lazy set-up of the first calls done outside it)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return g


def median_back_to_back(run, iters: int, per: int = 1, before=None, skip_first: bool = False) -> float:
    """Median microseconds (divided by `per`) of run(), enqueued `iters` times back to back with an event pair
    around each and one synchronization at the end; before(), if given, is enqueued ahead of each pair.
    skip_first: one more run whose time is left out (it starts on an idle stream)."""
    n = iters + (1 if skip_first else 0)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize()
    for a, b in zip(starts, ends):
        if before is not None:
            before()
        a.record()
        run()
        b.record()
    torch.cuda.synchronize()
    pairs = list(zip(starts, ends))[1 if skip_first else 0:]
    times = sorted(a.elapsed_time(b) * 1000.0 / per for a, b in pairs)
    LAST_TIMES[:] = times
    return times[len(times) // 2]


LAST_TIMES: list = []  # the sorted times behind median_back_to_back's last median (spread diagnostics)


def time_graph(fn, iters: int = 50, warmup: int = 5, rotate=None, back_to_back: bool = False) -> float:
    """Median microseconds per call of fn() replayed from a CUDA graph.

    rotate: optional list of argument-free callables; when given, the graph captures one call per
    entry (inputs rotated so that repeated calls do not measure the L2) and the time is per call.
    back_to_back: enqueue the timed replays one after another (an event pair around each, one
    synchronization at the end), so that each replay starts when the GPU finishes the previous one, as
    on an engine's stream that never idles; otherwise each replay starts on an idle stream and its time
    includes the host's launch of the graph (~5-7 us on the H200, shared by the graph's calls).
    """
    calls = rotate if rotate is not None else [fn]
    g = capture_graph(calls, warmup)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    if back_to_back:
        return median_back_to_back(g.replay, iters, per=len(calls), skip_first=True)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / len(calls))
    times.sort()
    return times[len(times) // 2]


def host_us(call, reps: int, sleep_every: int = 1) -> tuple[float, float]:
    """Median and max host microseconds of call() while the GPU is busy: a sleep kernel is enqueued before every
    sleep_every-th call (after a synchronization, so that the launch queue stays short), so a call that waited on
    the device would take ~the sleep. The first call is a warm-up; each result is dropped after its time is
    taken (a plan's destruction is not timed)."""
    call()
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        if i % sleep_every == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(100_000_000)
        t0 = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - t0) * 1e6)
        del result
    torch.cuda.synchronize()
    return statistics.median(times), max(times)


def time_eager(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median microseconds per call of fn() launched eagerly (for long kernels: prefill)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def time_flushed(fn, iters: int = 20, warmup: int = 3, graph: bool = True, flush_bytes: int = 256 << 20) -> float:
    """Median microseconds per call of fn(), timed as triton.testing.do_bench does: before each call a
    256 MiB memset evicts the L2 (the spec: "L2 flushed or inputs rotated"), and the calls are enqueued back to
    back with an event pair around each, synchronized once at the end. The memset (~80 us on an H200) covers
    the host's submission of the next call, so a call's time starts when the GPU reaches it, as in a serving
    engine whose stream is never idle; time_graph/time_eager instead synchronize after every call, so each
    timed call starts on an idle stream and includes the host's launch latency (~5-10 us for a prefill graph
    of a dozen nodes). graph: replay fn() from a CUDA graph (else call it eagerly, its host work included
    wherever it exceeds the memset)."""
    run = capture_graph([fn], warmup).replay if graph else fn
    for _ in range(warmup):
        run()
    cache = flush_buffer(flush_bytes)
    if not _LEAD["done"]:
        # The first configuration timed in a process reads ~3% slow whatever it runs (docs/performance.md,
        # measured on prefill variants in one process): its first timing is taken twice, the first discarded.
        _LEAD["done"] = True
        median_back_to_back(run, iters, before=cache.zero_)
    return median_back_to_back(run, iters, before=cache.zero_)


_LEAD = {"done": False}
_FLUSH: dict = {}


def flush_buffer(nbytes: int) -> torch.Tensor:
    """One L2-eviction buffer per size for the whole process (zeroed once at allocation), so that no timed
    call follows a memset of freshly mapped memory."""
    if nbytes not in _FLUSH:
        _FLUSH[nbytes] = torch.zeros(nbytes, dtype=torch.int8, device="cuda")
        torch.cuda.synchronize()
    return _FLUSH[nbytes]


def copy_ceiling_gbps(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy, bytes read + written per second, in GB/s."""
    n = nbytes // 2
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = time_eager(lambda: dst.copy_(src), iters=20, warmup=3)
    return 2 * n / (us * 1e-6) / 1e9


def matmul_ceiling_tflops(n: int = 8192) -> float:
    """bf16 n^3 matmul on random data, TFLOP/s."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = time_eager(lambda: a @ b, iters=10, warmup=3)
    return 2 * n**3 / (us * 1e-6) / 1e12


def ceilings() -> dict:
    c = {"copy_gbps": round(copy_ceiling_gbps(), 1), "matmul_tflops": round(matmul_ceiling_tflops(), 1)}
    print(f"# ceilings: copy {c['copy_gbps']:.0f} GB/s, bf16 matmul {c['matmul_tflops']:.0f} TFLOP/s", flush=True)
    return c


def row(workload, shape, pattern, impl, us, *, tflops=None, gbps=None, ceil=None, max_err=None, **extra):
    """One result row; ratio = figure / its ceiling from the same run."""
    ratio = None
    if ceil is not None:
        if gbps is not None:
            ratio = gbps / ceil["copy_gbps"]
        elif tflops is not None:
            ratio = tflops / ceil["matmul_tflops"]
    r = {"workload": workload, "shape": shape, "pattern": pattern, "impl": impl, "us": round(us, 2),
         "tflops": None if tflops is None else round(tflops, 1), "gbps": None if gbps is None else round(gbps, 1),
         "ratio": None if ratio is None else round(ratio, 4), "max_err": max_err}
    r.update(extra)
    return r


def check_record(ap, args) -> None:
    """A run of record is the full default run: --record with any other option, or with an MSA_* kernel knob
    in the environment, is refused before anything is measured."""
    if not args.record:
        return
    defaults = vars(ap.parse_args(["--record"]))
    changed = sorted(k for k, v in vars(args).items() if v != defaults.get(k))
    if changed:
        ap.error("--record measures the default options only; drop " + ", ".join("--" + k.replace("_", "-")
                                                                                 for k in changed))
    knobs = sorted(k for k in os.environ if k.startswith("MSA_") and k not in ("MSA_COMMIT", "MSA_CUDA_ARCH"))
    if knobs:
        ap.error("--record measures the default kernel choices; unset " + ", ".join(knobs))


def markdown(doc: dict) -> str:
    """The .md table of a result document: a header naming the commit, the ceilings and the options, then the rows."""
    cols = ["workload", "shape", "pattern", "impl", "us", "tflops", "gbps", "ratio", "max_err"]
    rows = doc["rows"]
    cols += [c for c in ("sm_mhz", "power_capped", "clock_reasons") if any(c in r for r in rows)]  # bench/gpu_monitor.py
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |")

    def options(argv) -> str:
        return "not recorded" if argv is None else " ".join(argv) or "(defaults)"

    def run(part: dict) -> str:
        ceil = part["ceilings"]
        return (f"measured at commit {part['commit']} ({part['date']}); ceilings of that run: copy {ceil['copy_gbps']} GB/s, "
                f"bf16 matmul {ceil['matmul_tflops']} TFLOP/s; options: {options(part.get('argv'))}")

    if "parts" in doc:  # a record merged from runs of different workloads; each row's ratio is over its run's ceiling
        head = (f"# {doc['bench']} on {doc['device']}, merged from {len(doc['parts'])} runs\n\n"
                + "".join(f"- {', '.join(part['workloads'])}: {run(part)}\n" for part in doc["parts"]))
    else:
        head = f"# {doc['bench']} on {doc['device']}\n\nRun {run(doc)}\n"
    note = f"\n{doc['note']}\n" if doc.get("note") else ""
    return head + note + "\n" + "\n".join(lines) + "\n"


def write_results(bench: str, ceil: dict, rows: list, out_dir: str | None = None, *, record: bool = False,
                  note: str | None = None) -> Path:
    """Writes the run's JSON and .md (where: the module docstring) and prints the table; note, when given, is
    kept in the JSON and printed under the .md header."""
    now = datetime.datetime.now()
    doc = {"bench": bench, "commit": commit(), "device": torch.cuda.get_device_name(),
           "date": now.isoformat(timespec="seconds"), "argv": sys.argv[1:], "ceilings": ceil, "rows": rows}
    if note:
        doc["note"] = note
    md = markdown(doc)
    if record:
        targets = [(RESULTS, bench)] + ([(Path(os.environ["OUT"]), bench)] if os.environ.get("OUT") else [])
    else:
        targets = [(Path(out_dir or os.environ.get("OUT") or SCRATCH), f"{bench}-{now:%Y%m%d-%H%M%S}-{commit()}")]
    for folder, name in targets:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        (folder / f"{name}.md").write_text(md)
    print(md, flush=True)
    print(f"# written: {', '.join(str(folder / name) + '.json' for folder, name in targets)}", flush=True)
    return targets[0][0] / f"{targets[0][1]}.json"


@functools.lru_cache(maxsize=None)
def msa_impl_name() -> str:
    """The rows' impl name for this build on this GPU: `msa` where prefill plans take the Hopper kernels,
    `msa-portable` where they take the portable family (a build without sm_90a code, e.g. MSA_CUDA_ARCH=80-virtual:
    what an A100, L40S or RTX part runs, measured on the H200 through PTX). Its runs of record are
    <bench>-portable."""
    import msa

    plan = msa.plan_prefill([256], [256], num_qo_heads=64, num_kv_heads=4, head_dim=128, page_size=128, topk=16,
                            device="cuda")
    return "msa" if "sm90" in plan.describe() else "msa-portable"


def main_guard():
    if not torch.cuda.is_available():
        print("no CUDA device: benchmarks need a GPU", file=sys.stderr)
        sys.exit(2)


@contextlib.contextmanager
def environment(settings: dict):
    """Environment variables set for the duration (plans read msa's kernel knobs at plan time)."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_variants(spec: str | None) -> list:
    """'NAME:VAR=V,VAR=V;...' -> [(suffix, env)]; the default knobs are variant ''."""
    if not spec:
        return [("", {})]
    out = []
    for item in spec.split(";"):
        name, _, settings = item.partition(":")
        env = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
        out.append((f"[{name}]", env))
    return out
