"""`msa demo` on the CPU backend: the rate of each phase is its effective work (spec/benchmarks.md "Metrics")
over its time, the layer's indexer and attention both counted for pattern indexer. Runs the CLI of the build
(MSA_CLI, which ctest sets, or the `msa` binary beside the build's python/ folder); skipped without one."""
import os
import re
import subprocess
from pathlib import Path

import pytest

import msa

HQ, HKV, D, TOPK, BLOCK, DI = 64, 4, 128, 16, 128, 128  # the demo's MiniMax-M3 shape (tools/demo_options.h)
UNITS = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
TIMES = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def _cli():
    path = os.environ.get("MSA_CLI") or str(Path(msa.__file__).resolve().parents[2] / "msa")
    if not os.path.isfile(path):
        pytest.skip(f"no msa CLI at {path} (set MSA_CLI)")
    return path


def _prefill_flops(chunk, prefix):
    """Every token's row holds its own block and 15 full earlier ones (chunk tokens at positions >= 16 * 128)."""
    pairs = sum(15 * BLOCK + p % BLOCK + 1 for p in range(prefix, prefix + chunk))
    attention = 4 * D * (HQ // HKV) * HKV * pairs
    indexer = 2 * DI * HKV * sum(p + 1 for p in range(prefix, prefix + chunk))
    return attention, indexer


def _decode_bytes(batch, kv_len, kv_elem_bytes=2):
    """kv_len = 16 * 128 keys: every block selected, each read once per request and KV head."""
    attention = batch * (kv_len * HKV * 2 * D * kv_elem_bytes + HQ * 2 * D * 2)
    indexer = batch * (kv_len + HKV) * DI * 2
    return attention, indexer


@pytest.mark.parametrize("pattern,kv_dtype", [("indexer", "bf16"), ("random", "bf16"), ("random", "fp8")])
def test_demo_rate_is_the_effective_work_over_the_time(pattern, kv_dtype):
    """fp8 K/V (e4m3 with per-tensor scales, checked against float64 over the dequantized cache) count one byte
    per element."""
    chunk, prefix, batch, kv_len = 128, 2048, 2, 2048
    run = subprocess.run([_cli(), "demo", "--backend", "cpu", "--pattern", pattern, "--kv-dtype", kv_dtype,
                          "--chunk", str(chunk), "--prefix", str(prefix), "--decode-batch", str(batch),
                          "--decode-len", str(kv_len), "--check-rows", "16"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    expected = {"prefill": _prefill_flops(chunk, prefix),
                "decode": _decode_bytes(batch, kv_len, 1 if kv_dtype == "fp8" else 2)}
    for phase, (attention, indexer) in expected.items():
        work = attention + (indexer if pattern == "indexer" else 0)
        row = re.search(rf"^{phase}\s+cpu\s+.+?\s\s+([\d.]+) (s|ms|us)\s+([\d.]+) ([kMGT])(FLOP|B)/s", run.stdout,
                        re.M)
        assert row, run.stdout
        seconds = float(row[1]) * TIMES[row[2]]
        rate = float(row[3]) * UNITS[row[4]]
        assert rate == pytest.approx(work / seconds, rel=0.03), f"{phase}: {row[0]}; effective work {work:.4g}"
        if pattern == "indexer":  # the progress line reports both parts
            parts = re.search(rf"{phase}: effective work .*: ([\d.]+) ([kMGT])\w+ indexer \+ ([\d.]+) ([kMGT])\w+ "
                              r"attention", run.stderr)
            assert parts, run.stderr
            assert float(parts[1]) * UNITS[parts[2]] == pytest.approx(indexer, rel=0.01)
            assert float(parts[3]) * UNITS[parts[4]] == pytest.approx(attention, rel=0.01)
