"""The drop-ins for serving engines on the GPU, in sglang's calling sequences, at MiniMax-M3's per-GPU
shapes (TP1: Hq=64, Hkv=4, D=128, top-16 blocks of 128 tokens): sparse prefill with prefix and chunk;
20 decode steps replayed from one CUDA graph with update_msa_decode_cg_meta between replays; an
fmha_sm100 plan rewritten in place under a graph; the torch ops captured and compiled. Every result is
checked against the float64 reference of msa_testing.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/dropin/test_gpu_dropin.py
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402
import sglang_testing as st  # noqa: E402
from msa import sglang as msg  # noqa: E402
from msa import torch_ops  # noqa: E402
from msa.fmha_sm100 import fmha_sm100, fmha_sm100_plan, sparse_topk_select  # noqa: E402

pytestmark = pytest.mark.gpu

HQ, HKV, D, TOPK = 64, 4, 128, 16
P = 128
DEV = "cuda"


def m3_state(rng, num_reqs, max_context):
    return st.SglangState(rng, num_reqs=num_reqs, max_context=max_context, num_qo_heads=HQ, num_kv_heads=HKV,
                          head_dim=D, topk=TOPK)


def device_pools(state):
    return (torch.from_numpy(state.k_pool).to(DEV, torch.bfloat16),
            torch.from_numpy(state.v_pool).to(DEV, torch.bfloat16),
            torch.from_numpy(state.req_to_token).to(DEV))


def append_tokens(rng, state, k_pool, v_pool, slot_ids, seq_lens, grew):
    """Writes fresh K/V for the last token of every request that grew, on the host and on the device."""
    for b in np.flatnonzero(grew):
        slot, k_row, v_row = state.write_token(rng, slot_ids[b], int(seq_lens[b]) - 1)
        k_pool[slot] = torch.from_numpy(k_row).to(DEV, torch.bfloat16)
        v_pool[slot] = torch.from_numpy(v_row).to(DEV, torch.bfloat16)


def host(o):
    return o.float().cpu().numpy()


def test_msa_available():
    assert msg.msa_available()


def test_sglang_prefill_with_prefix_and_chunk(rng):
    """A fresh prompt, a 300-token chunk after a 1000-token prefix and a 5-token chunk after 2000."""
    state = m3_state(rng, num_reqs=3, max_context=4096)
    batch = state.prefill_batch(rng, seq_lens=[700, 1300, 2005], prefix_lens=[0, 1000, 2000], slot_ids=[1, 2, 0])
    t = st.to_torch(batch, DEV)
    k_pool, v_pool, r2t = device_pools(state)
    o = msg.msa_sparse_prefill_main(t["q"], k_pool, v_pool, t["topk_idx"], r2t, t["slot_ids"], t["cu_seqlens"],
                                    t["seq_lens"], t["prefix_lens"], P)
    assert o.shape == (t["q"].shape[0], HQ, D) and o.dtype == torch.bfloat16
    mt.assert_close(host(o), mt.ref_attention(state.problem(batch))[0])


def test_sglang_decode_20_steps_under_one_cuda_graph(rng):
    """sglang's decode: one plan and page-table buffer per batch size, one captured graph, and before
    each replay update_msa_decode_cg_meta outside the graph. Lengths grow across page boundaries
    (128, 256, 2048); request 2 is graph padding (seq_len 0). No torch op of the update or the decode
    may synchronize with the host (set_sync_debug_mode('error'))."""
    state = m3_state(rng, num_reqs=4, max_context=4096)
    k_pool, v_pool, r2t = device_pools(state)
    B = 5
    slot_ids = [2, 0, 4, 3, 1]  # row 4 of req_to_token is unused
    lens = np.array([120, 250, 0, 2040, 1])
    grow = np.array([1, 1, 0, 1, 1])
    slot_dev = torch.tensor(slot_ids, device=DEV)
    seq_buf = torch.zeros(B, dtype=torch.int64, device=DEV)
    q_buf = torch.zeros(B, HQ, D, dtype=torch.bfloat16, device=DEV)
    topk_buf = torch.full((HKV, B, TOPK), -1, dtype=torch.int32, device=DEV)
    plan = msg.build_msa_decode_cg_plan(HQ, HKV, P, TOPK, B, device=q_buf.device)
    kv_buf = torch.zeros(B * math.ceil(4096 / P), dtype=torch.int32, device=DEV)

    def load(seq_lens):
        batch = state.decode_batch(rng, seq_lens=seq_lens, slot_ids=slot_ids)
        t = st.to_torch(batch, DEV)
        q_buf.copy_(t["q"])
        topk_buf.copy_(t["topk_idx"])
        seq_buf.copy_(torch.from_numpy(seq_lens))
        return batch

    def update():
        msg.update_msa_decode_cg_meta(plan, kv_buf, r2t, slot_dev, seq_buf, P, TOPK, HQ, HKV)

    def decode():
        return msg.msa_sparse_decode_main(q_buf, k_pool, v_pool, topk_buf, r2t, slot_dev, seq_buf, P,
                                          kv_indices=kv_buf, plan=plan)

    load(lens)
    update()
    graph, o_graph = mt.capture_graph(decode)
    for step in range(20):
        lens = lens + grow
        append_tokens(rng, state, k_pool, v_pool, slot_ids, lens, grow)
        batch = load(lens)
        with mt.no_host_sync():
            update()
            graph.replay()
            o_eager = decode()
        assert torch.equal(o_graph, o_eager), f"step {step}: graph replay differs from eager"
        # msa_sparse_decode_main reads kv_buf as the dense [B, max_pages] table (so the page row is
        # prefetched before the PDL wait); through the flat table and kv_page_indptr the bits are the same.
        flat, _ = fmha_sm100(q_buf, msg._paged("t", k_pool, P), msg._paged("t", v_pool, P), plan,
                             kv_indices=kv_buf, kv_block_indexes=topk_buf.permute(1, 0, 2))
        assert torch.equal(o_eager, flat), f"step {step}: the dense page rows differ from the flat table"
        assert not o_graph[2].any(), "the padded request returns o = 0"
        mt.assert_close(host(o_graph), mt.ref_attention(state.problem(batch))[0], what=f"o at step {step}")


def test_fmha_sm100_plan_dict_rewritten_in_place_under_a_graph(rng):
    """fmha_sm100's own decode sequence: a causal plan, kv_indices packed by kv_page_indptr, and the
    dict's kv_segment_lens / kv_segment_offsets / kv_page_indptr / qo_offset rewritten in place (as
    sglang's sync-free update does), read by a captured fmha_sm100 on every replay."""
    state = m3_state(rng, num_reqs=3, max_context=4096)
    k_pool, v_pool, r2t = device_pools(state)
    k_paged = k_pool.view(-1, P, HKV, D).permute(0, 2, 1, 3)
    v_paged = v_pool.view(-1, P, HKV, D).permute(0, 2, 1, 3)
    B, slot_ids = 3, [0, 1, 2]
    lens = np.array([300, 129, 2000])
    plan = fmha_sm100_plan(torch.ones(B, dtype=torch.int32), torch.from_numpy(lens), HQ, num_kv_heads=HKV,
                           page_size=P, kv_block_num=TOPK, causal=True, device=DEV)
    info = plan[3]
    assert info["msa_plan"].plan.phase == "decode"
    q_buf = torch.zeros(B, HQ, D, dtype=torch.bfloat16, device=DEV)
    topk_buf = torch.full((HKV, B, TOPK), -1, dtype=torch.int32, device=DEV)
    kv_buf = torch.zeros(B * 32, dtype=torch.int32, device=DEV)

    def rewrite(seq_lens, positions):
        batch = state.decode_batch(rng, seq_lens=seq_lens, slot_ids=slot_ids)
        batch["prefix_lens"] = positions.astype(np.int32)  # the queries' positions (causal masks)
        t = st.to_torch(batch, DEV)
        q_buf.copy_(t["q"])
        topk_buf.copy_(t["topk_idx"])
        packed = np.concatenate([state.req_to_token[s, :math.ceil(n / P) * P:P] // P
                                 for s, n in zip(slot_ids, seq_lens)])
        kv_buf[:len(packed)].copy_(torch.from_numpy(packed))
        kv = torch.from_numpy(seq_lens.astype(np.int32)).to(DEV)
        info["kv_segment_lens"].copy_(kv)
        torch.cumsum(kv, 0, dtype=torch.int32, out=info["kv_segment_offsets"][1:])
        torch.cumsum((kv + P - 1) // P, 0, dtype=torch.int32, out=info["kv_page_indptr"][1:])
        info["qo_offset"].copy_(torch.from_numpy(positions.astype(np.int32)))
        return batch

    def run():
        o, _ = fmha_sm100(q_buf, k_paged, v_paged, plan, kv_indices=kv_buf,
                          kv_block_indexes=topk_buf.permute(1, 0, 2))
        return o

    rewrite(lens, lens - 1)
    graph, o_graph = mt.capture_graph(run)
    for step in range(5):
        lens = lens + np.array([1, 40, 3])
        positions = lens - 1 - np.array([0, 50, 7])  # queries before the last key: causal masking
        batch = rewrite(lens, positions)
        graph.replay()
        assert torch.equal(o_graph, run()), f"step {step}: graph replay differs from eager"
        mt.assert_close(host(o_graph), mt.ref_attention(state.problem(batch))[0], what=f"o at step {step}")


def test_fmha_sm100_prefill_plan_with_unsorted_rows(rng):
    prob = mt.make_problem(rng, qo_lens=[300, 64, 2], kv_lens=[1000, 2100, 130], num_qo_heads=HQ, num_kv_heads=HKV,
                           head_dim=D, page_size=P, topk=TOPK, slot_major=True, flat_pages=True, index_layout="HTK")
    t = mt.to_torch(prob, device=DEV)
    plan = fmha_sm100_plan(torch.tensor([300, 64, 2]), torch.from_numpy(prob.kv_lens), HQ, num_kv_heads=HKV,
                           page_size=P, kv_block_num=TOPK, device=DEV)
    assert plan[3]["msa_plan"].plan.phase == "prefill"
    o, max_score = fmha_sm100(t["q"], t["k_cache"], t["v_cache"], plan, kv_indices=t["page_table"],
                              kv_block_indexes=t["block_idx"])
    assert max_score is None
    mt.assert_close(host(o), mt.ref_attention(prob)[0])


def test_fmha_sm100_max_score_of_the_indexer(rng):
    """Dense attention with output_maxscore at the indexer's shapes (4 index heads, one K head)."""
    prob = mt.make_problem(rng, qo_lens=[200, 1], kv_lens=[900, 3000], num_qo_heads=4, num_kv_heads=1, head_dim=D,
                           page_size=P, pattern=None, slot_major=True, flat_pages=True)
    t = mt.to_torch(prob, device=DEV)
    plan = fmha_sm100_plan(torch.tensor([200, 1]), torch.from_numpy(prob.kv_lens), 4, num_kv_heads=1, page_size=P,
                           output_maxscore=True, device=DEV)
    o, scores = fmha_sm100(t["q"], t["k_cache"], t["v_cache"], plan, kv_indices=t["page_table"])
    assert scores.shape == (4, plan[3]["max_k_tiles"], 201)
    ref = mt.ref_block_scores(prob.q, prob.k_cache, prob.page_table, prob.page_indptr, prob.qo_indptr, prob.kv_lens,
                              max_blocks=scores.shape[1]).transpose(1, 2, 0)
    got = scores.cpu().numpy()
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-3, atol=2e-2)
    mt.assert_close(host(o), mt.ref_attention(prob)[0])


