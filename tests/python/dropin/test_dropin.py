"""The drop-ins for serving engines on CPU tensors (the reference backend): msa.fmha_sm100 (MiniMax's
fmha_sm100 API), msa.sglang (sglang's minimax_sparse_ops/msa.py) and the torch custom ops of
msa.torch_ops (opcheck, FakeTensor propagation, torch.compile(fullgraph=True) tracing)."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402
import sglang_testing as st  # noqa: E402
from msa import sglang as msg  # noqa: E402
from msa import torch_ops  # noqa: E402
from msa.fmha_sm100 import (DECODE_MAX_KV_LEN, fmha_sm100, fmha_sm100_decode_plan, fmha_sm100_plan,  # noqa: E402
                            sparse_topk_select)

pytest.importorskip("ml_dtypes")

HQ, HKV, D, TOPK = 8, 2, 64, 4


def sparse_problem(rng, qo_lens, kv_lens, *, page_size=128, causal=True, qo_offset=None, pattern="random"):
    """A problem in fmha_sm100's layouts: slot-major pool, flat page table, block indexes [Hkv, T, topk]."""
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, qo_offset=qo_offset, num_qo_heads=HQ,
                           num_kv_heads=HKV, head_dim=D, page_size=page_size, topk=TOPK, causal=causal,
                           pattern=pattern, slot_major=True, flat_pages=True, index_layout="HTK")


def plan_for(prob, **kw):
    kw.setdefault("kv_block_num", TOPK if prob.block_idx is not None else -1)
    return fmha_sm100_plan(torch.from_numpy(np.diff(prob.qo_indptr)), torch.from_numpy(prob.kv_lens), HQ,
                           num_kv_heads=HKV, page_size=prob.page_size, causal=prob.causal,
                           qo_offset=None if prob.qo_offset is None else torch.from_numpy(prob.qo_offset),
                           head_dim=D, device="cpu", **kw)


def run_fmha(prob, plan, **kw):
    t = mt.to_torch(prob, device="cpu")
    return fmha_sm100(t["q"], t["k_cache"], t["v_cache"], plan, kv_indices=t["page_table"],
                      kv_block_indexes=t["block_idx"], **kw)


def write_lengths(info, kv_lens, page_indptr, qo_offset):
    """Rewrites a plan's length tensors in place, as a serving engine does between steps."""
    kv = torch.from_numpy(np.asarray(kv_lens, np.int32))
    info["kv_segment_lens"].copy_(kv)
    torch.cumsum(kv, 0, dtype=torch.int32, out=info["kv_segment_offsets"][1:])
    info["kv_page_indptr"].copy_(torch.from_numpy(page_indptr))
    info["qo_offset"].copy_(torch.from_numpy(np.asarray(qo_offset, np.int32)))


# --------------------------------------------------------------------------------------- fmha_sm100


def test_plan_is_fmha_sm100s_tuple_with_int32_length_tensors():
    plan = fmha_sm100_plan(torch.tensor([100, 3]), torch.tensor([300, 700]), HQ, num_kv_heads=HKV, page_size=128,
                           kv_block_num=TOPK, qo_offset=torch.tensor([200, 650]), head_dim=D, device="cpu")
    assert plan[:3] == (False, 0, 2) and plan[4] is None
    info = plan[3]
    expected = {"qo_segment_lens": [100, 3], "qo_segment_offsets": [0, 100, 103], "kv_segment_lens": [300, 700],
                "kv_segment_offsets": [0, 300, 1000], "kv_page_indptr": [0, 3, 9], "qo_offset": [200, 650]}
    for key, values in expected.items():
        assert info[key].dtype == torch.int32 and info[key].device.type == "cpu", key
        assert info[key].tolist() == values, key
    assert info["msa_plan"].plan.phase == "prefill"
    assert info["max_k_tiles"] == -1


