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
