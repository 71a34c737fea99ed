"""msa.attention with float8_e4m3fn K/V and the per-tensor scales (q_scale, k_scale, v_scale) on the CPU backend,
against the float64 reference over the dequantized cache (contract §1, §3): separate pools, the two halves of
one interleaved pool and slot-major views; dense and sparse; prefill with a prefix and decode; -1 slots and
empty rows; the scales with bf16 K/V; the errors of bad dtypes and scales; the layer forwarding the scales."""
import numpy as np
import pytest

import msa
import msa_testing as mt

ml_dtypes = pytest.importorskip("ml_dtypes")

F8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
Q_SCALE, K_SCALE, V_SCALE = 1.7, 0.137, 0.29  # not powers of two: a scale applied twice or not at all shows


def small_problem(rng, qo_lens, kv_lens, pattern="random", **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=8, num_kv_heads=2, head_dim=64,
                           page_size=64, topk=4, pattern=pattern, **kw)


def run(prob, k, v, *, q=None, plan=None, **kw):
    plan = plan or msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset,
                                    num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads,
                                    head_dim=prob.head_dim, page_size=prob.page_size, topk=prob.topk)
    q = prob.q.astype(BF16) if q is None else q
    return msa.attention(plan, q, k, v, prob.page_table, prob.qo_indptr, prob.kv_lens, block_idx=prob.block_idx,
                         qo_offset=prob.qo_offset, page_indptr=prob.page_indptr, return_lse=True, **kw)


def check(o, lse, ref):
    o_ref, lse_ref = ref
    mt.assert_close(np.asarray(o, np.float32), o_ref)
    mt.assert_lse_close(lse, lse_ref, atol=1e-4)


@pytest.mark.parametrize("layout", ["separate", "interleaved", "slot_major"])
@pytest.mark.parametrize("pattern", [None, "random"])
def test_prefill_with_prefix(rng, layout, pattern):
    prob = small_problem(rng, [40, 9, 1], [700, 300, 129], pattern, slot_major=layout == "slot_major")
    k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE, interleaved=layout == "interleaved")
    if layout == "interleaved":
        assert k8.base is v8.base and k8.strides[2] == 2 * k8.shape[3]
    o, lse = run(prob, k8, v8, q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=V_SCALE)
    assert o.dtype == BF16
    check(o, lse, mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE))


@pytest.mark.parametrize("layout", ["separate", "interleaved"])
@pytest.mark.parametrize("pattern", [None, "random"])
def test_decode(rng, layout, pattern):
    prob = small_problem(rng, [1, 2, 1], [300, 129, 1000], pattern)
    k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE, interleaved=layout == "interleaved")
    plan = msa.plan_decode(3, 2, 1000, num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=64, topk=prob.topk)
    # q holds batch * max_qo_len rows; the row past the last request sees no key.
    q = np.concatenate([prob.q, rng.standard_normal((2, 8, 64)).astype(np.float32)]).astype(BF16)
    bi = prob.block_idx
    if bi is not None:
        prob.block_idx = np.concatenate([bi, np.full((2, *bi.shape[1:]), -1, np.int32)])
    o, lse = run(prob, k8, v8, q=q, plan=plan, q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=V_SCALE)
    prob.block_idx = bi
    T = prob.q.shape[0]
    assert (np.asarray(o[T:], np.float32) == 0).all() and np.isneginf(lse[T:]).all()
    check(o[:T], lse[:T], mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE))


def test_empty_slots_and_empty_rows(rng):
    prob = small_problem(rng, [60, 30], [500, 90], empty_row_prob=0.4)
    assert (prob.block_idx < 0).any()
    k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE, interleaved=True)
    o, lse = run(prob, k8, v8, q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=V_SCALE)
    empty = np.isneginf(lse)
    assert empty.any()
    assert (np.asarray(o, np.float32)[empty] == 0).all()
    check(o, lse, mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE))


@pytest.mark.parametrize("qdtype", [np.float16, np.float32])
def test_output_takes_the_dtype_of_q(rng, qdtype):
    prob = small_problem(rng, [30], [400])
    k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE)
    o, lse = run(prob, k8, v8, q=prob.q.astype(qdtype), k_scale=K_SCALE, v_scale=V_SCALE)
    assert o.dtype == qdtype
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd)
    tol = dict(rel=1e-5, atol=1e-5) if qdtype == np.float32 else {}  # fp32: the dequantization is exact
    mt.assert_close(np.asarray(o, np.float32), o_ref, **tol)
    mt.assert_lse_close(lse, lse_ref, atol=1e-4)