def test_decode_shaped_batches_get_length_independent_plans():
    plan = fmha_sm100_plan(torch.ones(4, dtype=torch.int32), torch.tensor([5, 300, 129, 7000]), HQ,
                           num_kv_heads=HKV, page_size=128, kv_block_num=TOPK, causal=False, head_dim=D,
                           device="cpu")
    info = plan[3]
    assert info["msa_plan"].plan.phase == "decode"
    assert info["max_kv_len"] == DECODE_MAX_KV_LEN and info["max_qo_len"] == 1
    bounded = fmha_sm100_plan([2, 8], [300, 400], HQ, HKV, page_size=128, head_dim=D, device="cpu", max_kv_len=4096)
    assert bounded[3]["msa_plan"].plan.max_kv_len == 4096 and bounded[3]["max_qo_len"] == 8


@pytest.mark.parametrize("qo_lens,kv_lens", [([130, 5], [300, 700]), ([1, 3, 8], [129, 1000, 8])],
                         ids=["prefill", "decode"])
@pytest.mark.parametrize("causal", [True, False])
def test_sparse_attention_matches_reference(rng, qo_lens, kv_lens, causal):
    prob = sparse_problem(rng, qo_lens, kv_lens, causal=causal)
    o, max_score = run_fmha(prob, plan_for(prob))
    assert max_score is None
    o_ref, _ = mt.ref_attention(prob)
    mt.assert_close(o.float().numpy(), o_ref)


def test_unsorted_rows_and_scattered_empty_slots(rng):
    """fmha_sm100 needs ascending rows with a -1 tail; msa takes rows in any order (contract §2)."""
    prob = sparse_problem(rng, [64, 1], [900, 600])
    rows = prob.block_idx
    assert any((np.diff(r[r >= 0]) < 0).any() for r in rows.reshape(-1, TOPK)), "no unsorted row drawn"
    o, _ = run_fmha(prob, plan_for(prob), check_input_valid=True)
    mt.assert_close(o.float().numpy(), mt.ref_attention(prob)[0])


def test_page_table_argument_and_scales(rng):
    prob = sparse_problem(rng, [40, 2], [500, 300], page_size=64)
    dense = np.full((2, 8), -1, np.int32)
    for b in range(2):
        row = prob.page_table[prob.page_indptr[b]:prob.page_indptr[b + 1]]
        dense[b, :len(row)] = row
    t = mt.to_torch(prob, device="cpu")
    o, _ = fmha_sm100(t["q"], t["k_cache"], t["v_cache"], plan_for(prob), page_table=torch.from_numpy(dense),
                      kv_block_indexes=t["block_idx"], sm_scale=0.1, q_scale=0.5, k_scale=2.0, v_scale=3.0)
    prob.sm_scale = 0.1
    mt.assert_close(o.float().numpy() / 3.0, mt.ref_attention(prob)[0])


@pytest.mark.parametrize("make_plan", ["fmha_sm100_plan", "fmha_sm100_decode_plan"])
def test_decode_plan_rewritten_in_place(rng, make_plan):
    """One decode plan serves steps whose lengths, offsets and page tables change, rewritten in place."""
    if make_plan == "fmha_sm100_plan":
        plan = fmha_sm100_plan([1, 1, 1], [200, 300, 129], HQ, HKV, page_size=128, kv_block_num=TOPK,
                               head_dim=D, device="cpu")
    else:
        plan = fmha_sm100_decode_plan(3, HQ, HKV, page_size=128, kv_block_num=TOPK, head_dim=D, device="cpu")
    info = plan[3]
    for kv_lens in ([130, 1, 700], [131, 2, 701], [1999, 64, 128]):
        prob = sparse_problem(rng, [1, 1, 1], kv_lens)
        write_lengths(info, kv_lens, prob.page_indptr, np.asarray(kv_lens) - 1)
        o, _ = run_fmha(prob, plan)
        mt.assert_close(o.float().numpy(), mt.ref_attention(prob)[0])