@pytest.mark.parametrize("layout", ["HKT", "THK"])
def test_sparse_topk_select(rng, layout):
    T, H, K = 64, 4, 256
    nvp = rng.integers(1, K + 1, T)
    s_thk = np.full((T, H, K), -np.inf, np.float32)
    for t in range(T):
        s_thk[t, :, :nvp[t]] = rng.standard_normal((H, nvp[t]))
    scores = s_thk if layout == "THK" else np.ascontiguousarray(s_thk.transpose(1, 2, 0))
    got = sparse_topk_select(torch.from_numpy(scores).to(DEV), TOPK,
                             num_valid_pages=torch.from_numpy(nvp.astype(np.int32)).to(DEV), force_begin_blocks=1,
                             force_end_blocks=1, max_score_layout=layout)
    ref = mt.ref_select_topk(s_thk, np.arange(T + 1), nvp * 128, TOPK, qo_offset=np.zeros(T, np.int64),
                             force_begin=1, force_end=1, causal=False)
    np.testing.assert_array_equal(got.cpu().numpy(), ref)


def test_custom_op_captured_in_a_cuda_graph(rng):
    """torch.ops.msa.attention (what torch.compile records) captured directly, lengths rewritten between replays."""
    state = m3_state(rng, num_reqs=2, max_context=2048)
    k_pool, v_pool, r2t = device_pools(state)
    k_paged = k_pool.view(-1, P, HKV, D).permute(0, 2, 1, 3)
    v_paged = v_pool.view(-1, P, HKV, D).permute(0, 2, 1, 3)
    B, slot_ids = 2, [1, 0]
    handle = torch_ops.PlanHandle(msa.plan_decode(B, 1, 2048, num_qo_heads=HQ, num_kv_heads=HKV, topk=TOPK,
                                                  causal=False, device=DEV))
    q_buf = torch.zeros(B, HQ, D, dtype=torch.bfloat16, device=DEV)
    topk_buf = torch.full((HKV, B, TOPK), -1, dtype=torch.int32, device=DEV)
    kv_lens = torch.zeros(B, dtype=torch.int32, device=DEV)
    table = torch.full((B, 16), -1, dtype=torch.int32, device=DEV)
    qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=DEV)
    slot_dev = torch.tensor(slot_ids, device=DEV)
    out = torch.empty(B, HQ, D, dtype=torch.bfloat16, device=DEV)

    def load(seq_lens):
        batch = state.decode_batch(rng, seq_lens=seq_lens, slot_ids=slot_ids)
        t = st.to_torch(batch, DEV)
        q_buf.copy_(t["q"])
        topk_buf.copy_(t["topk_idx"])
        kv_lens.copy_(t["seq_lens"])
        torch_ops.build_page_table(r2t, slot_dev, kv_lens, P, out=table)
        return batch

    def run():
        torch.ops.msa.attention(handle.handle, q_buf, k_paged, v_paged, table, qo_indptr, kv_lens,
                                topk_buf.permute(1, 0, 2), None, None, out, None, None, False)
        return out

    load(np.array([500, 3]))
    graph, _ = mt.capture_graph(run)
    for seq_lens in ([501, 4], [1000, 129], [2048, 1]):
        batch = load(np.array(seq_lens))
        graph.replay()
        mt.assert_close(host(out), mt.ref_attention(state.problem(batch))[0])