def test_power_of_two_scales_equal_the_dequantized_bf16_cache(rng):
    """Power-of-two scales make every product exact: fp8 K/V with their scales and a bf16 cache holding the
    dequantized values give the same bits."""
    prob = small_problem(rng, [40, 9], [600, 300])
    k8, v8, kd, vd = mt.fp8_kv(prob, 0.25, 0.5)
    o8, lse8 = run(prob, k8, v8, q_scale=Q_SCALE, k_scale=0.25, v_scale=0.5)
    ob, lseb = run(prob, kd.astype(BF16), vd.astype(BF16), q_scale=Q_SCALE)
    np.testing.assert_array_equal(o8.view(np.uint16), ob.view(np.uint16))
    np.testing.assert_array_equal(lse8, lseb)


@pytest.mark.parametrize("pattern", [None, "random"])
def test_scales_apply_to_bf16_kv(rng, pattern):
    prob = small_problem(rng, [40, 9], [600, 300], pattern)
    o, lse = run(prob, prob.k_cache.astype(BF16), prob.v_cache.astype(BF16), q_scale=0.6, k_scale=2.3, v_scale=0.45)
    check(o, lse, mt.scaled_reference(prob, q_scale=0.6, k_scale=2.3, v_scale=0.45))


def test_scale_arguments_take_numbers(rng):
    prob = small_problem(rng, [8], [200])
    k, v = prob.k_cache.astype(BF16), prob.v_cache.astype(BF16)
    o, _ = run(prob, k, v, k_scale=np.float32(2.0), v_scale=1)
    ref = mt.scaled_reference(prob, k_scale=2.0)
    mt.assert_close(np.asarray(o, np.float32), ref[0])
    with pytest.raises(TypeError, match=r"^msa.attention: argument 'q_scale': expected a float, got str$"):
        run(prob, k, v, q_scale="2")
    with pytest.raises(TypeError, match=r"argument 'v_scale': expected a float, got bool"):
        run(prob, k, v, v_scale=True)


@pytest.mark.parametrize("name,value,shown", [("q_scale", 0.0, "0"), ("k_scale", -1.0, "-1"),
                                               ("v_scale", float("nan"), "nan"), ("k_scale", float("inf"), "inf")])
def test_scales_must_be_finite_and_positive(rng, name, value, shown):
    prob = small_problem(rng, [8], [200])
    k8, v8, _, _ = mt.fp8_kv(prob, 1.0, 1.0)
    with pytest.raises(ValueError, match=rf"^msa.attention: argument '{name}': expected a finite number > 0, "
                                         rf"got {shown}$"):
        run(prob, k8, v8, **{name: value})


def test_kv_dtype_errors_say_what_v_must_be(rng):
    prob = small_problem(rng, [8], [200])
    k8, v8, _, _ = mt.fp8_kv(prob, 1.0, 1.0)
    kb, vb = prob.k_cache.astype(BF16), prob.v_cache.astype(BF16)
    with pytest.raises(TypeError) as info:
        run(prob, k8, vb)
    assert str(info.value) == ("msa.attention: argument 'v': expected dtype float8_e4m3fn (as k: K and V are both "
                               "fp8 e4m3 or both in the dtype of q), got bfloat16")
    with pytest.raises(TypeError) as info:
        run(prob, kb, v8)
    assert str(info.value) == ("msa.attention: argument 'v': expected dtype bfloat16 (the dtype of q, as k: K and V "
                               "are both in the dtype of q or both fp8 e4m3), got float8_e4m3fn")
    with pytest.raises(TypeError) as info:
        run(prob, prob.k_cache.astype(np.float16), v8)
    assert str(info.value) == ("msa.attention: argument 'k': expected dtype bfloat16 or float8_e4m3fn (the dtype of "
                               "q, or fp8 e4m3 with k_scale and v_scale), got float16")


def test_layer_forwards_the_scales(rng):
    """sparse_attention_layer passes q_scale / k_scale / v_scale to its attention (fp8 K/V), while the index keys
    keep their own per-token scales (k_index_scale)."""
    prob = small_problem(rng, [40, 9], [600, 300])
    k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE)
    q_index = rng.standard_normal((prob.q.shape[0], 2, 64)).astype(BF16)
    k_index = rng.standard_normal((prob.k_cache.shape[0], 1, 64, 64)).astype(BF16)
    plan = msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=64,
                            topk=4)
    o, lse, bi = msa.sparse_attention_layer(plan, prob.q.astype(BF16), k8, v8, q_index, k_index, prob.page_table,
                                            prob.qo_indptr, prob.kv_lens, return_lse=True, return_block_idx=True,
                                            q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=V_SCALE)
    prob.block_idx = bi  # the layer's own selection
    check(o, lse, mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE))