def test_prefill_plan_lengths_are_fixed_at_plan_time(rng):
    prob = sparse_problem(rng, [100, 20], [300, 500])
    plan = plan_for(prob)
    plan[3]["kv_segment_lens"].copy_(torch.tensor([301, 500], dtype=torch.int32))
    with pytest.raises(ValueError, match="prefill plan was built for"):
        run_fmha(prob, plan)


def test_q_offset_override(rng):
    prob = sparse_problem(rng, [20, 30], [400, 300], qo_offset=[100, 270])
    plan = plan_for(sparse_problem(rng, [20, 30], [400, 300]))  # planned with the default offsets
    o, _ = run_fmha(prob, plan, q_offset_override=torch.tensor([100, 270], dtype=torch.int32))
    mt.assert_close(o.float().numpy(), mt.ref_attention(prob)[0])


@pytest.mark.parametrize("layout", ["HKT", "THK", None])
def test_max_score_of_dense_attention(rng, layout):
    prob = sparse_problem(rng, [150, 3], [500, 1000], pattern=None)
    plan = plan_for(prob, output_maxscore=True)
    info = plan[3]
    assert info["max_k_tiles"] == 128
    T = prob.q.shape[0]
    buf = None
    if layout == "HKT":
        buf = torch.empty(HQ, info["max_k_tiles"], T)
    elif layout == "THK":
        buf = torch.empty(T, HQ, 16)  # any block extent that covers the keys
    o, scores = run_fmha(prob, plan, max_score=buf, output_o=layout != "THK")
    ref = mt.ref_block_scores(prob.q, prob.k_cache, prob.page_table, prob.page_indptr, prob.qo_indptr,
                              prob.kv_lens, causal=True, max_blocks=scores.shape[1 if layout != "THK" else 2])
    got = scores.numpy() if layout == "THK" else scores.numpy().transpose(2, 0, 1)
    assert buf is None or scores is buf
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-4, atol=1e-3)
    if layout == "THK":
        assert o is None
    else:
        mt.assert_close(o.float().numpy(), mt.ref_attention(prob)[0])


def test_non_paged_kv(rng):
    """page_size=-1: K/V are [total_kv, Hkv, D], request b's keys at rows kv_segment_offsets[b] + j."""
    prob = sparse_problem(rng, [70, 1], [300, 260], pattern=None)
    rows_k, rows_v = [], []
    for b, n in enumerate(prob.kv_lens):
        keys = np.arange(n)
        k = [mt.gather_kv(prob, b, g, keys)[0] for g in range(HKV)]
        v = [mt.gather_kv(prob, b, g, keys)[1] for g in range(HKV)]
        rows_k.append(np.stack(k, 1))
        rows_v.append(np.stack(v, 1))
    k_flat = torch.from_numpy(np.concatenate(rows_k).astype(np.float32)).to(torch.bfloat16)
    v_flat = torch.from_numpy(np.concatenate(rows_v).astype(np.float32)).to(torch.bfloat16)
    plan = fmha_sm100_plan(torch.tensor([70, 1]), torch.from_numpy(prob.kv_lens), HQ, HKV, head_dim=D, device="cpu")
    o, _ = fmha_sm100(torch.from_numpy(prob.q).to(torch.bfloat16), k_flat, v_flat, plan)
    mt.assert_close(o.float().numpy(), mt.ref_attention(prob)[0])


