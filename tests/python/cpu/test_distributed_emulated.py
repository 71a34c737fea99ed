"""msa.distributed with N emulated ranks in one process on the CPU: the sharded selection is bitwise the
single-device one (msa.sparse_attention_layer's) and the LSE-merged output is within bf16 tolerance of it, for
1, 2, 4 and 8 ranks, round-robin, contiguous uneven and arbitrary shards, ragged batches, prefixes, decode
(one and several tokens per request) and prefill. Needs torch (skips without it, as in CI)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa.distributed as dist  # noqa: E402
import msa_testing as mt  # noqa: E402
from distributed_testing import check, make_batch, reference, shards, single_device  # noqa: E402

WORLDS = [1, 2, 4, 8]
LAYOUTS = ["round_robin", "contiguous", "owner"]


DECODE = dict(qo_lens=[1, 1, 3, 1, 2], kv_lens=[700, 1500, 129, 2000, 64])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode(rng, world, layout):
    batch = make_batch(torch, rng, DECODE["qo_lens"], DECODE["kv_lens"])
    check(torch, batch, "decode", layout, world, 4, rng, max_kv=2048)


PREFILL = dict(qo_lens=[200, 37, 300, 1], kv_lens=[900, 37, 1400, 513])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefill(rng, world, layout):
    batch = make_batch(torch, rng, PREFILL["qo_lens"], PREFILL["kv_lens"])
    check(torch, batch, "prefill", layout, world, 4, rng, max_kv=1408)


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_forced_blocks_offsets_page128_fp8_index(rng, phase):
    """force_begin and force_end, explicit qo_offset (tokens before the end of the keys), pages of 128 and
    fp8 index keys with per-token scales."""
    if phase == "decode":
        qo, kv, off = [2, 1, 1], [1000, 300, 1700], [700, 299, 1200]
    else:
        qo, kv, off = [150, 60], [1100, 600], [500, 300]
    batch = make_batch(torch, rng, qo, kv, qo_offset=off, page_size=128, index_fp8=True)
    for world, layout in [(3, "round_robin"), (4, "contiguous"), (8, "owner")]:
        check(torch, batch, phase, layout, world, 5, rng, max_kv=1792, force_begin=1, force_end=2)


def test_prefill_merge_is_select_topk_over_the_scattered_candidates(rng):
    """msa.merge_candidates selects what one select_topk call does over the candidates scattered into NaN rows."""
    batch = make_batch(torch, rng, PREFILL["qo_lens"], PREFILL["kv_lens"])
    sh = shards(torch, "round_robin", 4, batch, 11, rng)
    steps = [dist.PrefillStep(s, dist.shard_page_table(batch["page_table"], s, 64), batch["qo_lens"],
                              batch["kv_lens_host"]) for s in sh]
    c = [dist.local_candidates(st, batch["q_index"], batch["k_index"], 4) for st in steps]
    s_all, i_all = torch.stack([x[0] for x in c]), torch.stack([x[1] for x in c])
    st = steps[0]
    T, H = s_all.shape[1], s_all.shape[2]
    rows = torch.full((T, H, 12), float("nan"))
    ids = i_all.permute(1, 2, 0, 3).reshape(T, H, -1).long()
    rows.scatter_(2, torch.where(ids >= 0, ids, 11), s_all.permute(1, 2, 0, 3).reshape(T, H, -1))
    want = msa.select_topk(rows[:, :, :11], st.qo_indptr, st.kv_lens, 4, layout="THK")
    got = dist.merge_candidates(s_all, i_all, st.qo_indptr, st.kv_lens, 4, 11)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_rank_without_selected_blocks_returns_empty_state(rng):
    """A rank that owns none of a token's selected blocks returns o = 0 and lse = -inf for it."""
    batch = make_batch(torch, rng, [1, 1], [300, 1000])
    bounds = np.array([[0, 3, 8], [0, 0, 8]])  # rank 0 owns request 0 only
    sh = dist.Shard.contiguous(0, bounds, 8)
    st = dist.DecodeStep(sh, dist.shard_page_table(batch["page_table"], sh, 64), batch["qo_indptr"],
                         batch["kv_lens"], 2)
    plan = st.plan(num_qo_heads=batch["hq"], num_kv_heads=batch["hkv"], head_dim=64, page_size=64, topk=4)
    block_idx = torch.tensor([[[0, 2, -1, -1]] * 2, [[1, 7, -1, -1]] * 2], dtype=torch.int32)
    o, lse = dist.local_attention(st, plan, batch["q"], batch["k_cache"], batch["v_cache"], block_idx)
    assert torch.isfinite(lse[0]).all()
    assert torch.isneginf(lse[1]).all() and (o[1] == 0).all()


def test_non_causal_prefill(rng):
    batch = make_batch(torch, rng, [100, 40], [100, 300])
    pk = dict(num_qo_heads=batch["hq"], num_kv_heads=2, head_dim=64, page_size=64, topk=2)
    plan = msa.plan_prefill([100, 40], [100, 300], causal=False, **pk)
    o_ref, bi_ref = single_device(batch, plan, 2)
    sh = shards(torch, "round_robin", 2, batch, 3, rng)
    steps = [dist.PrefillStep(s, dist.shard_page_table(batch["page_table"], s, 64), [100, 40], [100, 300],
                              causal=False) for s in sh]
    o, bi = dist.emulate_layer(steps, [st.plans(**pk) for st in steps], batch["q"], [batch["k_cache"]] * 2,
                               [batch["v_cache"]] * 2, batch["q_index"], [batch["k_index"]] * 2, 2)
    np.testing.assert_array_equal(bi.numpy(), bi_ref.numpy())
    mt.assert_close(o.float().numpy(), o_ref.float().numpy())


def test_gloo_group_matches_emulation(tmp_path):
    """Two processes over a gloo group run sharded_layer (the collectives path) and agree with one device."""
    import torch.multiprocessing as tmp
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    tmp.spawn(_gloo_worker, args=(2, str(tmp_path / "rdzv")), nprocs=2, join=True)


def _gloo_worker(rank, world, path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        rng = np.random.default_rng(7)
        batch = make_batch(torch, rng, [1, 2, 1], [700, 1500, 129])
        topk, max_kv = 4, 1536
        o_ref, bi_ref = reference(batch, "decode", topk, max_kv)
        sh = dist.Shard.round_robin(rank, world, 3, 12)
        st = dist.DecodeStep(sh, dist.shard_page_table(batch["page_table"], sh, 64), batch["qo_indptr"],
                             batch["kv_lens"], batch["q"].shape[0])
        plan = st.plan(num_qo_heads=batch["hq"], num_kv_heads=batch["hkv"], head_dim=64, page_size=64, topk=topk)
        o, bi = dist.sharded_layer(None, st, plan, batch["q"], batch["k_cache"], batch["v_cache"], batch["q_index"],
                                   batch["k_index"], topk, return_block_idx=True)
        np.testing.assert_array_equal(bi.numpy(), bi_ref.numpy())
        mt.assert_close(o.float().numpy(), o_ref.float().numpy())
    finally:
        torch.distributed.destroy_process_group()
