"""Decode under CUDA graphs: msa.attention captured once and replayed 50 times while the lengths grow, the
pages move and the selections change in place between replays (the plan depends only on limits). Every
replay is bitwise equal to an eager call on the same inputs and within tolerance of the float64
reference. Also the page-table build from sglang's req_to_token captured in the same graph as the
attention that reads it.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_graph.py
"""
import dataclasses
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
B, MAX_QO, MAX_KV = 4, 2, 4096
HQ, HKV, D, TOPK, P = 32, 2, 128, 16, 64
STEPS = 50


class DecodeBuffers:
    """Fixed-address device tensors sized by the plan's limits; each step's problem is copied into them."""

    def __init__(self, topk):
        T = B * MAX_QO
        pages = B * math.ceil(MAX_KV / P) + 8
        bf = torch.bfloat16
        self.q = torch.zeros(T, HQ, D, device=DEV, dtype=bf)
        self.k = torch.zeros(pages, HKV, P, D, device=DEV, dtype=bf)
        self.v = torch.zeros(pages, HKV, P, D, device=DEV, dtype=bf)
        self.page_table = torch.full((B, math.ceil(MAX_KV / P) + 1), -1, device=DEV, dtype=torch.int32)
        self.qo_indptr = torch.zeros(B + 1, device=DEV, dtype=torch.int32)
        self.kv_lens = torch.zeros(B, device=DEV, dtype=torch.int32)
        self.block_idx = torch.full((T, HKV, topk), -1, device=DEV, dtype=torch.int32) if topk else None
        self.out = torch.full((T, HQ, D), float("nan"), device=DEV, dtype=bf)
        self.lse = torch.full((T, HQ), float("nan"), device=DEV)

    def load(self, prob):
        """Copies prob into the buffers in place (stale rows and pages beyond it are left as they are)."""
        t = mt.to_torch(prob, DEV, torch.bfloat16)
        n = t["q"].shape[0]
        self.q[:n].copy_(t["q"])
        self.k[:t["k_cache"].shape[0]].copy_(t["k_cache"])
        self.v[:t["v_cache"].shape[0]].copy_(t["v_cache"])
        self.page_table.fill_(-1)
        self.page_table[:, :t["page_table"].shape[1]].copy_(t["page_table"])
        self.qo_indptr.copy_(t["qo_indptr"])
        self.kv_lens.copy_(t["kv_lens"])
        if self.block_idx is not None:
            self.block_idx.fill_(-1)
            self.block_idx[:n].copy_(t["block_idx"])

    def attention(self, plan, out, lse):
        msa.attention(plan, self.q, self.k, self.v, self.page_table, self.qo_indptr, self.kv_lens,
                      block_idx=self.block_idx, out=out, lse=lse)


def step_lengths(rng, kv_lens):
    qo = rng.integers(1, MAX_QO + 1, size=B)
    kv = np.minimum(kv_lens + qo, MAX_KV)
    return qo, kv


@pytest.mark.parametrize("pattern,split", [("random", {}), ("random", {"fixed_split_blocks": 3}),
                                           ("random", {"max_splits": 1}), (None, {}), ("clustered", {})])
def test_decode_graph_replay(rng, pattern, split):
    topk = TOPK if pattern else 0
    plan = msa.plan_decode(B, MAX_QO, MAX_KV, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=P, topk=topk,
                           device=DEV, **split)
    buf = DecodeBuffers(topk)
    kv_lens = rng.integers(100, 1500, size=B)
    qo, kv_lens = step_lengths(rng, kv_lens)
    buf.load(mt.make_problem(rng, qo_lens=qo, kv_lens=kv_lens, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
                             page_size=P, topk=TOPK, pattern=pattern))
    graph, _ = mt.capture_graph(lambda: buf.attention(plan, buf.out, buf.lse))
    eager_out, eager_lse = torch.empty_like(buf.out), torch.empty_like(buf.lse)
    for step in range(STEPS):
        qo, kv_lens = step_lengths(rng, kv_lens)
        prob = mt.make_problem(rng, qo_lens=qo, kv_lens=kv_lens, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
                               page_size=P, topk=TOPK, pattern=pattern, empty_row_prob=0.05)
        buf.load(prob)  # new lengths, pages (a fresh permutation) and selections, same addresses
        buf.out.fill_(float("nan"))
        buf.lse.fill_(float("nan"))
        graph.replay()
        eager_out.fill_(float("nan"))
        eager_lse.fill_(float("nan"))
        buf.attention(plan, eager_out, eager_lse)
        torch.cuda.synchronize()
        n = int(qo.sum())
        assert torch.equal(buf.out[:n], eager_out[:n]), f"step {step}: replay and eager o differ"
        assert torch.equal(buf.lse[:n], eager_lse[:n]), f"step {step}: replay and eager lse differ"
        o_ref, lse_ref = mt.ref_attention(prob)
        mt.assert_close(buf.out[:n].float().cpu().numpy(), o_ref, what=f"o at step {step}")
        mt.assert_lse_close(buf.lse[:n].cpu().numpy(), lse_ref)