def test_what_msa_does_not_serve(rng):
    prob = sparse_problem(rng, [4, 1], [300, 200])
    t = mt.to_torch(prob, device="cpu")
    plan = plan_for(prob)
    fmha_sm100_plan([1], [10], HQ, HKV, page_size=128, use_fp8_kvcache=True, device="cpu")  # served
    with pytest.raises(NotImplementedError, match="o_scale"):
        run_fmha(prob, plan, o_scale=2.0)
    per_qo_head = torch.zeros(t["q"].shape[0], HQ, TOPK, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="one block list per query head"):
        fmha_sm100(t["q"], t["k_cache"], t["v_cache"], plan, kv_indices=t["page_table"],
                   kv_block_indexes=per_qo_head)
    with pytest.raises(ValueError, match="kv_indices"):
        fmha_sm100(t["q"], t["k_cache"], t["v_cache"], plan, kv_block_indexes=t["block_idx"])
    with pytest.raises(ValueError, match="needs a paged K/V"):
        fmha_sm100_plan([1], [10], HQ, HKV, kv_block_num=4, device="cpu")
    with pytest.raises(TypeError, match="plan_info"):
        fmha_sm100(t["q"], t["k_cache"], t["v_cache"], (False, 0, 2, {}, None), kv_indices=t["page_table"])


# ------------------------------------------------------------------------------- sparse_topk_select


def scores_with_padding(rng, T, H, K, nvp):
    """THK scores: random over each token's valid tiles, -inf on the padding tail (as fmha_sm100 fills)."""
    s = np.full((T, H, K), -np.inf, np.float32)
    for t in range(T):
        s[t, :, :nvp[t]] = rng.standard_normal((H, nvp[t]))
    return s


@pytest.mark.parametrize("layout", ["HKT", "THK"])
@pytest.mark.parametrize("nvp_kind", ["int", "tensor", "none"])
@pytest.mark.parametrize("force", [(0, 0), (1, 2)])
def test_sparse_topk_select_matches_reference(rng, layout, nvp_kind, force):
    T, H, K, topk = 6, 3, 40, 8
    nvp = {"int": np.full(T, 25), "tensor": np.array([1, 5, 8, 9, 33, 40]), "none": np.full(T, K)}[nvp_kind]
    s_thk = scores_with_padding(rng, T, H, K, nvp)
    scores = torch.from_numpy(s_thk if layout == "THK" else np.ascontiguousarray(s_thk.transpose(1, 2, 0)))
    arg = {"int": 25, "tensor": torch.from_numpy(nvp.astype(np.int32)), "none": None}[nvp_kind]
    got = sparse_topk_select(scores, topk, num_valid_pages=arg, force_begin_blocks=force[0],
                             force_end_blocks=force[1], max_score_layout=layout)
    ref = mt.ref_select_topk(s_thk, np.arange(T + 1), nvp * 128, topk, qo_offset=np.zeros(T, np.int64),
                             force_begin=force[0], force_end=force[1], causal=False)
    np.testing.assert_array_equal(got.numpy(), ref)


def test_sparse_topk_select_output_and_block_table(rng):
    T, H, K, topk = 4, 2, 20, 16
    nvp = np.array([3, 20, 17, 16])
    s_thk = scores_with_padding(rng, T, H, K, nvp)
    ref = mt.ref_select_topk(s_thk, np.arange(T + 1), nvp * 128, topk, qo_offset=np.zeros(T, np.int64),
                             force_begin=0, force_end=1, causal=False)
    out = torch.full((H, T, topk), 7, dtype=torch.int32).permute(1, 0, 2)  # a strided view, as vLLM passes
    got = sparse_topk_select(torch.from_numpy(s_thk), topk, num_valid_pages=torch.from_numpy(nvp), output=out,
                             force_end_blocks=1, max_score_layout="THK")
    assert got is out
    np.testing.assert_array_equal(out.numpy(), ref)
    table = rng.integers(0, 1000, (T, H, K)).astype(np.int32)
    gathered = sparse_topk_select(torch.from_numpy(s_thk), topk, num_valid_pages=torch.from_numpy(nvp),
                                  force_end_blocks=1, max_score_layout="THK", block_table=torch.from_numpy(table))
    expect = np.where(ref >= 0, np.take_along_axis(table, np.maximum(ref, 0), 2), -1)
    np.testing.assert_array_equal(gathered.numpy(), expect)
    with pytest.raises(NotImplementedError, match="TRTLLM"):
        sparse_topk_select(torch.from_numpy(s_thk), topk, block_table=torch.zeros(T, K, dtype=torch.int32),
                           max_score_layout="THK")
    with pytest.raises(ValueError, match="num_valid_pages"):
        sparse_topk_select(torch.from_numpy(s_thk), topk, num_valid_pages=K + 1, max_score_layout="THK")


