"""MiniMax-M3 sparse attention served the way vLLM serves it through FlashInfer, on msa instead.

vLLM's MiniMax-M3 backend calls flashinfer.msa_ops (Hopper: fp8 K/V, top-16). msa offers the same calls, so
the backend switches by changing one import:

    # from flashinfer.msa_ops import msa_proxy_score, msa_topk_select, msa_sparse_attention, ...
    from msa.flashinfer import msa_proxy_score, msa_topk_select, msa_sparse_attention, msa_sparse_decode_attention

This script runs one layer's step as vLLM does: the indexer (proxy score over the index-key cache, then a
per-token top-k with a forced sink and local block), then the attend (decode tokens through
msa_sparse_decode_attention, a prefill chunk through msa_sparse_attention) over an interleaved fp8 K/V pool,
and checks the outputs against a plain torch computation. On the CPU when no GPU is present.

    PYTHONPATH=build/python python3 examples/vllm_style.py
"""
import torch

import msa
from msa.flashinfer import msa_proxy_score, msa_sparse_attention, msa_sparse_decode_attention, msa_topk_select

HQ, HKV, D, TOPK, P = 64, 4, 128, 16, 128  # MiniMax-M3 per GPU at TP1; pages of 128 tokens
DEVICE = "cuda" if torch.cuda.is_available() and msa.cuda_available() else "cpu"
K_SCALE, V_SCALE = 0.5, 0.25
gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=gen)


# A decode request (1 token after 1000 cached) and a prefill chunk (300 tokens after a 500-token prefix).
q_lens, kv_lens = [1, 300], [1001, 800]
B, width = 2, 8
T = sum(q_lens)
nd = q_lens[0]  # vLLM orders decode tokens first
pages = torch.randperm(B * width, generator=gen).view(B, width).to(torch.int32)
pool = torch.cat([randn(B * width, HKV, P, D) / K_SCALE, randn(B * width, HKV, P, D) / V_SCALE], dim=-1)
pool = pool.to(torch.float8_e4m3fn).to(DEVICE)  # vLLM's interleaved fp8 K/V cache
k_cache, v_cache = pool[..., :D], pool[..., D:]
index_k = randn(B * width, 1, P, D).to(torch.bfloat16).to(DEVICE)  # the indexer's key cache, one head
q = randn(T, HQ, D).to(torch.bfloat16).to(DEVICE)
index_q = randn(T, HKV, D).to(torch.bfloat16).to(DEVICE)
cu_q = torch.tensor([0, q_lens[0], T], dtype=torch.int32, device=DEVICE)
seq_lens = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
page_table = pages.to(DEVICE)
positions = torch.cat([torch.arange(n - m, n) for m, n in zip(q_lens, kv_lens)]).to(DEVICE)

# The indexer: block scores of every token and index head, then its top-16 blocks.
scores = msa_proxy_score(index_q, index_k, cu_q, page_table=page_table, seqused_k=seq_lens, causal=True,
                         max_seqlen_q=max(q_lens), max_k_tiles=width)
topk = msa_topk_select(scores, TOPK, num_valid_pages=(positions // P + 1).to(torch.int32), force_begin_blocks=1,
                       force_end_blocks=1)  # (T, Hkv, 16), ascending, -1 tail

# The attend: fp8 descales folded as vLLM folds them.
out = torch.empty_like(q)
scales = dict(causal=True, softmax_scale=D ** -0.5 * K_SCALE, v_global_scale=V_SCALE)
out[:nd] = msa_sparse_decode_attention(q[:nd], k_cache, v_cache, topk[:nd].transpose(0, 1).contiguous(),
                                       page_table=page_table[:1], seqused_k=seq_lens[:1], seqlen_q=1, **scales)
out[nd:] = msa_sparse_attention(q[nd:], k_cache, v_cache, topk[nd:].transpose(0, 1).contiguous(), cu_q[1:] - nd,
                                page_table=page_table[1:], seqused_k=seq_lens[1:], **scales)

# A plain torch computation of the same attention over the selected blocks.
keys = k_cache.float()[page_table.long()].permute(0, 2, 1, 3, 4).reshape(B, HKV, width * P, D) * K_SCALE
vals = v_cache.float()[page_table.long()].permute(0, 2, 1, 3, 4).reshape(B, HKV, width * P, D) * V_SCALE
req = torch.repeat_interleave(torch.arange(B, device=DEVICE), torch.tensor(q_lens, device=DEVICE))
worst = 0.0
for t in range(T):
    b, p = int(req[t]), int(positions[t])
    for g in range(HKV):
        blocks = topk[t, g][topk[t, g] >= 0].long()
        idx = (blocks[:, None] * P + torch.arange(P, device=DEVICE)).flatten()
        idx = idx[idx <= p]
        qh = q[t, g * HQ // HKV:(g + 1) * HQ // HKV].float()
        w = torch.softmax(qh @ keys[b, g, idx].T * D ** -0.5, dim=-1)
        worst = max(worst, float((w @ vals[b, g, idx] - out[t, g * HQ // HKV:(g + 1) * HQ // HKV].float()).abs().max()))
print(f"msa.flashinfer on {DEVICE}: {T} tokens, max |o - torch| = {worst:.2e}")
assert worst < 2e-2
