"""MiniMax-M3 sparse attention served the way sglang serves it, on msa instead of fmha_sm100.

sglang runs M3's main sparse-attention step through MiniMax's fmha_sm100 (Blackwell only), wrapped by
its minimax_sparse_ops/msa.py. msa offers the same calls, so an engine on Hopper switches by changing
one import, and its decode becomes CUDA-graph safe:

    # from sglang.srt.layers.attention.minimax_sparse_ops.msa import (...)      # fmha_sm100, sm_100 only
    from msa.sglang import (...)                                               # msa, sm_80+ (and CPU)

    # from fmha_sm100 import fmha_sm100, fmha_sm100_plan, sparse_topk_select
    from msa.fmha_sm100 import fmha_sm100, fmha_sm100_plan, sparse_topk_select

This script replays sglang's calling sequence: one prefill batch (a fresh prompt and a chunk after a
cached prefix), then decode steps replayed from one CUDA graph with update_msa_decode_cg_meta between
replays (eagerly on the CPU when no GPU is present), and checks every output against a plain torch
computation of the same sparse attention.

    PYTHONPATH=build/python python3 examples/sglang_style.py
"""
import math

import torch

from msa.sglang import (build_msa_decode_cg_plan, msa_available, msa_sparse_decode_main, msa_sparse_prefill_main,
                        update_msa_decode_cg_meta)

HQ, HKV, D, TOPK, BLOCK = 64, 4, 128, 16, 128  # MiniMax-M3 per GPU at TP1
MAX_CONTEXT = 8192
DEVICE = "cuda" if msa_available() else "cpu"
gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=gen).to(DEVICE, torch.bfloat16)


# sglang's KV bookkeeping: a slot-major pool and, per request row, the slot of every token position.
num_reqs = 3
pages_per_req = MAX_CONTEXT // BLOCK
k_pool, v_pool = randn(num_reqs * pages_per_req * BLOCK, HKV, D), randn(num_reqs * pages_per_req * BLOCK, HKV, D)
pages = torch.randperm(num_reqs * pages_per_req, generator=gen).view(num_reqs, pages_per_req)
pos = torch.arange(MAX_CONTEXT)
req_to_token = (pages[:, pos // BLOCK] * BLOCK + pos % BLOCK).to(DEVICE, torch.int32)


def indexer_topk(positions, seq_lens):
    """Stand-in for M3's lightning indexer: per token and KV head, its own block plus random earlier ones,
    in sglang's layout [Hkv, T, topk] with -1 for empty slots."""
    rows = torch.full((HKV, len(positions), TOPK), -1, dtype=torch.int32)
    for t, (p, n) in enumerate(zip(positions.tolist(), seq_lens.tolist())):
        own = min(p // BLOCK, math.ceil(n / BLOCK) - 1)
        for g in range(HKV):
            earlier = torch.randperm(own, generator=gen)[:TOPK - 1]
            rows[g, t, :len(earlier) + 1] = torch.cat([torch.tensor([own]), earlier]).to(torch.int32)
    return rows.to(DEVICE)


def reference(q, topk_idx, slot_ids, seq_lens, positions, token_req):
    """The same sparse attention, plainly: each query sees the keys <= its position in its selected blocks."""
    q, topk_idx, r2t = q.float().cpu(), topk_idx.cpu(), req_to_token.long().cpu()
    k_host, v_host = k_pool.float().cpu(), v_pool.float().cpu()
    o = torch.zeros(q.shape)
    for t in range(q.shape[0]):
        b = token_req[t]
        slots = r2t[slot_ids[b], :seq_lens[b]]
        for g in range(HKV):
            blocks = [int(x) for x in topk_idx[g, t] if x >= 0]
            keys = torch.cat([torch.arange(x * BLOCK, min((x + 1) * BLOCK, positions[t] + 1)) for x in blocks])
            heads = slice(g * HQ // HKV, (g + 1) * HQ // HKV)
            p = torch.softmax(q[t, heads] @ k_host[slots[keys], g].T / math.sqrt(D), dim=-1)
            o[t, heads] = p @ v_host[slots[keys], g]
    return o


def check(name, o, ref):
    err = (o.float().cpu() - ref).norm() / ref.norm()
    print(f"{name}: relative L2 error {err:.2e}")
    assert err < 1e-2


# Prefill: request 0 is a fresh 700-token prompt, request 1 a 300-token chunk after a 1000-token prefix.
slot_ids = torch.tensor([2, 0], device=DEVICE)
seq_lens = torch.tensor([700, 1300], device=DEVICE)
prefix_lens = torch.tensor([0, 1000], device=DEVICE)
cu_seqlens = torch.tensor([0, 700, 1000], dtype=torch.int32, device=DEVICE)
positions = torch.cat([torch.arange(700), torch.arange(1000, 1300)])
token_req = [0] * 700 + [1] * 300
q = randn(1000, HQ, D)
topk_idx = indexer_topk(positions, torch.tensor([700] * 700 + [1300] * 300))
o = msa_sparse_prefill_main(q, k_pool, v_pool, topk_idx, req_to_token, slot_ids, cu_seqlens, seq_lens, prefix_lens,
                            BLOCK)
check("prefill", o, reference(q, topk_idx, slot_ids.tolist(), seq_lens.tolist(), positions.tolist(), token_req))

# Decode: the engine's persistent per-batch-size plan, page-table buffer and input buffers.
batch = 3
slot_ids = torch.tensor([1, 2, 0], device=DEVICE)
seq_buf = torch.tensor([126, 1301, 4000], device=DEVICE)
q_buf = torch.zeros(batch, HQ, D, dtype=torch.bfloat16, device=DEVICE)
topk_buf = torch.full((HKV, batch, TOPK), -1, dtype=torch.int32, device=DEVICE)
plan = build_msa_decode_cg_plan(HQ, HKV, BLOCK, TOPK, batch, device=torch.device(DEVICE))
kv_indices_buf = torch.zeros(batch * math.ceil(MAX_CONTEXT / BLOCK), dtype=torch.int32, device=DEVICE)


def decode():
    return msa_sparse_decode_main(q_buf, k_pool, v_pool, topk_buf, req_to_token, slot_ids, seq_buf, BLOCK,
                                  kv_indices=kv_indices_buf, plan=plan)


def next_step():
    """The engine's out-of-graph step: new inputs, then the plan and page table rewritten in place."""
    q_buf.copy_(randn(batch, HQ, D))
    topk_buf.copy_(indexer_topk(seq_buf.cpu() - 1, seq_buf.cpu()))
    update_msa_decode_cg_meta(plan, kv_indices_buf, req_to_token, slot_ids, seq_buf, BLOCK, TOPK, HQ, HKV)


next_step()
if DEVICE == "cuda":
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode()  # warm-up, as sglang does before capturing
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_static = decode()
for step in range(5):
    seq_buf += 1
    next_step()
    if DEVICE == "cuda":
        graph.replay()
        o = o_static
    else:
        o = decode()
    lens = seq_buf.tolist()
    ref = reference(q_buf, topk_buf, slot_ids.tolist(), lens, [n - 1 for n in lens], list(range(batch)))
    check(f"decode step {step} (lengths {lens})", o, ref)
print(f"ok ({DEVICE})")
