"""msa.merge_states on the CPU backend: attention split over disjoint block sets and merged equals the
unsplit attention; the LSE algebra against a float64 numpy merge, empty parts and empty rows."""
import numpy as np
import pytest

import msa
import msa_testing as mt

pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("parts_dtype", ["fp32", "bf16"])
def test_split_equals_unsplit(rng, parts_dtype):
    prob = mt.make_problem(rng, qo_lens=[20, 7], kv_lens=[900, 300], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                           topk=6, dtype="fp32", neg_slot_prob=0.5)
    a = mt.to_numpy(prob)
    plan = msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, topk=6)
    o_full, lse_full = msa.attention(plan, a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"],
                                     a["kv_lens"], block_idx=a["block_idx"], return_lse=True)
    # three disjoint slot subsets of every row; a part whose slots are all -1 holds lse = -inf
    vs, lses = [], []
    for part in (slice(0, 1), slice(1, 4), slice(4, 6)):
        bi = np.full_like(prob.block_idx, -1)
        bi[..., part] = prob.block_idx[..., part]
        o, lse = msa.attention(plan, a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"],
                               a["kv_lens"], block_idx=bi, return_lse=True)
        vs.append(o)
        lses.append(lse)
    assert np.isneginf(np.stack(lses)).any()
    v_parts = np.stack(vs).astype(mt.numpy_dtype(parts_dtype))
    merged, lse = msa.merge_states(v_parts, np.stack(lses), return_lse=True)
    assert merged.dtype == v_parts.dtype and lse.dtype == np.float32
    tol = dict(rel=1e-5, atol=1e-5) if parts_dtype == "fp32" else {}
    mt.assert_close(merged.astype(np.float64), o_full.astype(np.float64), **tol)
    mt.assert_lse_close(lse, lse_full.astype(np.float64), atol=1e-5)


def test_against_numpy_merge_with_empty_rows(rng):
    S, T, H, D = 3, 10, 4, 32
    v = rng.standard_normal((S, T, H, D)).astype(np.float32)
    lse = (rng.standard_normal((S, T, H)) * 3).astype(np.float32)
    lse[rng.random((S, T, H)) < 0.3] = -np.inf
    lse[:, 2, 1] = -np.inf  # a row no part saw a key of
    v[np.broadcast_to(np.isneginf(lse)[..., None], v.shape)] = np.nan  # an empty part's v is never read
    o_out = np.full((T, H, D), 7, np.float32)
    lse_out = np.full((T, H), 7, np.float32)
    o = msa.merge_states(v, lse, out=o_out, lse_out=lse_out)
    assert o is o_out
    o_ref, lse_ref = mt.ref_merge_states(v, lse)
    mt.assert_close(o_out, o_ref, rel=1e-5, atol=1e-5)
    mt.assert_lse_close(lse_out, lse_ref, atol=1e-5)
    assert (o_out[2, 1] == 0).all() and np.isneginf(lse_out[2, 1])


def test_single_part_is_identity_and_fp16_output(rng):
    v = rng.standard_normal((1, 5, 2, 16)).astype(np.float32)
    lse = rng.standard_normal((1, 5, 2)).astype(np.float32)
    out = np.empty((5, 2, 16), np.float16)
    o, lse_o = msa.merge_states(v, lse, out=out, return_lse=True)
    np.testing.assert_allclose(o.astype(np.float32), v[0], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(lse_o, lse[0], rtol=1e-6)
