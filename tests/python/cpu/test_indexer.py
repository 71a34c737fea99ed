"""The indexer's two steps on the CPU backend: block_scores and select_topk against the msa_testing
references (both layouts, ties, NaN, forced blocks), and the chain scores -> top-k -> sparse attention."""
import math

import numpy as np
import pytest

import msa
import msa_testing as mt

ml_dtypes = pytest.importorskip("ml_dtypes")


def index_problem(rng, qo_lens, kv_lens, *, heads=4, k_heads=1, head_dim=64, page_size=64, **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=heads, num_kv_heads=k_heads,
                           head_dim=head_dim, page_size=page_size, pattern=None, **kw)


def ref_scores(prob, max_blocks=None, causal=True, k_scale=None, k_values=None):
    return mt.ref_block_scores(prob.q, prob.k_cache if k_values is None else k_values, prob.page_table,
                               prob.page_indptr, prob.qo_indptr, prob.kv_lens, qo_offset=prob.qo_offset,
                               causal=causal, max_blocks=max_blocks, k_scale=k_scale)


def assert_scores_equal(s_thk, ref):
    s = np.asarray(s_thk, np.float64)
    assert not np.isnan(s).any()
    assert (np.isneginf(s) == np.isneginf(ref)).all(), "-inf pattern (blocks without visible keys) differs"
    fin = ~np.isneginf(ref)
    np.testing.assert_allclose(s[fin], ref[fin], rtol=1e-4, atol=1e-3)


def to_thk(scores, layout):
    return scores if layout == "THK" else np.transpose(scores, (2, 0, 1))