def test_torch_compile_of_the_decode_path(rng):
    torch._dynamo.reset()
    state = m3_state(rng, num_reqs=2, max_context=2048)
    k_pool, v_pool, r2t = device_pools(state)
    batch = state.decode_batch(rng, seq_lens=[1500, 129], slot_ids=[1, 0])
    t = st.to_torch(batch, DEV)
    plan = msg.build_msa_decode_cg_plan(HQ, HKV, P, TOPK, 2, device=DEV)
    kv_indices = torch.zeros(2 * 16, dtype=torch.int32, device=DEV)
    msg.update_msa_decode_cg_meta(plan, kv_indices, r2t, t["slot_ids"], t["seq_lens"], P, TOPK, HQ, HKV)

    def decode(q, topk_idx):
        o = msg.msa_sparse_decode_main(q, k_pool, v_pool, topk_idx, r2t, t["slot_ids"], t["seq_lens"], P,
                                       kv_indices=kv_indices, plan=plan)
        return o.float() * 2

    expect = decode(t["q"], t["topk_idx"])
    got = torch.compile(decode, fullgraph=True)(t["q"], t["topk_idx"])
    assert torch.equal(got, expect)
    mt.assert_close(host(expect) / 2, mt.ref_attention(state.problem(batch))[0])


def fp8_device_pools(state, k_scale, v_scale):
    """state's pools quantized to float8_e4m3fn on the device (slot-major [slots, Hkv, D])."""
    f8 = mt.numpy_dtype("fp8")

    def dev(a, s):
        return torch.from_numpy((a / s).astype(f8).view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)

    return dev(state.k_pool, k_scale), dev(state.v_pool, v_scale)


