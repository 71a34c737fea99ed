"""bench/sharded.py and bench/flashinfer_api.py without a GPU (numpy only): the bytes of the sharded indexer's
scan and exchange (the figures of docs/sharding.md's table), and the flashinfer_api rows' byte counts and
per-token valid pages."""
import sys
from pathlib import Path

import numpy as np

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
sys.path.insert(0, str(REPO / "bench"))
import flashinfer_api  # noqa: E402
import sharded  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def test_round_robin_owned_blocks():
    assert sharded.owned_blocks(10, 4, 0) == [0, 4, 8]
    assert sharded.owned_blocks(10, 4, 3) == [3, 7]
    assert sorted(sum((sharded.owned_blocks(10, 4, r) for r in range(4)), [])) == list(range(10))
    assert sharded.owned_blocks(5) == list(range(5))


def test_index_k_bytes_per_rank_match_the_sharding_table():
    b64 = dict(batch=64, kv_len=65536)
    assert sharded.index_k_bytes(**b64) == 1 * GiB
    assert sharded.index_k_bytes(**b64, elem_bytes=1, scale_bytes=4) == 64 * 65536 * 132  # 0.52 GiB
    for world, bf16, fp8 in ((2, 512, 264), (4, 256, 132), (8, 128, 66)):
        assert sharded.index_k_bytes(**b64, world=world) == bf16 * MiB
        assert sharded.index_k_bytes(**b64, world=world, elem_bytes=1, scale_bytes=4) == fp8 * MiB
    m1 = dict(batch=8, kv_len=1 << 20)
    assert sharded.index_k_bytes(**m1) == 2 * GiB
    for world, bf16, fp8 in ((2, 1024, 528), (4, 512, 264), (8, 256, 132)):
        assert sharded.index_k_bytes(**m1, world=world) == bf16 * MiB
        assert sharded.index_k_bytes(**m1, world=world, elem_bytes=1, scale_bytes=4) == fp8 * MiB


def test_index_k_bytes_partial_last_block_and_uneven_ranks():
    # 300 keys: blocks of 128, 128, 44; two ranks: rank 0 holds blocks 0 and 2, rank 1 block 1
    assert sharded.index_k_bytes(1, 300, world=2, rank=0, elem_bytes=1) == (128 + 44) * 128
    assert sharded.index_k_bytes(1, 300, world=2, rank=1, elem_bytes=1) == 128 * 128
    total = sum(sharded.index_k_bytes(3, 300, world=4, rank=r) for r in range(4))
    assert total == sharded.index_k_bytes(3, 300)


def test_exchange_bytes_match_the_sharding_table():
    assert sharded.candidate_bytes(64) == 32 * KiB
    assert sharded.candidate_bytes(8) == 4 * KiB
    for world, received in ((2, 32), (4, 96), (8, 224)):
        ex = sharded.exchange_bytes(world, 64)
        assert ex == {"sent": 32 * KiB, "received": received * KiB}
    assert sharded.exchange_bytes(1, 64)["received"] == 0
    # context parallelism: the partial o (bf16) and lse (fp32) of Hq 64 heads of 128 besides the candidates
    assert sharded.partial_bytes(64) == 1040 * KiB
    assert sharded.partial_bytes(8) == 130 * KiB
    cp = sharded.exchange_bytes(4, 64, num_qo_heads=64)
    assert cp["sent"] == 32 * KiB + 1040 * KiB
    assert cp["received"] == 3 * cp["sent"]
    # an 8192-token prefill chunk: 4 MiB of candidates and 128 MiB (+ 2 MiB lse) of partials per rank
    assert sharded.candidate_bytes(8192) == 4 * MiB
    assert sharded.partial_bytes(8192) == 128 * MiB + 2 * MiB


def test_flashinfer_api_positions_and_valid_pages():
    pos = flashinfer_api.token_positions([1, 3], [65536, 300])
    assert pos.tolist() == [65535, 297, 298, 299]
    assert flashinfer_api.valid_pages([1, 3], [65536, 300]).tolist() == [512, 3, 3, 3]
    chunk = flashinfer_api.valid_pages([4096], [32768])
    assert chunk.dtype == np.int32 and chunk[0] == 28672 // 128 + 1 and chunk[-1] == 256


def test_flashinfer_api_selected_kv_bytes():
    # two requests: 300 keys (blocks of 128, 128, 44) with 2 tokens, 128 keys with 1 token; 2 KV heads
    bi = np.full((3, 2, 4), -1, np.int32)
    bi[0, 0] = [0, 2, -1, -1]
    bi[1, 0] = [2, 1, 0, -1]     # request 0, head 0: {0, 1, 2} = 128 + 128 + 44 keys
    bi[0, 1] = [1, -1, -1, -1]
    bi[1, 1] = [1, 7, -1, -1]    # head 1: {1} (block 7 lies past the request) = 128 keys
    bi[2, 0] = [0, 0, -1, -1]    # request 1: {0} = 128 keys
    bi[2, 1] = [-1, -1, -1, -1]
    keys = 300 + 128 + 128
    assert flashinfer_api.selected_kv_bytes(bi, [2, 1], [300, 128]) == keys * 128 * 1 * 2
    assert flashinfer_api.selected_kv_bytes(bi, [2, 1], [300, 128], elem_bytes=2) == keys * 128 * 2 * 2
    # D-B64 with 16 distinct full blocks per (request, KV head), fp8: 128 MiB of K and V
    full = np.tile(np.arange(16, dtype=np.int32), (64, 4, 1))
    assert flashinfer_api.selected_kv_bytes(full, [1] * 64, [65536] * 64) == 128 * MiB
    assert flashinfer_api.qo_bytes(64) == 2 * 64 * 64 * 128 * 2
    assert flashinfer_api.index_key_bytes([65536] * 64) == 512 * MiB