# ------------------------------------------------------------------------------------------- sglang


def sglang_state(rng, num_reqs=3, max_context=1024):
    return st.SglangState(rng, num_reqs=num_reqs, max_context=max_context, num_qo_heads=HQ, num_kv_heads=HKV,
                          head_dim=D, topk=TOPK)


def pools(state):
    return (torch.from_numpy(state.k_pool).to(torch.bfloat16), torch.from_numpy(state.v_pool).to(torch.bfloat16),
            torch.from_numpy(state.req_to_token))


def test_sglang_prefill_with_prefix_and_chunk(rng):
    state = sglang_state(rng)
    batch = state.prefill_batch(rng, seq_lens=[300, 700, 140], prefix_lens=[0, 650, 137], slot_ids=[2, 0, 1])
    t = st.to_torch(batch, "cpu")
    k_pool, v_pool, r2t = pools(state)
    o = msg.msa_sparse_prefill_main(t["q"], k_pool, v_pool, t["topk_idx"], r2t, t["slot_ids"], t["cu_seqlens"],
                                    t["seq_lens"], t["prefix_lens"], 128)
    mt.assert_close(o.float().numpy(), mt.ref_attention(state.problem(batch))[0])


def test_sglang_decode_steps_with_a_persistent_plan(rng):
    state = sglang_state(rng, num_reqs=3, max_context=1024)
    k_pool, v_pool, r2t = pools(state)
    B = 4
    slot_ids = [1, 3, 0, 2]  # row 3 of req_to_token is unused: the padded request of a graph batch
    plan = msg.build_msa_decode_cg_plan(HQ, HKV, 128, TOPK, B, device="cpu", head_dim=D)
    nb_max = math.ceil(1024 / 128)
    kv_indices = torch.zeros(B * nb_max, dtype=torch.int32)
    seq_lens = np.array([126, 0, 500, 1])
    for step in range(4):
        seq_lens = seq_lens + np.array([1, 0, 1, 1])
        for b in (0, 2, 3):
            slot, k_row, v_row = state.write_token(rng, slot_ids[b], int(seq_lens[b]) - 1)
            k_pool[slot], v_pool[slot] = torch.from_numpy(k_row), torch.from_numpy(v_row)
        batch = state.decode_batch(rng, seq_lens=seq_lens, slot_ids=slot_ids)
        t = st.to_torch(batch, "cpu")
        t["seq_lens"] = t["seq_lens"].long()  # sglang's seq_lens are int64
        msg.update_msa_decode_cg_meta(plan, kv_indices, r2t, t["slot_ids"], t["seq_lens"], 128, TOPK, HQ, HKV)
        args = (t["q"], k_pool, v_pool, t["topk_idx"], r2t, t["slot_ids"], t["seq_lens"], 128)
        o = msg.msa_sparse_decode_main(*args, kv_indices=kv_indices, plan=plan)
        mt.assert_close(o.float().numpy(), mt.ref_attention(state.problem(batch))[0])
        assert not o[1].any(), "a padded request (seq_len 0) returns o = 0"
        assert torch.equal(o, msg.msa_sparse_decode_main(*args)), "without plan: build_msa_decode_meta"
        # The buffer update_msa_decode_cg_meta wrote is read as the dense [B, nb_max] table (its rows are
        # kv_page_indptr's b * nb_max), any other buffer through the flat form; both give the same bits.
        rows = msg._dense_page_rows(plan[3], kv_indices)
        assert rows.shape == (B, nb_max) and rows.data_ptr() == kv_indices.data_ptr()
        assert msg._dense_page_rows(plan[3], kv_indices.clone()) is None
        flat, _ = fmha_sm100(t["q"], msg._paged("t", k_pool, 128), msg._paged("t", v_pool, 128), plan,
                             kv_indices=kv_indices, kv_block_indexes=t["topk_idx"].permute(1, 0, 2).to(torch.int32))
        assert torch.equal(o, flat), "dense page rows and the flat table give the same bits"


