"""msa.distributed over a real NCCL group: `torchrun --nproc-per-node 2` runs distributed_worker.py, whose ranks
compare the sharded decode / prefill layer and indexer (and the decode layer in a CUDA graph) with their
single-device results. Skips unless two GPUs are visible."""
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def test_torchrun_two_ranks():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two visible GPUs")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    here = os.path.dirname(os.path.abspath(__file__))
    torchrun = shutil.which("torchrun")
    cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
        "--standalone", "--nproc-per-node", "2", os.path.join(here, "distributed_worker.py")]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