def test_page_table_build_in_graph(rng):
    """sglang's decode step: build the page table from req_to_token and attend through it, one graph."""
    pool_rows, max_context = 6, MAX_KV
    pages_per_row = math.ceil(max_context / P)
    num_pages = B * pages_per_row + 4
    k_np = mt.round_to(rng.standard_normal((num_pages, HKV, P, D)), "bf16")
    v_np = mt.round_to(rng.standard_normal((num_pages, HKV, P, D)), "bf16")
    k, v = (torch.from_numpy(a).to(DEV, torch.bfloat16) for a in (k_np, v_np))
    req_to_token = torch.full((pool_rows, max_context), -1, device=DEV, dtype=torch.int32)
    req_pool_indices = torch.zeros(B, device=DEV, dtype=torch.int64)
    seq_lens = torch.zeros(B, device=DEV, dtype=torch.int32)
    page_table = torch.full((B, pages_per_row), -1, device=DEV, dtype=torch.int32)
    T = B * MAX_QO
    q = torch.zeros(T, HQ, D, device=DEV, dtype=torch.bfloat16)
    qo_indptr = torch.zeros(B + 1, device=DEV, dtype=torch.int32)
    block_idx = torch.full((T, HKV, TOPK), -1, device=DEV, dtype=torch.int32)
    out = torch.full((T, HQ, D), float("nan"), device=DEV, dtype=torch.bfloat16)
    plan = msa.plan_decode(B, MAX_QO, MAX_KV, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=P, topk=TOPK,
                           device=DEV)

    def step():
        msa.build_page_table(req_to_token, req_pool_indices, seq_lens, P, out=page_table)
        msa.attention(plan, q, k, v, page_table, qo_indptr, seq_lens, block_idx=block_idx, out=out)

    def load(seed_lens):
        qo, kv = step_lengths(rng, seed_lens)
        rows = rng.choice(pool_rows, size=B, replace=False)
        perm = rng.permutation(num_pages)[:B * pages_per_row].reshape(B, pages_per_row)  # pages move
        r2t = np.full((pool_rows, max_context), -1, np.int32)
        tok = np.arange(max_context)
        for b in range(B):
            r2t[rows[b]] = perm[b, tok // P] * P + tok % P
        prob = mt.make_problem(rng, qo_lens=qo, kv_lens=kv, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
                               page_size=P, topk=TOPK, pattern="random")
        n = int(qo.sum())
        req_to_token.copy_(torch.from_numpy(r2t))
        req_pool_indices.copy_(torch.from_numpy(rows))
        seq_lens.copy_(torch.from_numpy(kv.astype(np.int32)))
        q[:n].copy_(torch.from_numpy(prob.q).to(torch.bfloat16))
        qo_indptr.copy_(torch.from_numpy(prob.qo_indptr))
        block_idx.fill_(-1)
        block_idx[:n].copy_(torch.from_numpy(np.ascontiguousarray(prob.block_idx)))
        table = msa.build_page_table(r2t, rows.astype(np.int32), kv.astype(np.int32), P, max_pages=pages_per_row)
        ref = dataclasses.replace(prob, k_cache=k_np, v_cache=v_np, page_table=table, page_indptr=None)
        return kv, n, table, ref

    kv_lens, _, _, _ = load(rng.integers(100, 1500, size=B))
    graph, _ = mt.capture_graph(step)
    for s in range(STEPS):
        kv_lens, n, table, ref = load(kv_lens)
        out.fill_(float("nan"))
        page_table.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(page_table.cpu().numpy(), table, err_msg=f"page table at step {s}")
        o_ref, _ = mt.ref_attention(ref)
        mt.assert_close(out[:n].float().cpu().numpy(), o_ref, what=f"o at step {s}")