def test_sglang_refusals(rng):
    state = sglang_state(rng)
    batch = state.decode_batch(rng, seq_lens=[10, 20], slot_ids=[0, 1])
    t = st.to_torch(batch, "cpu")
    k_pool, v_pool, r2t = pools(state)
    args = (t["topk_idx"], r2t, t["slot_ids"], t["seq_lens"], 128)
    with pytest.raises(msg.MSAUnavailableError, match="bf16 or fp16"):
        msg.msa_sparse_decode_main(t["q"].to(torch.float8_e4m3fn), k_pool.to(torch.float8_e4m3fn),
                                   v_pool.to(torch.float8_e4m3fn), *args)
    msg.build_msa_decode_cg_plan(HQ, HKV, 128, TOPK, 2, device="cpu", is_fp8=True)  # served
    with pytest.raises(ValueError, match="not divisible by page_size"):
        msg.msa_sparse_decode_main(t["q"], k_pool[:100], v_pool[:100], *args)
    with pytest.raises(msg.MSAUnavailableError, match="blocks of 128 tokens"):
        msg.msa_sparse_decode_main(t["q"], k_pool, v_pool, *args[:-1], 64)
    plan = msg.build_msa_decode_cg_plan(HQ, HKV, 128, TOPK, 2, device="cpu", max_kv_len=512, head_dim=D)
    with pytest.raises(ValueError, match="max_kv_len"):
        msg.update_msa_decode_cg_meta(plan, torch.zeros(2 * 8, dtype=torch.int32), r2t, t["slot_ids"],
                                      t["seq_lens"], 128, TOPK, HQ, HKV)
    with pytest.raises(ValueError, match="plan's batch size 2, got 0 requests"):  # not a silent no-op
        msg.update_msa_decode_cg_meta(plan, torch.zeros(2 * 4, dtype=torch.int32), r2t, t["slot_ids"][:0],
                                      t["seq_lens"][:0], 128, TOPK, HQ, HKV)
    if not torch.cuda.is_available():
        assert not msg.msa_available()


# ------------------------------------------------------------------------------------------ torch ops


def attention_args(rng):
    prob = sparse_problem(rng, [5, 1], [300, 200])
    t = mt.to_torch(prob, device="cpu")
    handle = torch_ops.PlanHandle(msa.plan_prefill([5, 1], [300, 200], num_qo_heads=HQ, num_kv_heads=HKV,
                                                   head_dim=D, topk=TOPK))
    return prob, t, handle


def test_opcheck(rng):
    prob, t, handle = attention_args(rng)
    T = t["q"].shape[0]
    out = torch.empty(T, HQ, D, dtype=torch.bfloat16)
    lse = torch.empty(T, HQ)
    torch.library.opcheck(torch.ops.msa.attention.default,
                          (handle.handle, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"],
                           t["kv_lens"], t["block_idx"], None, t["page_indptr"], out, lse, None, False))
    scores = torch.empty(HQ, 3, T)
    torch.library.opcheck(torch.ops.msa.block_scores.default,
                          (t["q"], t["k_cache"], None, t["page_table"], t["page_indptr"], t["qo_indptr"], t["kv_lens"],
                           None, scores, "HKT", True, False))
    torch.library.opcheck(torch.ops.msa.select_topk.default,
                          (scores, t["qo_indptr"], t["kv_lens"], 2, None, "HKT", 0, 1, True,
                           torch.empty(T, HQ, 2, dtype=torch.int32), False, False, None, None))
    r2t = torch.arange(2 * 256, dtype=torch.int32).reshape(2, 256)
    torch.library.opcheck(torch.ops.msa.build_page_table.default,
                          (r2t, torch.tensor([1, 0]), torch.tensor([200, 3]), 128,
                           torch.empty(2, 2, dtype=torch.int32)))
    torch.library.opcheck(torch.ops.msa.merge_states.default,
                          (torch.randn(3, T, HQ, D), torch.randn(3, T, HQ), torch.empty(T, HQ, D), torch.empty(T, HQ)))