def mirror_fp8_pools(state, k8, v8, k_scale, v_scale):
    """The reference reads what the device pools hold: their e4m3 values times the scales."""
    f8 = mt.numpy_dtype("fp8")
    state.k_pool = k8.view(torch.uint8).cpu().numpy().view(f8).astype(np.float64) * k_scale
    state.v_pool = v8.view(torch.uint8).cpu().numpy().view(f8).astype(np.float64) * v_scale


def test_sglang_fp8_pools_prefill_and_decode_under_a_graph(rng):
    """sglang with an fp8 KV cache (per-tensor k_scale / v_scale): a prefill chunk after a prefix, then 10 decode
    steps replayed from one graph while each step's new K/V rows are quantized into the pools by msa.write_cache."""
    ks, vs = 0.137, 0.29
    state = m3_state(rng, num_reqs=3, max_context=4096)
    k8, v8 = fp8_device_pools(state, ks, vs)
    mirror_fp8_pools(state, k8, v8, ks, vs)
    r2t = torch.from_numpy(state.req_to_token).to(DEV)
    batch = state.prefill_batch(rng, seq_lens=[700, 1300, 2005], prefix_lens=[0, 1000, 2000], slot_ids=[1, 2, 0])
    t = st.to_torch(batch, DEV)
    o = msg.msa_sparse_prefill_main(t["q"], k8, v8, t["topk_idx"], r2t, t["slot_ids"], t["cu_seqlens"],
                                    t["seq_lens"], t["prefix_lens"], P, k_scale=ks, v_scale=vs)
    ref = mt.scaled_reference(state.problem(batch))[0]
    mt.assert_close(host(o), ref)

    B, slot_ids = 3, [2, 0, 1]
    lens = np.array([300, 129, 2047])
    slot_dev = torch.tensor(slot_ids, device=DEV)
    seq_buf = torch.zeros(B, dtype=torch.int64, device=DEV)
    q_buf = torch.zeros(B, HQ, D, dtype=torch.bfloat16, device=DEV)
    topk_buf = torch.full((HKV, B, TOPK), -1, dtype=torch.int32, device=DEV)
    plan = msg.build_msa_decode_cg_plan(HQ, HKV, P, TOPK, B, device=q_buf.device, is_fp8=True)
    kv_buf = torch.zeros(B * math.ceil(4096 / P), dtype=torch.int32, device=DEV)

    def decode():
        return msg.msa_sparse_decode_main(q_buf, k8, v8, topk_buf, r2t, slot_dev, seq_buf, P, kv_indices=kv_buf,
                                          plan=plan, k_scale=ks, v_scale=vs)

    graph = None
    for step in range(10):
        lens = lens + 1
        new_slots = torch.tensor([int(state.req_to_token[s, n - 1]) for s, n in zip(slot_ids, lens)], device=DEV)
        k_new = torch.randn(B, HKV, D, device=DEV, dtype=torch.bfloat16)
        v_new = torch.randn(B, HKV, D, device=DEV, dtype=torch.bfloat16)
        msa.write_cache(k_new, k8.view(-1, P, HKV, D).permute(0, 2, 1, 3), new_slots, scale=ks)
        msa.write_cache(v_new, v8.view(-1, P, HKV, D).permute(0, 2, 1, 3), new_slots, scale=vs)
        mirror_fp8_pools(state, k8, v8, ks, vs)
        batch = state.decode_batch(rng, seq_lens=lens, slot_ids=slot_ids)
        tb = st.to_torch(batch, DEV)
        q_buf.copy_(tb["q"])
        topk_buf.copy_(tb["topk_idx"])
        seq_buf.copy_(torch.from_numpy(lens))
        msg.update_msa_decode_cg_meta(plan, kv_buf, r2t, slot_dev, seq_buf, P, TOPK, HQ, HKV)
        if graph is None:
            graph, o_graph = mt.capture_graph(decode)
        graph.replay()
        o_eager = decode()
        torch.cuda.synchronize()
        assert torch.equal(o_graph, o_eager), f"step {step}: graph replay differs from eager"
        mt.assert_close(host(o_graph), mt.scaled_reference(state.problem(batch))[0], what=f"o at step {step}")


def test_fmha_sm100_fp8_interleaved_pool(rng):
    """fmha_sm100 with use_fp8_kvcache and the two halves of one interleaved fp8 pool, sparse prefill."""
    prob = mt.make_problem(rng, qo_lens=[64, 9, 130], kv_lens=[900, 300, 1100], num_qo_heads=HQ, num_kv_heads=HKV,
                           head_dim=D, page_size=P, topk=TOPK, pattern="random")
    k8, v8, kd, vd = mt.fp8_kv(prob, 0.137, 0.29, interleaved=True)
    pool = torch.from_numpy(np.ascontiguousarray(k8.base).view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    plan = fmha_sm100_plan(torch.from_numpy(prob.qo_lens), torch.from_numpy(prob.kv_lens), HQ, HKV, page_size=P,
                           kv_block_num=TOPK, use_fp8_kvcache=True,
                           qo_offset=None if prob.qo_offset is None else torch.from_numpy(prob.qo_offset))
    o, _ = fmha_sm100(t["q"], pool[..., :D], pool[..., D:], plan, page_table=t["page_table"], kv_block_indexes=t["block_idx"], k_scale=0.137, v_scale=0.29)
    mt.assert_close(host(o), mt.scaled_reference(prob, kd, vd)[0])
