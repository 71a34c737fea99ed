"""msa.sparse_attention_layer on the CPU: equal to block_scores -> select_topk -> attention done separately,
and within tolerance of the float64 references chained the same way."""
import numpy as np
import pytest

import msa
import msa_testing as mt


def _layer_problem(rng, qo_lens, kv_lens, hkv=2, group=4, page=64):
    prob = mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=hkv * group, num_kv_heads=hkv,
                           head_dim=64, page_size=page, topk=4, pattern=None, dtype="fp32")
    q_index = rng.standard_normal((prob.q.shape[0], hkv, 64)).astype(np.float32)
    k_index = rng.standard_normal((prob.k_cache.shape[0], 1, page, 64)).astype(np.float32)
    return prob, q_index, k_index


@pytest.mark.parametrize("layout", ["THK", "HKT"])
@pytest.mark.parametrize("decode", [False, True])
def test_layer_equals_three_steps(rng, layout, decode):
    qo_lens, kv_lens = ([1, 2, 1], [700, 1000, 129]) if decode else ([200, 37], [900, 37])
    prob, q_index, k_index = _layer_problem(rng, qo_lens, kv_lens)
    topk = 4
    kw = dict(num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=64, page_size=64, topk=topk)
    plan = (msa.plan_decode(len(kv_lens), max(qo_lens), 1024, **kw) if decode
            else msa.plan_prefill(qo_lens, kv_lens, **kw))
    o, lse, bi = msa.sparse_attention_layer(plan, prob.q, prob.k_cache, prob.v_cache, q_index, k_index,
                                            prob.page_table, prob.qo_indptr, prob.kv_lens, force_end=1,
                                            score_layout=layout, return_lse=True, return_block_idx=True)
    scores = msa.block_scores(q_index, k_index, prob.page_table, prob.qo_indptr, prob.kv_lens,
                              max_blocks=8, layout=layout)
    bi2 = msa.select_topk(scores, prob.qo_indptr, prob.kv_lens, topk, layout=layout, force_end=1)
    o2, lse2 = msa.attention(plan, prob.q, prob.k_cache, prob.v_cache, prob.page_table, prob.qo_indptr,
                             prob.kv_lens, block_idx=bi2, return_lse=True)
    np.testing.assert_array_equal(bi, bi2)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse, lse2)

    # float64 chain: reference scores -> reference selection -> reference attention
    ref_scores = mt.ref_block_scores(q_index, k_index, prob.page_table, None, prob.qo_indptr, prob.kv_lens,
                                     max_blocks=8, page_size=64)
    ref_bi = mt.ref_select_topk(ref_scores, prob.qo_indptr, prob.kv_lens, topk, force_end=1)
    np.testing.assert_array_equal(bi, ref_bi)
    prob.block_idx, prob.topk = ref_bi, topk
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o, o_ref, rel=1e-4, atol=1e-4)
    mt.assert_lse_close(lse, lse_ref, atol=1e-4)


def test_layer_rejects_dense_plan_and_wrong_index_heads(rng):
    prob, q_index, k_index = _layer_problem(rng, [3], [300])
    kw = dict(num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=64, page_size=64)
    dense = msa.plan_prefill([3], [300], **kw)
    with pytest.raises(ValueError, match="'plan'"):
        msa.sparse_attention_layer(dense, prob.q, prob.k_cache, prob.v_cache, q_index, k_index, prob.page_table,
                                   prob.qo_indptr, prob.kv_lens)
    sparse = msa.plan_prefill([3], [300], topk=4, **kw)
    with pytest.raises(ValueError, match="'q_index'"):
        msa.sparse_attention_layer(sparse, prob.q, prob.k_cache, prob.v_cache, q_index[:, :1], k_index,
                                   prob.page_table, prob.qo_indptr, prob.kv_lens)


@pytest.mark.parametrize("validate", [False, True])
def test_layer_takes_validate(rng, validate):
    """validate= reaches the three steps (CPU tensors are checked either way): the same output, and a block
    index past the cache still raises."""
    prob, q_index, k_index = _layer_problem(rng, [2, 1], [500, 130])
    kw = dict(num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=64, page_size=64, topk=4)
    plan = msa.plan_prefill([2, 1], [500, 130], **kw)
    args = (plan, prob.q, prob.k_cache, prob.v_cache, q_index, k_index, prob.page_table, prob.qo_indptr, prob.kv_lens)
    o = msa.sparse_attention_layer(*args, validate=validate)
    np.testing.assert_array_equal(o, msa.sparse_attention_layer(*args))
    bad = np.array(prob.page_table, copy=True)
    bad[0, 0] = 10**6
    with pytest.raises(ValueError, match="'page_table'"):
        msa.sparse_attention_layer(*args[:6], bad, *args[7:], validate=validate)
