"""pytest setup of the Python suite: the shared helpers importable from every folder, the `gpu` marker,
GPU tests skipped where they cannot run (no torch, no CUDA device, or an msa build without the CUDA backend).

The suite, by what a test needs:
    cpu/     the CPU backend, the package, the CLI and the tools' scripts (torch tests skip without torch)
    gpu/     the CUDA kernels against the float64 references
    fuzz/    seeded random-configuration sweeps of msa's entry points (GPU; a few seeds on the CPU too)
    dropin/  msa.sglang, msa.fmha_sm100 and msa.torch_ops against their engines' call sequences (and their fuzz)
and here the helpers they share: msa_testing (problems, float64 references), fuzz_testing (the sweeps' draws),
sglang_testing (sglang's state and batches), and sanitize_decode.py (a compute-sanitizer script).

Everything runs from the build tree: PYTHONPATH=<build>/python python3 -m pytest tests/python -q
(a script of a subfolder run as such, e.g. under compute-sanitizer, also needs tests/python on PYTHONPATH).
"""
import os
import sys
import zlib

# One BLAS / OpenMP thread per test process, set before numpy loads OpenBLAS. The references multiply
# small matrices (16 heads x 128 x a few thousand keys), where threads only add synchronization, and
# under pytest-xdist every worker would start one spinning BLAS thread per core: 4 processes running
# the float64 attention reference on 2 cores took 34-85 s each with the default threads and 3.7-3.9 s
# with one (1.55 vs 2.15 s alone). That oversubscription is what made `-n 4` GPU runs on the 16-core
# device slower than sequential ones. An explicit setting in the environment wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch, a CUDA device and msa built with its CUDA backend")


def _gpu_skip_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    import msa

    if not msa.cuda_available():
        return "msa was built without the CUDA backend, or no GPU of compute capability >= 8.0"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: every test is reproducible on its own."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
