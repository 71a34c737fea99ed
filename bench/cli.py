"""The parts of a benchmark's command line that need no torch, so that `--help` and the CPU tests of a bench's
pure functions run without it: the output options, and the loading of torch and bench/common.py (which imports
torch) once the arguments are parsed."""
from __future__ import annotations

import sys
from pathlib import Path


def add_output_options(ap, bench: str = "<bench>") -> None:
    """The options that choose where a run's rows go (bench/common.py's docstring)."""
    ap.add_argument("--record", action="store_true",
                    help=f"the run of record: default options only; writes bench/results/{bench}.json and .md "
                         "(and a copy under $OUT when set)")
    ap.add_argument("--out-dir", default=None,
                    help="folder of a run that is not the record (default $OUT, else bench/scratch)")


def load_torch_and_common(script: str):
    """(torch, bench/common.py) for a bench that runs on the GPU: exits with a clear message without torch, and
    through common.main_guard() without a CUDA device."""
    try:
        import torch
    except ImportError:
        sys.exit(f"{script}: needs torch with CUDA (and msa built with CUDA on PYTHONPATH)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import common
    common.main_guard()
    return torch, common


def print_row(r: dict, columns: list, extras: tuple = ()) -> None:
    """One console line of a result row: the named columns (key, width), then its time, GB/s and ratio, then the
    extra keys it holds; a row with an 'error' prints that instead of figures."""
    fields = [f"{r[key]:{width}s}" for key, width in columns]
    if r.get("error"):
        fields.append(f"error: {r['error']}")
    else:
        fields.append(f"{r['us']:9.2f} us")
        if r.get("gbps") is not None:
            fields.append(f"{r['gbps']:7.0f} GB/s")
        if r.get("ratio") is not None:
            fields.append(f"ratio {r['ratio']:.3f}")
        fields += [f"{k} {r[k]}" for k in extras if r.get(k) is not None]
    print("  ".join(fields), flush=True)