def test_fake_tensors_propagate_through_the_drop_ins(rng):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    prob = sparse_problem(rng, [1, 1], [300, 200])
    t = mt.to_torch(prob, device="cpu")
    plan = plan_for(prob)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty_like(t["q"])
        o, _ = fmha_sm100(q, t["k_cache"], t["v_cache"], plan, kv_indices=t["page_table"],
                          kv_block_indexes=t["block_idx"])
        sel = sparse_topk_select(torch.empty(5, HQ, 30), 16, num_valid_pages=7, max_score_layout="THK")
    assert isinstance(o, FakeTensor) and o.shape == (2, HQ, D) and o.dtype == torch.bfloat16
    assert isinstance(sel, FakeTensor) and sel.shape == (5, HQ, 16) and sel.dtype == torch.int32


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_traces_the_decode_path(rng, backend):
    """msa_sparse_decode_main with a persistent plan compiles with fullgraph=True (no graph break) and
    matches eager; so do the torch_ops functions and sparse_topk_select."""
    torch._dynamo.reset()
    state = sglang_state(rng, num_reqs=2, max_context=512)
    k_pool, v_pool, r2t = pools(state)
    batch = state.decode_batch(rng, seq_lens=[300, 129], slot_ids=[1, 0])
    t = st.to_torch(batch, "cpu")
    plan = msg.build_msa_decode_cg_plan(HQ, HKV, 128, TOPK, 2, device="cpu", head_dim=D)
    kv_indices = torch.zeros(2 * 4, dtype=torch.int32)
    msg.update_msa_decode_cg_meta(plan, kv_indices, r2t, t["slot_ids"], t["seq_lens"], 128, TOPK, HQ, HKV)

    def decode(q, topk_idx):
        o = msg.msa_sparse_decode_main(q, k_pool, v_pool, topk_idx, r2t, t["slot_ids"], t["seq_lens"], 128,
                                       kv_indices=kv_indices, plan=plan)
        return o.float() * 2

    def select(scores):
        return sparse_topk_select(scores, 4, num_valid_pages=3, force_end_blocks=1, max_score_layout="THK")

    compiled = torch.compile(decode, fullgraph=True, backend=backend)
    for step in range(2):  # the second step rewrites lengths and page table in place, as between replays
        if step:
            batch = state.decode_batch(rng, seq_lens=[301, 130], slot_ids=[1, 0])
            fresh = st.to_torch(batch, "cpu")
            t["seq_lens"].copy_(fresh["seq_lens"])
            t["q"], t["topk_idx"] = fresh["q"], fresh["topk_idx"]
            msg.update_msa_decode_cg_meta(plan, kv_indices, r2t, t["slot_ids"], t["seq_lens"], 128, TOPK, HQ, HKV)
        expect = decode(t["q"], t["topk_idx"])
        assert torch.equal(compiled(t["q"], t["topk_idx"]), expect)
        mt.assert_close(expect.numpy() / 2, mt.ref_attention(state.problem(batch))[0])
    scores = torch.randn(3, HQ, 9)
    assert torch.equal(torch.compile(select, fullgraph=True, backend=backend)(scores), select(scores))


def test_plan_handles_live_with_their_owner():
    plan = msa.plan_decode(2, 1, 1000, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D)
    handle = torch_ops.PlanHandle(plan)
    number = handle.handle
    assert torch_ops._plan_object("test", number) is plan
    del handle
    with pytest.raises(ValueError, match="no live plan"):
        torch_ops._plan_object("test", number)
