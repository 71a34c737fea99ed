"""bench/layer.py without a GPU: the roofline byte count of a layer step (index keys, distinct selected K/V
blocks per (request, KV head), q / q_index / o) and the selection recall of the fp8 layer's accuracy line."""
import sys
from pathlib import Path

import numpy as np

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
sys.path.insert(0, str(REPO / "bench"))
import layer  # noqa: E402


def test_m3_tp1_b64_bf16_and_fp8():
    """Full selections of 16 distinct blocks: the figures the spec's L-step rows are built on."""
    B, hkv, hq, kv_len = 64, 4, 64, 65536
    bi = np.tile(np.arange(512 - 16, 512, dtype=np.int32), (B, hkv, 1))
    indptr, lens = np.arange(B + 1), np.full(B, kv_len)
    bf16 = layer.roofline_bytes(bi, indptr, lens, num_qo_heads=hq, kv_elem_bytes=2, index_elem_bytes=2)
    assert bf16["index_k"] == B * kv_len * 128 * 2 == 1 << 30
    assert bf16["kv"] == B * hkv * 16 * 128 * 128 * 2 * 2 == 1 << 28
    assert bf16["qo"] == B * (2 * hq * 128 + hkv * 128) * 2
    assert bf16["total"] == bf16["index_k"] + bf16["kv"] + bf16["qo"]
    fp8 = layer.roofline_bytes(bi, indptr, lens, num_qo_heads=hq, kv_elem_bytes=1, index_elem_bytes=1,
                               index_scale_bytes=4)
    assert fp8["index_k"] == B * kv_len * (128 + 4)
    assert fp8["kv"] == bf16["kv"] // 2
    assert fp8["qo"] == bf16["qo"]  # q, q_index and o stay bf16
    # Without the index-K scales, FlashInfer's quoted 180.5 us at 0.871 of a 4284 GB/s copy ceiling.
    no_scales = fp8["total"] - B * kv_len * 4
    assert abs(no_scales / 4284e3 / 180.5 - 0.871) < 5e-4


def test_duplicates_empty_slots_and_partial_blocks_count_once():
    # two requests: 300 keys (3 blocks, the last of 44 keys) with 2 query tokens, and 128 keys with 1 token
    indptr, lens = np.array([0, 2, 3]), np.array([300, 128])
    bi = np.full((3, 2, 4), -1, np.int32)
    bi[0, 0] = [0, 2, -1, -1]
    bi[1, 0] = [2, 1, 0, -1]     # request 0, head 0: blocks {0, 1, 2} = 128 + 128 + 44 keys
    bi[0, 1] = [1, -1, -1, -1]
    bi[1, 1] = [1, 7, -1, -1]    # head 1: {1} (block 7 is past the request's 3 blocks) = 128 keys
    bi[2, 0] = [0, -1, -1, -1]   # request 1: 128 keys per head
    bi[2, 1] = [-1, 0, -1, -1]
    got = layer.roofline_bytes(bi, indptr, lens, num_qo_heads=4, kv_elem_bytes=2, index_elem_bytes=2,
                               head_dim=8, index_dim=16)
    keys = (128 + 128 + 44) + 128 + 128 + 128
    assert got["kv"] == keys * 8 * 2 * 2
    assert got["index_k"] == (300 + 128) * 16 * 2
    assert got["qo"] == 3 * (2 * 4 * 8 + 2 * 16) * 2


def test_selection_recall():
    ref = np.array([[[0, 1, 2, -1]], [[5, 6, -1, -1]]])
    assert layer.selection_recall(ref, ref) == 1.0
    got = np.array([[[2, 1, 9, 8]], [[-1, 6, 7, -1]]])  # keeps 1, 2 of the first row's 3; 6 of the second's 2
    assert layer.selection_recall(ref, got) == 3 / 5
    assert layer.selection_recall(np.full((1, 1, 4), -1), got[:1]) == 1.0


def test_console_row(capsys):
    """The benches' shared console line (bench/cli.py): columns, time, GB/s, ratio, the extras present; or the error."""
    import cli
    cli.print_row({"workload": "L-step-D-B64", "shape": "M3-TP1", "us": 337.02, "gbps": 3988.9, "ratio": 0.9494,
                   "max_err": 0.00046, "recall": None}, [("workload", 14), ("shape", 7)], ("max_err", "recall"))
    cli.print_row({"workload": "x", "shape": "y", "error": "boom"}, [("workload", 2), ("shape", 2)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["L-step-D-B64", "M3-TP1", "337.02", "us", "3989", "GB/s", "ratio", "0.949",
                                "max_err", "0.00046"]
    assert lines[1] == "x   y   error: boom"
