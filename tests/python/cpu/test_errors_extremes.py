"""Bad input at the extremes of the argument types (contract §6): missing tensors, numbers beyond float32 or
int32, sizes that would allocate before any check, zero-sized pages, and the layer's steps named in its own
terms. Each must raise ValueError / TypeError naming the function and the argument: no crash (a page size of 0
divided by zero), no MemoryError from an output allocated before the checks, no default silently taken (an
sm_scale that rounds to 0 in float32 read as "head_dim ** -0.5")."""
import numpy as np
import pytest

import msa
import msa_testing as mt


@pytest.fixture
def prob(rng):
    return mt.make_problem(rng, qo_lens=[5, 9], kv_lens=[300, 140], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                           topk=3, dtype="fp32")


def attention(prob, **over):
    args = dict(q=prob.q, k_cache=prob.k_cache, v_cache=prob.v_cache, page_table=prob.page_table,
                qo_indptr=prob.qo_indptr, kv_lens=prob.kv_lens)
    kw = dict(block_idx=prob.block_idx)
    for k, v in over.items():
        (args if k in args else kw)[k] = v
    plan = msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, topk=3)
    return msa.attention(plan, *args.values(), **kw)


@pytest.mark.parametrize("name", ["q", "k_cache", "v_cache", "page_table", "qo_indptr", "kv_lens"])
def test_missing_tensors_are_named(prob, name):
    with pytest.raises(ValueError, match=rf"^msa.attention: argument '{name}' is required$"):
        attention(prob, **{name: None})


def test_missing_tensors_of_the_other_calls_are_named(prob):
    q, k, pt, qi, kl = prob.q, prob.k_cache[:, :1], prob.page_table, prob.qo_indptr, prob.kv_lens
    calls = {
        "msa.block_scores": [lambda: msa.block_scores(q, None, pt, qi, kl, max_blocks=3),
                             lambda: msa.block_scores(q, k, pt, qi, None, max_blocks=3),
                             lambda: msa.block_scores(q, k, pt, qi, None)],
        "msa.select_topk": [lambda: msa.select_topk(None, qi, kl, 2), lambda: msa.select_topk(
            np.zeros((2, 3, 14), np.float32), None, kl, 2)],
        "msa.merge_states": [lambda: msa.merge_states(None, np.zeros((1, 2, 2), np.float32)),
                             lambda: msa.merge_states(np.zeros((1, 2, 2, 8), np.float32), None)],
        "msa.write_cache": [lambda: msa.write_cache(np.zeros((1, 1, 8), np.float32), None, np.zeros(1, np.int32))],
        "msa.build_page_table": [lambda: msa.build_page_table(np.zeros((2, 8), np.int32), None,
                                                               np.zeros(2, np.int32), 4)],
    }
    for fn, fs in calls.items():
        for f in fs:
            with pytest.raises(ValueError, match=rf"^{fn}: argument '\w+' is required$"):
                f()


@pytest.mark.parametrize("sm_scale,exc,what", [(1e-300, ValueError, "representable in float32"),
                                               (-1e-46, ValueError, "representable in float32"),
                                               (10**400, ValueError, "beyond the float range"),
                                               ("0.125", TypeError, "expected a float, got str"),
                                               (True, TypeError, "expected a float, got bool")])
def test_sm_scale_beyond_float32(prob, sm_scale, exc, what):
    with pytest.raises(exc, match=rf"^msa.attention: argument 'sm_scale': .*{what}"):
        attention(prob, sm_scale=sm_scale)


def test_smallest_float32_sm_scale_is_taken(prob):
    o = attention(prob, sm_scale=2.0**-149)  # nearly uniform weights, not the default scale
    o_ref, _ = mt.ref_attention(mt.Problem(**{**prob.__dict__, "sm_scale": 2.0**-149}))
    mt.assert_close(o, o_ref)


def test_scale_and_stream_ranges(prob):
    with pytest.raises(ValueError, match=r"^msa.attention: argument 'v_scale': .*beyond the float range"):
        attention(prob, v_scale=10**400)
    with pytest.raises(ValueError, match=r"^msa.attention: argument 'stream'"):
        attention(prob, stream=2**64)
    with pytest.raises(TypeError, match=r"^msa.write_cache: argument 'scale': expected a float, got ndarray"):
        msa.write_cache(np.zeros((1, 1, 8), np.float32), np.zeros((1, 1, 4, 8), np.float32),
                        np.zeros(1, np.int32), scale=np.array([2.0]))


