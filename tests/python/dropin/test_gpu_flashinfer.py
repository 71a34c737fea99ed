"""msa.flashinfer on the GPU in vLLM's MiniMax-M3 calling sequences, at M3's per-GPU shapes (Hq=64, Hkv=4,
D=128, top-16 blocks of 128 tokens, fp8 e4m3 interleaved K/V pool): a mixed decode + chunked-prefill step;
decode and MTP replayed from one CUDA graph with lengths, page tables and selections changing between replays;
the index-score -> top-k -> attention pipeline captured whole, bitwise equal between eager and replay. Every
result is checked against the float64 references of msa_testing.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/dropin/test_gpu_flashinfer.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

import msa_testing as mt  # noqa: E402
from msa import flashinfer as fi  # noqa: E402

pytestmark = pytest.mark.gpu

HQ, HKV, D, TOPK = 64, 4, 128, 16
P = 128
DEV = "cuda"
K_SCALE, V_SCALE = 0.5, 0.25  # vLLM's per-tensor fp8 descales
SCALE = D ** -0.5


class Cache:
    """vLLM's KV cache for one layer: an fp8 [pages, Hkv, 128, 2D] pool (k = [..., :D], v = [..., D:]) and a bf16
    index-key cache [pages, 1, 128, D], with their float64 values for the references."""

    def __init__(self, rng, num_pages):
        f8 = mt.numpy_dtype("fp8")
        self.k8 = (rng.standard_normal((num_pages, HKV, P, D)) / K_SCALE).astype(f8)
        self.v8 = (rng.standard_normal((num_pages, HKV, P, D)) / V_SCALE).astype(f8)
        pool = np.concatenate([self.k8, self.v8], axis=-1)
        self.pool = torch.from_numpy(pool.view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)
        self.k, self.v = self.pool[..., :D], self.pool[..., D:]
        self.k_deq = self.k8.astype(np.float64) * K_SCALE
        self.v_deq = self.v8.astype(np.float64) * V_SCALE
        self.index_k = mt.round_to(rng.standard_normal((num_pages, 1, P, D)), "bf16")
        self.index_k_t = torch.from_numpy(self.index_k).to(DEV, torch.bfloat16)
        self.num_pages = num_pages


def batch(rng, cache, qo_lens, kv_lens, width, hq=HQ):
    """A step's host data: queries, a dense page table of `width` columns (distinct random pages), and each
    token's selection (its own block, forced, plus random earlier blocks; ascending, -1 tail, as msa_topk_select
    writes it)."""
    qo_lens, kv_lens = np.asarray(qo_lens), np.asarray(kv_lens)
    B = len(kv_lens)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    T = int(qo_indptr[-1])
    table = np.full((B, width), -1, np.int32)
    pages = rng.permutation(cache.num_pages)
    for b in range(B):
        n = -(-int(kv_lens[b]) // P)
        table[b, :n], pages = pages[:n], pages[n:]
    sel = np.full((T, HKV, TOPK), -1, np.int32)
    pos = np.concatenate([kv_lens[b] - qo_lens[b] + np.arange(qo_lens[b]) for b in range(B)])
    for t in range(T):
        own = int(pos[t]) // P
        for g in range(HKV):
            others = rng.permutation(own)[:TOPK - 1]
            row = np.sort(np.concatenate([[own], others]))
            sel[t, g, :len(row)] = row
    q = mt.round_to(rng.standard_normal((T, hq, D)), "bf16")
    return dict(q=q, table=table, qo_indptr=qo_indptr, kv_lens=kv_lens.astype(np.int32), sel=sel)


def reference(cache, data):
    prob = mt.Problem(q=data["q"], k_cache=cache.k_deq, v_cache=cache.v_deq, page_table=data["table"],
                      page_indptr=None, qo_indptr=data["qo_indptr"], kv_lens=data["kv_lens"], qo_offset=None,
                      block_idx=data["sel"], num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, head_dim_v=D,
                      page_size=P, topk=TOPK, causal=True, sm_scale=SCALE)
    return mt.ref_attention(prob)


def dev(a, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(a)).to(DEV)
    return t if dtype is None else t.to(dtype)


def host(t):
    return t.float().cpu().numpy()


def test_mixed_step_decode_then_chunked_prefill(rng):
    """vLLM's attend of one step: decode tokens first (msa_sparse_decode_attention, MTP seqlen_q = 2), then the
    prefill requests (msa_sparse_attention: a chunk after a cached prefix, a fresh prompt), fp8 descales folded
    into softmax_scale and v_global_scale, both written into slices of one output."""
    cache = Cache(rng, 64)
    dec = batch(rng, cache, [2, 2, 2], [300, 129, 2000], width=16)
    pre = batch(rng, cache, [700, 333], [1500, 333], width=16)
    nd = dec["q"].shape[0]
    q = dev(np.concatenate([dec["q"], pre["q"]]), torch.bfloat16)
    topk = dev(np.concatenate([dec["sel"], pre["sel"]]))  # token-major, as vLLM's shared buffer
    out = torch.empty_like(q)
    scales = dict(causal=True, softmax_scale=SCALE * K_SCALE, v_global_scale=V_SCALE)
    o = fi.msa_sparse_decode_attention(q[:nd], cache.k, cache.v, topk[:nd].transpose(0, 1).contiguous(),
                                       page_table=dev(dec["table"]), seqused_k=dev(dec["kv_lens"]), seqlen_q=2,
                                       **scales)
    out[:nd].copy_(o)
    o = fi.msa_sparse_attention(q[nd:], cache.k, cache.v, topk[nd:].transpose(0, 1).contiguous(),
                                dev(pre["qo_indptr"]), page_table=dev(pre["table"]), seqused_k=dev(pre["kv_lens"]),
                                **scales)
    out[nd:].copy_(o)
    mt.assert_close(host(out[:nd]), reference(cache, dec)[0], what="decode o")
    mt.assert_close(host(out[nd:]), reference(cache, pre)[0], what="prefill o")


@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_decode_and_mtp_under_a_cuda_graph_with_lengths_changing(rng, seqlen_q):
    """One graph per batch size, captured after an eager warm-up; before each replay new queries, lengths
    (across page boundaries), page tables and selections are copied into the static buffers. Replay equals
    the eager call bitwise and the reference within tolerance."""
    cache = Cache(rng, 160)
    B, width = 8, 16
    steps = [rng.integers(seqlen_q, width * P + 1, B) for _ in range(4)] + [np.array([128, 129, 256, 257, 2047,
                                                                                      2048, 4, 1024])]
    first = batch(rng, cache, [seqlen_q] * B, steps[0], width)
    q, table, seqused, sel = (dev(first["q"], torch.bfloat16), dev(first["table"]), dev(first["kv_lens"]),
                              dev(first["sel"].transpose(1, 0, 2)))
    out = torch.empty_like(q)

    def decode():
        return fi.msa_sparse_decode_attention(q, cache.k, cache.v, sel, page_table=table, seqused_k=seqused,
                                              seqlen_q=seqlen_q, causal=True, softmax_scale=SCALE * K_SCALE,
                                              v_global_scale=V_SCALE, out=out)

    graph, o_graph = mt.capture_graph(decode)
    for step, kv_lens in enumerate(steps):
        data = batch(rng, cache, [seqlen_q] * B, kv_lens, width)
        q.copy_(dev(data["q"], torch.bfloat16))
        table.copy_(dev(data["table"]))
        seqused.copy_(dev(data["kv_lens"]))
        sel.copy_(dev(data["sel"].transpose(1, 0, 2)))
        with mt.no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        replayed = o_graph.clone()
        eager = fi.msa_sparse_decode_attention(q, cache.k, cache.v, sel, page_table=table, seqused_k=seqused,
                                               seqlen_q=seqlen_q, causal=True, softmax_scale=SCALE * K_SCALE,
                                               v_global_scale=V_SCALE)
        assert torch.equal(replayed, eager), f"step {step}: graph replay differs from eager"
        mt.assert_close(host(replayed), reference(cache, data)[0], what=f"o at step {step}")


def test_index_score_topk_attention_pipeline_captured(rng):
    """vLLM's decode layer as one graph: msa_proxy_score over the index cache (4 index heads, one key head) ->
    msa_topk_select with per-token num_valid_pages (position // 128 + 1), a forced sink and local block ->
    msa_sparse_decode_attention (MTP seqlen_q = 2). Replays with new lengths equal eager bitwise; the selection
    follows FlashInfer's rule over the scores, the output the reference over the selection."""
    cache = Cache(rng, 160)
    B, seqlen_q, width = 6, 2, 24
    T = B * seqlen_q
    first = batch(rng, cache, [seqlen_q] * B, [600] * B, width)
    q = dev(first["q"], torch.bfloat16)
    qi = torch.zeros((T, HKV, D), dtype=torch.bfloat16, device=DEV)
    table, seqused = dev(first["table"]), dev(first["kv_lens"])
    cu_q = torch.arange(0, T + 1, seqlen_q, dtype=torch.int32, device=DEV)
    topk_buf = torch.empty((T, HKV, TOPK), dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    state = {}

    def step():
        pos = (seqused - seqlen_q).repeat_interleave(seqlen_q) + torch.arange(seqlen_q, device=DEV).repeat(B)
        nvp = (pos // P + 1).to(torch.int32)
        scores = fi.msa_proxy_score(qi, cache.index_k_t, cu_q, page_table=table, seqused_k=seqused, causal=True,
                                    max_seqlen_q=seqlen_q, max_k_tiles=width)
        fi.msa_topk_select(scores, TOPK, num_valid_pages=nvp, force_begin_blocks=1, force_end_blocks=1,
                           output=topk_buf)
        state["scores"] = scores
        return fi.msa_sparse_decode_attention(q, cache.k, cache.v, topk_buf.transpose(0, 1).contiguous(),
                                              page_table=table, seqused_k=seqused, seqlen_q=seqlen_q, causal=True,
                                              softmax_scale=SCALE * K_SCALE, v_global_scale=V_SCALE, out=out)

    graph, o_graph = mt.capture_graph(step)
    scores_graph = state["scores"]
    for it, kv_lens in enumerate([[600] * B, rng.integers(2, width * P + 1, B), [2, 129, 3000, 128, 256, 2047]]):
        data = batch(rng, cache, [seqlen_q] * B, kv_lens, width)
        q.copy_(dev(data["q"], torch.bfloat16))
        qi.copy_(dev(mt.round_to(rng.standard_normal((T, HKV, D)), "bf16"), torch.bfloat16))
        table.copy_(dev(data["table"]))
        seqused.copy_(dev(data["kv_lens"]))
        graph.replay()
        torch.cuda.synchronize()
        o_rep, sel_rep, sc_rep = o_graph.clone(), topk_buf.clone(), scores_graph.clone()
        o_eager = step()
        torch.cuda.synchronize()
        assert torch.equal(sc_rep, state["scores"]), f"iteration {it}: scores differ"
        assert torch.equal(sel_rep, topk_buf), f"iteration {it}: selection differs"
        assert torch.equal(o_rep, o_eager), f"iteration {it}: output differs"
        qi_h, kl = qi.float().cpu().numpy(), data["kv_lens"]
        ref_scores = mt.ref_block_scores(qi_h, cache.index_k, data["table"], None, data["qo_indptr"], kl,
                                         max_blocks=width).transpose(1, 2, 0)
        got_scores = host(sc_rep)
        finite = np.isfinite(ref_scores)
        assert (np.isfinite(got_scores) == finite).all(), "-inf pattern differs"
        np.testing.assert_allclose(got_scores[finite], ref_scores[finite], rtol=1e-3, atol=1e-2)
        pos = np.concatenate([kl[b] - seqlen_q + np.arange(seqlen_q) for b in range(B)])
        want = mt.flashinfer_topk_reference(got_scores, pos // P + 1, 1, 1, TOPK)
        np.testing.assert_array_equal(sel_rep.cpu().numpy(), want)
        data["sel"] = sel_rep.cpu().numpy()
        mt.assert_close(host(o_rep), reference(cache, data)[0], what=f"o at iteration {it}")


def test_first_capture_without_warm_up_raises(rng):
    cache = Cache(rng, 8)
    fi._decode_plans.clear()
    data = batch(rng, cache, [1, 1, 1], [100, 200, 300], 4)
    q, table, seqused = dev(data["q"], torch.bfloat16), dev(data["table"]), dev(data["kv_lens"])
    sel = dev(data["sel"].transpose(1, 0, 2))
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="eagerly"):
        with torch.cuda.graph(graph):
            fi.msa_sparse_decode_attention(q, cache.k, cache.v, sel, page_table=table, seqused_k=seqused)
