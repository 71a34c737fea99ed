"""msa.attention on the CPU backend (numpy inputs) against the float64 reference of msa_testing,
over the contract's cases: sparse and dense, unsorted rows with -1 anywhere, empty rows, ragged
lengths, prefixes with explicit and default qo_offset, non-causal, GQA, head dims, page sizes,
page-table forms, the slot-major pool and the [Hkv, T, topk] index layout."""
import numpy as np
import pytest

import msa
import msa_testing as mt

pytest.importorskip("ml_dtypes")  # bf16 numpy arrays


def plan_for(prob, **kw):
    return msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=prob.num_qo_heads,
                            num_kv_heads=prob.num_kv_heads, head_dim=prob.head_dim, head_dim_v=prob.head_dim_v,
                            page_size=prob.page_size, topk=prob.topk, causal=prob.causal,
                            qo_offset=prob.qo_offset, **kw)


def run(prob, plan=None, dtype=None, **kw):
    """o and lse (float64) of msa.attention on numpy arrays of the problem."""
    a = mt.to_numpy(prob, dtype)
    o, lse = msa.attention(plan or plan_for(prob), a["q"], a["k_cache"], a["v_cache"], a["page_table"],
                           a["qo_indptr"], a["kv_lens"], block_idx=a["block_idx"], qo_offset=a["qo_offset"],
                           page_indptr=a["page_indptr"], return_lse=True, **kw)
    assert o.dtype == a["q"].dtype and o.shape == (prob.q.shape[0], prob.num_qo_heads, prob.head_dim_v)
    assert lse.dtype == np.float32 and lse.shape == (prob.q.shape[0], prob.num_qo_heads)
    return o.astype(np.float64), lse.astype(np.float64)


def check(prob, **kw):
    o, lse = run(prob, **kw)
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o, o_ref)
    mt.assert_lse_close(lse, lse_ref)
    return o, lse


SMALL = dict(qo_lens=[5, 70], kv_lens=[300, 200], num_qo_heads=4, num_kv_heads=1, head_dim=64, topk=3)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("pattern", ["random", "clustered", "shared", None])
def test_dtypes_and_patterns(rng, dtype, pattern):
    check(mt.make_problem(rng, **SMALL, pattern=pattern, dtype=dtype))


def test_unsorted_rows_with_empty_slots_anywhere(rng):
    prob = mt.make_problem(rng, qo_lens=[40, 9], kv_lens=[900, 520], num_qo_heads=4, num_kv_heads=2,
                           head_dim=64, topk=6, neg_slot_prob=0.9, shuffle_rows=True)
    bi = prob.block_idx
    rows = bi.reshape(-1, bi.shape[-1])
    # the problem exercises what it claims: some row unsorted, some -1 before a valid entry
    assert any((np.diff(r[r >= 0]) < 0).any() for r in rows)
    assert any(((r[:-1] < 0) & (r[1:] >= 0)).any() for r in rows)
    check(prob)


def test_empty_rows_give_zero_and_neg_inf(rng):
    prob = mt.make_problem(rng, qo_lens=[30, 20], kv_lens=[400, 129], num_qo_heads=4, num_kv_heads=2,
                           head_dim=64, topk=3, empty_row_prob=0.4)
    o, lse = check(prob)
    empty = np.isneginf(mt.ref_attention(prob)[1])
    assert empty.any() and (~empty).any()
    assert (o[empty] == 0).all() and np.isneginf(lse[empty]).all()
    assert not np.isnan(o).any() and not np.isnan(lse).any()


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_key_reaches_the_rows_that_see_it(rng, value):
    """A NaN key, or an Inf one (which makes a NaN where q's element is positive), makes NaN exactly the rows
    (o and lse) that the float64 reference makes NaN: the rows that see the key; every other row as the reference."""
    prob = mt.make_problem(rng, qo_lens=[30, 20], kv_lens=[400, 300], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                           topk=3)
    pos, req = prob.positions(), prob.request_of_token()
    for t in (5, 29, 40):
        keys = mt.visible_keys(prob, t, 1, int(req[t]), int(pos[t]))
        key = int(keys[-1])
        page, slot = mt.cache_slot(prob, int(req[t]), key)
        prob.k_cache[page, 1, slot, 7] = value
    o, lse = run(prob)
    o_ref, lse_ref = mt.ref_attention(prob)
    nan_o, nan_l = np.isnan(o_ref), np.isnan(lse_ref)
    assert nan_l.any() and not nan_l.all()
    np.testing.assert_array_equal(np.isnan(o), nan_o)
    np.testing.assert_array_equal(np.isnan(lse), nan_l)
    mt.assert_close(np.where(nan_o, 0.0, o), np.where(nan_o, 0.0, o_ref))
    mt.assert_lse_close(lse[~nan_l], lse_ref[~nan_l])