@pytest.mark.parametrize("layout", ["HKT", "THK"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_block_scores(rng, layout, dtype):
    prob = index_problem(rng, [7, 40], [300, 700], dtype=dtype)
    a = mt.to_numpy(prob)
    s = msa.block_scores(a["q"], a["k_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"], layout=layout)
    T, H = prob.q.shape[:2]
    nb = math.ceil(700 / 128)
    assert s.dtype == np.float32 and s.shape == ((H, nb, T) if layout == "HKT" else (T, H, nb))
    assert_scores_equal(to_thk(s, layout), ref_scores(prob))


@pytest.mark.parametrize("case", ["gqa_index_heads", "flat_table_offset", "non_causal", "slot_major"])
def test_block_scores_variants(rng, case):
    kw = dict(heads=4, k_heads=1)
    causal = True
    if case == "gqa_index_heads":
        kw = dict(heads=8, k_heads=2, head_dim=128, page_size=16)
    elif case == "flat_table_offset":
        kw.update(flat_pages=True, qo_offset=[100, 0])
    elif case == "non_causal":
        kw.update(causal=False)
        causal = False
    elif case == "slot_major":
        kw.update(slot_major=True, page_size=32)
    prob = index_problem(rng, [9, 30], [290, 140], **kw)
    a = mt.to_numpy(prob)
    s = msa.block_scores(a["q"], a["k_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"],
                         qo_offset=a["qo_offset"], page_indptr=a["page_indptr"], causal=causal, layout="THK")
    assert_scores_equal(s, ref_scores(prob, causal=causal))


def test_block_scores_max_blocks_and_out(rng):
    prob = index_problem(rng, [5, 12], [200, 130])
    a = mt.to_numpy(prob)
    wide = msa.block_scores(a["q"], a["k_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"], max_blocks=5)
    assert wide.shape[1] == 5
    assert_scores_equal(to_thk(wide, "HKT"), ref_scores(prob, max_blocks=5))
    assert np.isneginf(wide[:, 2:]).all()
    # a caller's out with a padded token stride
    buf = np.zeros((17, 4, 8), np.float32)
    out = buf[:, :, :3]
    s = msa.block_scores(a["q"], a["k_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"], layout="THK",
                         out=out)
    assert s is out
    assert_scores_equal(out, ref_scores(prob, max_blocks=3))
    with pytest.raises(ValueError, match="'max_blocks'"):
        msa.block_scores(a["q"], a["k_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"], layout="THK",
                         out=out, max_blocks=4)
    assert (buf[:, :, 3:] == 0).all()


def test_block_scores_fp8_keys_with_scales(rng):
    prob = index_problem(rng, [6, 20], [260, 180], dtype="fp32")
    k8 = prob.k_cache.astype(ml_dtypes.float8_e4m3fn)
    scale = rng.uniform(0.5, 2.0, prob.k_cache.shape[:3]).astype(np.float32)
    q = prob.q.astype(ml_dtypes.bfloat16)
    s = msa.block_scores(q, k8, prob.page_table, prob.qo_indptr, prob.kv_lens, k_scale=scale, layout="THK")
    ref = mt.ref_block_scores(q.astype(np.float32), k8.astype(np.float32), prob.page_table, None, prob.qo_indptr,
                              prob.kv_lens, k_scale=scale)
    assert_scores_equal(s, ref)


def select_inputs(rng, qo_lens, kv_lens, heads, *, ties=False, nan_frac=0.0, neg_inf_frac=0.0, qo_offset=None):
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    T, NB = int(qo_indptr[-1]), math.ceil(max(kv_lens) / 128)
    s = rng.integers(0, 4, (T, heads, NB)).astype(np.float32) if ties else \
        rng.standard_normal((T, heads, NB)).astype(np.float32)
    s[rng.random(s.shape) < nan_frac] = np.nan
    s[rng.random(s.shape) < neg_inf_frac] = -np.inf
    off = None if qo_offset is None else np.asarray(qo_offset, np.int32)
    return s, qo_indptr, np.asarray(kv_lens, np.int32), off


@pytest.mark.parametrize("layout", ["HKT", "THK"])
@pytest.mark.parametrize("force", [(0, 1), (1, 1), (2, 0), (0, 0), (0, 3)])
def test_select_topk(rng, layout, force):
    s, qo_indptr, kv_lens, _ = select_inputs(rng, [40, 3, 200], [2000, 300, 1000], 2, ties=True, nan_frac=0.1,
                                             neg_inf_frac=0.05)
    topk = 4
    scores = s if layout == "THK" else np.ascontiguousarray(s.transpose(1, 2, 0))
    got = msa.select_topk(scores, qo_indptr, kv_lens, topk, layout=layout, force_begin=force[0],
                          force_end=force[1])
    assert got.dtype == np.int32 and got.shape == (s.shape[0], 2, topk)
    ref = mt.ref_select_topk(s, qo_indptr, kv_lens, topk, force_begin=force[0], force_end=force[1])
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("causal", [True, False])
def test_select_topk_offsets_short_rows_and_strided_out(rng, causal):
    # request 0 sees blocks 0..2 only (fewer than topk: -1 tail); request 1 starts at position 700
    s, qo_indptr, kv_lens, off = select_inputs(rng, [5, 9], [300, 1500], 3, qo_offset=[250, 700])
    topk = 6
    store = np.full((3, s.shape[0], topk), 99, np.int32)  # [H, T, topk] storage written through a view
    out = store.transpose(1, 0, 2)
    got = msa.select_topk(s, qo_indptr, kv_lens, topk, qo_offset=off, layout="THK", causal=causal, out=out)
    assert got is out
    ref = mt.ref_select_topk(s, qo_indptr, kv_lens, topk, qo_offset=off, causal=causal)
    np.testing.assert_array_equal(out, ref)
    assert (ref == -1).any()


def test_scores_to_topk_to_sparse_attention(rng):
    """The M3 indexer chain: block_scores -> select_topk -> sparse attention, each step against its reference."""
    prob = mt.make_problem(rng, qo_lens=[30, 8], kv_lens=[700, 260], num_qo_heads=4, num_kv_heads=1, head_dim=64,
                           page_size=64, pattern=None)
    a = mt.to_numpy(prob)
    scores = msa.block_scores(a["q"], a["k_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"], layout="THK")
    # one index head per KV head: scores [T, 4, NB] -> select on head 0's scores for the single KV head
    bi = msa.select_topk(np.ascontiguousarray(scores[:, :1]), a["qo_indptr"], a["kv_lens"], 3, layout="THK")
    np.testing.assert_array_equal(bi, mt.ref_select_topk(scores[:, :1].astype(np.float64), prob.qo_indptr,
                                                         prob.kv_lens, 3))
    prob.block_idx, prob.topk = bi, 3
    plan = msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=4, num_kv_heads=1, head_dim=64, page_size=64,
                            topk=3)
    o = msa.attention(plan, a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"],
                      block_idx=bi)
    mt.assert_close(o.astype(np.float64), mt.ref_attention(prob)[0])
