"""Decode plans on the CPU backend: built from limits only, reused across steps whose lengths change,
q holding up to batch_size * max_qo_len tokens."""
import numpy as np
import pytest

import msa
import msa_testing as mt

pytest.importorskip("ml_dtypes")


def decode_plan(batch_size, max_qo_len, max_kv_len, *, topk=4, causal=True, head_dim=64, page_size=64):
    return msa.plan_decode(batch_size, max_qo_len, max_kv_len, num_qo_heads=8, num_kv_heads=2, head_dim=head_dim,
                           page_size=page_size, topk=topk, causal=causal)


def run_and_check(plan, prob):
    a = mt.to_numpy(prob)
    o, lse = msa.attention(plan, a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"],
                           a["kv_lens"], block_idx=a["block_idx"], qo_offset=a["qo_offset"],
                           page_indptr=a["page_indptr"], return_lse=True)
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o.astype(np.float64), o_ref)
    mt.assert_lse_close(lse, lse_ref)


def decode_problem(rng, qo_lens, kv_lens, *, topk=4, pattern="random", page_size=64, **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=8, num_kv_heads=2, head_dim=64,
                           page_size=page_size, topk=topk, pattern=pattern, **kw)


def test_plan_properties():
    plan = decode_plan(4, 2, 4096)
    assert plan.phase == "decode" and plan.device == "cpu"
    assert (plan.batch_size, plan.max_qo_len, plan.max_kv_len, plan.total_q) == (4, 2, 4096, 8)
    assert (plan.num_qo_heads, plan.num_kv_heads, plan.head_dim, plan.head_dim_v) == (8, 2, 64, 64)
    assert (plan.page_size, plan.topk, plan.causal) == (64, 4, True)
    assert repr(plan).startswith("msa.Plan(phase='decode'")
    assert plan.describe() == {"backend": "cpu", "phase": "decode"}


@pytest.mark.parametrize("pattern", ["random", None])
def test_one_plan_serves_changing_lengths(rng, pattern):
    plan = decode_plan(3, 1, 2000, topk=4 if pattern else 0)
    for kv_lens in ([130, 1, 700], [131, 2, 701], [1999, 64, 129]):
        run_and_check(plan, decode_problem(rng, [1, 1, 1], kv_lens, topk=4, pattern=pattern))


@pytest.mark.parametrize("qo_lens", [[2, 3, 1], [8, 1, 5]])
def test_multi_token_decode(rng, qo_lens):
    plan = decode_plan(3, 8, 1000)
    run_and_check(plan, decode_problem(rng, qo_lens, [300, 129, 1000]))


def test_fewer_tokens_than_the_bound(rng):
    plan = decode_plan(4, 4, 1000)  # room for 16 tokens, 5 passed
    run_and_check(plan, decode_problem(rng, [2, 1, 1, 1], [200, 300, 5, 999], empty_row_prob=0.2))


def test_decode_with_explicit_offsets_and_flat_table(rng):
    plan = decode_plan(2, 2, 1000)
    run_and_check(plan, decode_problem(rng, [2, 1], [600, 300], qo_offset=[400, 10], flat_pages=True))


def test_non_causal_decode(rng):
    plan = decode_plan(2, 2, 1000, causal=False)
    run_and_check(plan, decode_problem(rng, [2, 1], [600, 300], causal=False))


def test_more_tokens_than_max_qo_len_is_rejected(rng):
    plan = decode_plan(2, 2, 1000)
    prob = decode_problem(rng, [3, 1], [600, 300])
    a = mt.to_numpy(prob)
    with pytest.raises(ValueError, match="max_qo_len"):
        msa.attention(plan, a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"],
                      block_idx=a["block_idx"])


@pytest.mark.parametrize("bad", [dict(max_qo_len=17), dict(max_qo_len=0), dict(batch_size=0), dict(max_kv_len=0)])
def test_bad_limits(bad):
    args = dict(batch_size=2, max_qo_len=1, max_kv_len=100) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        msa.plan_decode(args["batch_size"], args["max_qo_len"], args["max_kv_len"], num_qo_heads=8,
                        num_kv_heads=2)