def test_all_slots_empty_and_zero_query_requests(rng):
    prob = mt.make_problem(rng, qo_lens=[0, 3, 0], kv_lens=[100, 260, 0], num_qo_heads=2, num_kv_heads=1,
                           head_dim=64, topk=2)
    prob.block_idx[:] = -1
    o, lse = run(prob)
    assert (o == 0).all() and np.isneginf(lse).all()


def test_a_batch_of_no_tokens_with_any_strides(rng):
    """A q (and block_idx, o) of 0 rows addresses no memory, so any strides are accepted: numpy 2 gives every
    empty array strides (0, ..., 0), and torch.from_numpy keeps them (found by test_gpu_fuzz.py's sweep)."""
    prob = mt.make_problem(rng, qo_lens=[0, 0], kv_lens=[300, 0], num_qo_heads=4, num_kv_heads=1, head_dim=64, topk=3)
    a = mt.to_numpy(prob)
    q = np.lib.stride_tricks.as_strided(a["q"], shape=a["q"].shape, strides=(0, 0, 0))
    bi = np.lib.stride_tricks.as_strided(a["block_idx"], shape=a["block_idx"].shape, strides=(0, 0, 0))
    o, lse = msa.attention(plan_for(prob), q, a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"],
                           a["kv_lens"], block_idx=bi, return_lse=True)
    assert o.shape == (0, 4, 64) and lse.shape == (0, 4)


@pytest.mark.parametrize("kv_lens", [[1, 127, 129], [255, 257, 383]])
def test_lengths_not_multiple_of_128(rng, kv_lens):
    check(mt.make_problem(rng, qo_lens=[1, 20, 33], kv_lens=kv_lens, num_qo_heads=2, num_kv_heads=1,
                          head_dim=64, topk=2, page_size=32))


@pytest.mark.parametrize("explicit_offset", [False, True])
@pytest.mark.parametrize("pattern", ["random", None])
def test_prefix_plus_chunk(rng, explicit_offset, pattern):
    # request 0: a 300-token cached prefix and a 40-token chunk; explicit offsets leave keys after the chunk
    qo_offset = [300, 100] if explicit_offset else None
    prob = mt.make_problem(rng, qo_lens=[40, 17], kv_lens=[500, 117] if explicit_offset else [340, 117],
                           qo_offset=qo_offset, num_qo_heads=4, num_kv_heads=1, head_dim=64, topk=3,
                           pattern=pattern)
    check(prob)


@pytest.mark.parametrize("pattern", ["random", None])
def test_non_causal(rng, pattern):
    check(mt.make_problem(rng, qo_lens=[12, 5], kv_lens=[400, 90], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                          topk=3, causal=False, pattern=pattern))


@pytest.mark.parametrize("pattern", ["random", None])
@pytest.mark.parametrize("heads", [(2, 2), (8, 2), (16, 1)], ids=["gqa1", "gqa4", "gqa16"])
def test_gqa(rng, heads, pattern):
    check(mt.make_problem(rng, qo_lens=[9, 20], kv_lens=[300, 150], num_qo_heads=heads[0],
                          num_kv_heads=heads[1], head_dim=64, topk=2, pattern=pattern))