def test_indexer_extremes(prob):
    q, pt, qi, kl = prob.q, prob.page_table, prob.qo_indptr, prob.kv_lens
    k = prob.k_cache[:, :1]
    with pytest.raises(ValueError, match=r"^msa.block_scores: argument 'k_index': expected page_size"):
        msa.block_scores(q, np.zeros((1, 1, 0, 64), np.float32), pt, qi, kl)
    with pytest.raises(TypeError, match=r"^msa.block_scores: argument 'kv_lens': expected dtype int32"):
        msa.block_scores(q, k, pt, qi, kl.astype(np.float64))
    with pytest.raises(ValueError, match=r"^msa.block_scores: argument 'kv_lens': expected >= 0"):
        msa.block_scores(q, k, pt, qi, np.array([-200, 140], np.int32))
    with pytest.raises(ValueError, match=r"^msa.block_scores: argument 'max_blocks': expected 0..16777216"):
        msa.block_scores(q, k, pt, qi, kl, max_blocks=2**31 - 1)  # refused before a [H, max_blocks, T] output
    scores = msa.block_scores(q, k, pt, qi, kl, layout="THK")
    with pytest.raises(ValueError, match=r"^msa.select_topk: argument 'topk': expected 1..1048576"):
        msa.select_topk(scores, qi, kl, 2**31 - 1, layout="THK")  # refused before a [T, H, topk] output exists
    with pytest.raises(ValueError, match=r"^msa.select_topk: arguments 'force_begin' \+ 'force_end'"):
        msa.select_topk(scores, qi, kl, 2, layout="THK", force_begin=2**31 - 1, force_end=1)
    cand_s = np.zeros((1, *scores.shape[:2], 2), np.float32)
    cand_i = np.zeros(cand_s.shape, np.int32)
    with pytest.raises(ValueError, match=r"^msa.merge_candidates: argument 'max_blocks': expected 1..16777216"):
        msa.merge_candidates(cand_s, cand_i, qi, kl, 2, 2**31 - 1)
    with pytest.raises(ValueError, match=r"^msa.merge_candidates: argument 'topk'"):
        msa.merge_candidates(cand_s, cand_i, qi, kl, 2**31 - 1, 8)


def test_plan_extremes():
    kw = dict(num_qo_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"^msa.plan_decode: argument 'max_kv_len'"):
        msa.plan_decode(1, 1, 2**37, **kw)
    with pytest.raises(ValueError, match=r"^msa.plan_decode: argument 'topk'"):
        msa.plan_decode(1, 1, 100, topk=2**31 - 1, **kw)
    with pytest.raises(ValueError, match=r"^msa.plan_prefill: argument 'qo_lens': expected a sum below 2\^31"):
        msa.plan_prefill([2**30, 2**30], [2**30, 2**30], **kw)
    with pytest.raises(ValueError, match=r"^msa.plan_prefill: argument 'qo_offset': expected 1 entries"):
        msa.plan_prefill([1], [4], qo_offset=[], **kw)
    with pytest.raises(ValueError, match=r"^msa.plan_decode: argument 'device'"):
        msa.plan_decode(1, 1, 100, device="cuda:99999999999", **kw)


def test_layer_steps_speak_of_the_layer(rng):
    prob = mt.make_problem(rng, qo_lens=[3], kv_lens=[300], num_qo_heads=4, num_kv_heads=2, head_dim=64, topk=2,
                           dtype="fp32")
    plan = msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, topk=2)
    k_index = prob.k_cache[:, :1]
    q_index = prob.q[:, :2]
    args = (plan, prob.q, prob.k_cache, prob.v_cache, q_index, k_index, prob.page_table, prob.qo_indptr,
            prob.kv_lens)
    msa.sparse_attention_layer(*args)
    with pytest.raises(ValueError, match=r"^msa.sparse_attention_layer \(block_scores step\): argument 'scores'"):
        msa.sparse_attention_layer(*args, scores=np.zeros((3, 2, 1), np.float32))
    with pytest.raises(ValueError, match=r"^msa.sparse_attention_layer \(select_topk step\): argument 'block_idx'"):
        msa.sparse_attention_layer(*args, block_idx=np.zeros((3, 2, 5), np.int32))
    with pytest.raises(ValueError, match=r"^msa.sparse_attention_layer: argument 'score_layout'"):
        msa.sparse_attention_layer(*args, score_layout="XYZ")
    with pytest.raises(ValueError, match=r"^msa.sparse_attention_layer \(block_scores step\): argument 'k_index' is "
                       r"required"):
        msa.sparse_attention_layer(*args[:5], None, *args[6:])
    # The index keys share the KV cache's page table: pages of another size would map other tokens.
    with pytest.raises(ValueError, match=r"^msa.sparse_attention_layer: argument 'k_index': .*page_size = 128"):
        msa.sparse_attention_layer(*args[:5], k_index[:, :, :64], *args[6:])
