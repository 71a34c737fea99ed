"""pytest setup of the Python suite: msa_testing importable, the `gpu` marker, GPU tests skipped
where they cannot run (no torch, no CUDA device, or an msa build without the CUDA backend).

The CPU tests run from the build tree: PYTHONPATH=<build>/python python3 -m pytest tests/python -q
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