@pytest.mark.parametrize("dims", [(64, None), (128, None), (256, None), (128, 64)],
                         ids=["d64", "d128", "d256", "d128-dv64"])
def test_head_dims(rng, dims):
    check(mt.make_problem(rng, qo_lens=[6, 10], kv_lens=[200, 300], num_qo_heads=2, num_kv_heads=1,
                          head_dim=dims[0], head_dim_v=dims[1], topk=2))


@pytest.mark.parametrize("pattern", ["random", None])
@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("flat_pages", [False, True], ids=["dense_table", "flat_table"])
def test_page_sizes_and_table_forms(rng, page_size, flat_pages, pattern):
    check(mt.make_problem(rng, qo_lens=[7, 12], kv_lens=[290, 140], num_qo_heads=2, num_kv_heads=1,
                          head_dim=64, topk=2, page_size=page_size, flat_pages=flat_pages, pattern=pattern))


@pytest.mark.parametrize("page_size", [16, 128])
@pytest.mark.parametrize("pattern", ["random", None])
def test_slot_major_pool(rng, page_size, pattern):
    prob = mt.make_problem(rng, qo_lens=[8, 11], kv_lens=[260, 130], num_qo_heads=4, num_kv_heads=2,
                           head_dim=64, topk=2, page_size=page_size, slot_major=True, pattern=pattern)
    k = mt.to_numpy(prob)["k_cache"]
    assert k.strides[2] == 2 * 64 * k.itemsize  # token stride Hkv * D: a view of the [slots, Hkv, D] pool
    check(prob)


def test_hkv_t_topk_index_layout(rng):
    prob = mt.make_problem(rng, qo_lens=[15, 6], kv_lens=[390, 200], num_qo_heads=4, num_kv_heads=2,
                           head_dim=64, topk=3, index_layout="HTK")
    assert not prob.block_idx.flags.c_contiguous and prob.block_idx.base.shape == (2, 21, 3)
    check(prob)


def test_strided_q_and_out(rng):
    prob = mt.make_problem(rng, **SMALL)
    a = mt.to_numpy(prob)
    T, Hq, D = prob.q.shape
    fused = np.zeros((T, Hq, 3 * D), a["q"].dtype)  # q as the first third of a fused qkv row
    fused[:, :, :D] = a["q"]
    out_buf = np.full((T, Hq, 2 * D), np.nan, np.float32).astype(a["q"].dtype)
    out = out_buf[:, :, D:]
    o = msa.attention(plan_for(prob), fused[:, :, :D], a["k_cache"], a["v_cache"], a["page_table"],
                      a["qo_indptr"], a["kv_lens"], block_idx=a["block_idx"], out=out)
    assert o is out
    mt.assert_close(out.astype(np.float64), mt.ref_attention(prob)[0])
    assert np.isnan(out_buf[:, :, :D].astype(np.float32)).all()  # nothing written outside the view


def test_sm_scale(rng):
    prob = mt.make_problem(rng, **SMALL, sm_scale=0.3)
    check(prob, sm_scale=0.3)


def test_lse_given_without_return_lse(rng):
    prob = mt.make_problem(rng, **SMALL)
    a = mt.to_numpy(prob)
    lse = np.full((prob.q.shape[0], prob.num_qo_heads), np.nan, np.float32)
    o = msa.attention(plan_for(prob), a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"],
                      a["kv_lens"], block_idx=a["block_idx"], lse=lse)
    assert isinstance(o, np.ndarray)
    mt.assert_lse_close(lse, mt.ref_attention(prob)[1])


def test_validate_accepts_good_input(rng):
    check(mt.make_problem(rng, **SMALL), validate=True)


def test_plan_reuse_is_deterministic(rng):
    prob = mt.make_problem(rng, **SMALL)
    plan = plan_for(prob)
    o1, lse1 = run(prob, plan=plan)
    o2, lse2 = run(prob, plan=plan)
    assert np.array_equal(o1, o2) and np.array_equal(lse1, lse2)
