"""Sequence-sharded indexer and context-parallel layer benchmark (msa.distributed, docs/sharding.md).

    PYTHONPATH=build/python python3 bench/sharded.py [--quick] [--iters N] [--single-gpu]

Rows (workload ids of shared/spec/benchmarks.md, "sharded rows"):
  I-step-D-B64[-fp8]  M3-indexer (4 index heads of D=128, one index-K head, top-k 16, own block forced), B=64,
                      65536 tokens, bench/indexer.py's I-step-D-B64 data (fp8: e4m3 index keys with per-token
                      fp32 scales), score layout THK, CUDA-graph replay of 8 calls on 8 copies of the inputs
                      (back to back), us per call; gbps = index-K bytes the call scans / time.
    ranks=1           the unsharded step: msa.block_scores + msa.select_topk over every block (impl msa).
    ranks=2, ranks=4  one rank's part on one GPU, rank 0 of Shard.round_robin (block g on rank g % N), its
                      index-K pages in a pool of their own (shuffled placement), its DecodeStep built outside
                      the timing (once per forward step in an engine):
                        msa-scan  local_candidates: the scan of 1/N of the sequence and the rank's top-k,
                                  written into slot 0 of the buffer an all-gather fills
                        msa-merge merge_candidates over all N ranks' candidates alone
                        msa       local_candidates + merge_candidates (the other ranks' candidates computed
                                  beforehand): the rank's whole step less the exchange
                      vs_unsharded = us / the ranks=1 us; max_err (msa): rows of the merged selection that
                      differ from the unsharded one; exchange_sent_bytes / exchange_recv_bytes: the candidates
                      one rank sends and receives (T x 4 x 16 x 8 B, from each other rank).
    gpus=2            two GPUs over NCCL (torchrun, two ranks): msa = sharded_indexer (scan, all-gather of the
                      candidates, merge) in a CUDA graph with the collective inside; msa-exchange = the
                      all-gather alone (exchange_candidates) on the same shapes; vs_one_gpu = us / this run's
                      ranks=1 us; max_err (msa): rows differing from the unsharded selection.
  CP-1M-decode-B8     one sparse layer (M3-TP1: Hq 64, Hkv 4, one index head per KV head, bf16) at 1,048,576
  CP-1M-chunk-8K      tokens per request: a B=8 decode step (graph replay, 8 calls back to back) and an
                      8192-token prefill chunk ending the 1M-token context (eager, one request).
    gpus=1            msa.sparse_attention_layer on one GPU (impl msa).
    gpus=2            msa.distributed.sharded_layer over two GPUs, round-robin blocks, each rank's K/V, index
                      keys and page table its own (msa); msa-exchange = the layer's all-gathers alone (the
                      candidates, then the partial o and lse) on the same shapes. speedup = the gpus=1 us /
                      the gpus=2 us. max_err / mismatch_rows: the sharded output (largest abs difference) and
                      selection (rows differing) against the single-GPU layer on the same data.
Bars (spec): ranks=4 msa-scan <= 0.30x the unsharded step; gpus=2 indexer (exchange included) <= 0.60x one
GPU; CP on 2 GPUs >= 1.7x one GPU.

The gpus=2 rows run when two GPUs are visible (not with --single-gpu): this script is started again under
`torchrun --standalone --nproc-per-node 2 ... --worker` with NCCL_NVLS_ENABLE=0; rank 0 writes its rows to a
JSON file that this process reads. Each rank reports its own event times; rank 0's are the rows.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli  # noqa: E402  (bench/cli.py: no torch)

BLOCK = 128            # tokens per block and per page
D = 128                # head dim of q, K, V and of the index keys
TOPK = 16
INDEX_HEADS = 4        # M3-indexer: 4 index heads sharing one index-K head
HQ, HKV = 64, 4        # M3-TP1
CALLS_PER_GRAPH = 8
CANDIDATE_SLOT_BYTES = 8  # (fp32 score, int32 block id) per candidate slot
# (workload, batch, query tokens per request, tokens per request)
INDEXER = ("I-step-D-B64", 64, 65536)
CP_WORKLOADS = [("CP-1M-decode-B8", 8, 1, 1 << 20), ("CP-1M-chunk-8K", 1, 8192, 1 << 20)]
BAR_SCAN_RANKS4 = 0.30   # ranks=4 msa-scan us / ranks=1 us <=
BAR_TWO_GPUS = 0.60      # gpus=2 indexer us / ranks=1 us <=
BAR_CP_SPEEDUP = 1.7     # gpus=1 us / gpus=2 us >=
NOTES: list = []

# torch, bench/common.py, msa and msa.distributed are loaded by load_gpu_modules(): the byte counts below and
# --help need none of them.
torch = common = msa = mdist = indexer = None


# ---- byte counts (no torch) ------------------------------------------------------------------------------------

def owned_blocks(num_blocks: int, world: int = 1, rank: int = 0) -> list:
    """The blocks of a request that rank owns under Shard.round_robin (block g on rank g % world)."""
    return list(range(rank, num_blocks, world))


def index_k_bytes(batch: int, kv_len: int, *, world: int = 1, rank: int = 0, elem_bytes: int = 2,
                  scale_bytes: int = 0, heads: int = 1, dim: int = D) -> int:
    """Index-K bytes one rank scans in a decode step: the keys of its round-robin blocks below kv_len, every
    request of kv_len tokens, heads index-K heads of dim elements plus a per-token scale of scale_bytes."""
    nb = -(-kv_len // BLOCK)
    keys = sum(min(BLOCK, kv_len - g * BLOCK) for g in owned_blocks(nb, world, rank))
    return batch * keys * heads * (dim * elem_bytes + scale_bytes)


def candidate_bytes(tokens: int, heads: int = INDEX_HEADS, topk: int = TOPK) -> int:
    """The candidates one rank sends: (score, global block id) per (token, index head, slot)."""
    return tokens * heads * topk * CANDIDATE_SLOT_BYTES


def partial_bytes(tokens: int, num_qo_heads: int = HQ, head_dim_v: int = D, elem_bytes: int = 2) -> int:
    """One rank's partial attention output of context parallelism: o [T, Hq, Dv] and fp32 lse [T, Hq]."""
    return tokens * num_qo_heads * (head_dim_v * elem_bytes + 4)


def exchange_bytes(world: int, tokens: int, *, heads: int = INDEX_HEADS, topk: int = TOPK, num_qo_heads: int = 0,
                   head_dim_v: int = D, elem_bytes: int = 2) -> dict:
    """Bytes one rank sends and receives in a layer's all-gathers: the candidates, plus the partial (o, lse)
    when num_qo_heads > 0 (context parallelism). An all-gather receives every other rank's part."""
    sent = candidate_bytes(tokens, heads, topk)
    if num_qo_heads:
        sent += partial_bytes(tokens, num_qo_heads, head_dim_v, elem_bytes)
    return {"sent": sent, "received": (world - 1) * sent}


# ---- GPU part --------------------------------------------------------------------------------------------------

def load_gpu_modules():
    global torch, common, msa, mdist, indexer
    torch, common = cli.load_torch_and_common("bench/sharded.py")
    import msa as msa_module
    import msa.distributed as mdist_module
    import indexer as indexer_module  # bench/indexer.py: the I-step-D-B64 data
    msa, mdist, indexer = msa_module, mdist_module, indexer_module


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def compact_pool(table, pools, gen):
    """The pages that a rank's table names, gathered into pools of their own (shuffled placement), and the
    table over them (-1 kept). pools: tensors [pages, ...] sharing the table; copied as bytes (torch's indexing
    kernels may lack e4m3)."""
    valid = table >= 0
    pages = table[valid].long()
    n = pages.numel()
    perm = torch.randperm(n, device=table.device, generator=gen)
    out = []
    for p in pools:
        local = torch.empty((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
        local.view(torch.uint8).index_copy_(0, perm, p.view(torch.uint8).index_select(0, pages))
        out.append(local)
    local_table = torch.full_like(table, -1)
    local_table[valid] = perm.to(torch.int32)
    return out, local_table


def rows_differing(a, b) -> int:
    """Rows of two selections [T, H, k] that differ as sets of blocks."""
    return int((a.sort(-1).values != b.sort(-1).values).any(-1).sum())


def timed_graph(calls, iters: int) -> float:
    return common.time_graph(None, iters=iters, rotate=calls, back_to_back=True)


class IndexerCopy:
    """One copy of the I-step-D-B64 inputs (bench/indexer.py's data): the index-K pool, bf16 or fp8 with
    per-token scales, and its shuffled page table, with the unsharded step's outputs."""

    def __init__(self, seed: int, fp8: bool, q):
        B, kv = INDEXER[1], INDEXER[2]
        k, self.table = indexer.paged_cache(kv, B, seed=seed)
        self.k, self.k_scale = indexer.quantize_fp8(k) if fp8 else (k, None)
        self.q = q
        self.qo_indptr = torch.arange(B + 1, device="cuda", dtype=torch.int32)
        self.kv_lens = i32([kv] * B)
        self.nb = math.ceil(kv / BLOCK)
        self.scores = torch.empty((B, INDEX_HEADS, self.nb), device="cuda")
        self.idx = torch.empty((B, INDEX_HEADS, TOPK), device="cuda", dtype=torch.int32)

    def step(self):
        msa.block_scores(self.q, self.k, self.table, self.qo_indptr, self.kv_lens, k_scale=self.k_scale,
                         out=self.scores, layout="THK")
        msa.select_topk(self.scores, self.qo_indptr, self.kv_lens, TOPK, layout="THK", force_begin=0, force_end=1,
                        out=self.idx)

    def rank_view(self, world: int, rank: int, gen):
        """(DecodeStep, index-K pool, scales) of one rank: its blocks' pages in a pool of their own."""
        B = INDEXER[1]
        shard = mdist.Shard.round_robin(rank, world, B, self.nb, "cuda")
        table = mdist.shard_page_table(self.table, shard, BLOCK)
        pools, local_table = compact_pool(table, [self.k] + ([self.k_scale] if self.k_scale is not None else []), gen)
        step = mdist.DecodeStep(shard, local_table, self.qo_indptr, self.kv_lens, B)
        return step, pools[0], (pools[1] if len(pools) > 1 else None)

    def candidates_of(self, world: int, rank: int):
        """A rank's candidates over the shared pool (untimed: the other ranks' part of the merge input)."""
        B = INDEXER[1]
        shard = mdist.Shard.round_robin(rank, world, B, self.nb, "cuda")
        step = mdist.DecodeStep(shard, mdist.shard_page_table(self.table, shard, BLOCK), self.qo_indptr,
                                self.kv_lens, B)
        return mdist.local_candidates(step, self.q, self.k, TOPK, k_scale=self.k_scale)


class RankPart:
    """Rank 0's part of the sharded step on one copy, for a group of `world` ranks on one GPU."""

    def __init__(self, c: IndexerCopy, world: int, gen):
        self.c, self.world = c, world
        self.step, self.k, self.k_scale = c.rank_view(world, 0, gen)
        others = [c.candidates_of(world, r) for r in range(1, world)]
        B = INDEXER[1]
        # The buffer an all-gather fills: [N, T, H, k] (score bits, id) pairs; rank 0's scan writes slot 0.
        self.recv = torch.empty((world, B, INDEX_HEADS, TOPK, 2), device="cuda", dtype=torch.int32)
        for r, (s, i) in enumerate(others, start=1):
            self.recv[r, ..., 0].copy_(s.view(torch.int32))
            self.recv[r, ..., 1].copy_(i)
        self.idx = torch.empty_like(c.idx)

    def scan(self):
        return mdist.local_candidates(self.step, self.c.q, self.k, TOPK, k_scale=self.k_scale, out=self.recv[0])

    def merge(self):
        c = self.c
        mdist.merge_candidates(self.recv[..., 0].view(torch.float32), self.recv[..., 1], c.qo_indptr, c.kv_lens, TOPK,
                               c.nb, force_begin=0, force_end=1, out=self.idx)

    def step_without_exchange(self):
        self.scan()
        self.merge()


def indexer_rows(ceil: dict, args) -> tuple[list, dict]:
    """The ranks=1/2/4 rows of both kinds and the unsharded us per kind (for the gpus=2 comparison)."""
    rows, unsharded = [], {}
    B, kv = INDEXER[1], INDEXER[2]
    q = torch.randn((B, INDEX_HEADS, D), device="cuda", dtype=torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(7)
    for fp8 in (False, True):
        name = INDEXER[0] + ("-fp8" if fp8 else "")
        elem, scale = (1, 4) if fp8 else (2, 0)
        copies = [IndexerCopy(seed, fp8, q) for seed in range(CALLS_PER_GRAPH)]
        us1 = timed_graph([c.step for c in copies], args.iters)
        unsharded[name] = us1
        nbytes = index_k_bytes(B, kv, elem_bytes=elem, scale_bytes=scale)
        rows.append(common.row(name, "M3-indexer", "ranks=1", "msa", us1, ceil=ceil,
                               gbps=nbytes / (us1 * 1e-6) / 1e9, index_k_bytes=nbytes))
        print_row(rows[-1])
        for world in (2, 4):
            parts = [RankPart(c, world, gen) for c in copies]
            scan_us = timed_graph([p.scan for p in parts], args.iters)
            merge_us = timed_graph([p.merge for p in parts], args.iters)
            us = timed_graph([p.step_without_exchange for p in parts], args.iters)
            copies[0].step()
            parts[0].step_without_exchange()
            bad = rows_differing(parts[0].idx, copies[0].idx)
            nbytes = index_k_bytes(B, kv, world=world, elem_bytes=elem, scale_bytes=scale)
            ex = exchange_bytes(world, B)
            common_fields = dict(index_k_bytes=nbytes, exchange_sent_bytes=ex["sent"],
                                 exchange_recv_bytes=ex["received"])
            scan_extra = dict(vs_unsharded=round(scan_us / us1, 4), **common_fields)
            if world == 4:
                scan_extra.update(bar=f"vs_unsharded<={BAR_SCAN_RANKS4}",
                                  meets_bar=scan_us / us1 <= BAR_SCAN_RANKS4)
            rows.append(common.row(name, "M3-indexer", f"ranks={world}", "msa-scan", scan_us, ceil=ceil,
                                   gbps=nbytes / (scan_us * 1e-6) / 1e9, **scan_extra))
            print_row(rows[-1])
            rows.append(common.row(name, "M3-indexer", f"ranks={world}", "msa-merge", merge_us, ceil=ceil,
                                   vs_unsharded=round(merge_us / us1, 4), **common_fields))
            print_row(rows[-1])
            rows.append(common.row(name, "M3-indexer", f"ranks={world}", "msa", us, ceil=ceil,
                                   gbps=nbytes / (us * 1e-6) / 1e9, max_err=bad, vs_unsharded=round(us / us1, 4),
                                   **common_fields))
            print_row(rows[-1])
            del parts
        del copies
        torch.cuda.empty_cache()
    return rows, unsharded


class CPProblem:
    """One CP workload's global tensors (bf16, unit-variance random, shuffled page table) and the single-GPU
    layer's call on them."""

    def __init__(self, batch: int, qo_len: int, kv_len: int, seed: int = 0):
        self.batch, self.qo_len, self.kv_len = batch, qo_len, kv_len
        self.decode = qo_len == 1
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.nb = math.ceil(kv_len / BLOCK)
        pages = batch * self.nb
        T = batch * qo_len
        self.T = T

        def randn(shape):
            return torch.empty(shape, device="cuda", dtype=torch.bfloat16).normal_(generator=gen)

        self.k = randn((pages, HKV, BLOCK, D))
        self.v = randn((pages, HKV, BLOCK, D))
        self.k_index = randn((pages, 1, BLOCK, D))
        self.q = randn((T, HQ, D))
        self.q_index = randn((T, HKV, D))
        self.table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(batch, self.nb)
        self.qo_indptr = torch.arange(0, T + 1, qo_len, device="cuda", dtype=torch.int32)
        self.kv_lens = i32([kv_len] * batch)
        self.out = torch.empty((T, HQ, D), device="cuda", dtype=torch.bfloat16)
        self.scores = torch.empty((T, HKV, self.nb), device="cuda")
        self.block_idx = torch.empty((T, HKV, TOPK), device="cuda", dtype=torch.int32)
        geometry = dict(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=BLOCK, topk=TOPK, device="cuda")
        if self.decode:
            self.plan = msa.plan_decode(batch, 1, kv_len, **geometry)
        else:
            self.plan = msa.plan_prefill([qo_len] * batch, [kv_len] * batch, causal=True, **geometry)
        self.gen = gen
        torch.cuda.synchronize()
        print(f"# CP B={batch} qo_len={qo_len} kv_len={kv_len}: K/V {2 * self.k.numel() * 2 / 2**30:.1f} GiB bf16",
              flush=True)

    def layer(self):
        msa.sparse_attention_layer(self.plan, self.q, self.k, self.v, self.q_index, self.k_index, self.table,
                                   self.qo_indptr, self.kv_lens, force_begin=0, force_end=1, scores=self.scores,
                                   score_layout="THK", block_idx=self.block_idx, out=self.out)

    def exchange(self, world: int) -> dict:
        return exchange_bytes(world, self.T, heads=HKV, num_qo_heads=HQ)


def time_call(decode: bool, call, iters: int) -> float:
    """Decode: graph replay of CALLS_PER_GRAPH calls back to back, us per call; prefill: eager."""
    if decode:
        return timed_graph([call] * CALLS_PER_GRAPH, iters)
    return common.time_eager(call, iters=max(3, iters // 3), warmup=2)


def cp_one_gpu_rows(ceil: dict, args) -> tuple[list, dict]:
    rows, one = [], {}
    for name, batch, qo_len, kv_len in cp_workloads(args):
        p = CPProblem(batch, qo_len, kv_len)
        us = time_call(p.decode, p.layer, args.iters)
        one[name] = us
        rows.append(common.row(name, "M3-TP1", "gpus=1", "msa", us, ceil=ceil,
                               index_k_bytes=index_k_bytes(batch, kv_len)))
        print_row(rows[-1])
        del p
        torch.cuda.empty_cache()
    return rows, one


def cp_workloads(args) -> list:
    return CP_WORKLOADS[:1] if args.quick else CP_WORKLOADS


# ---- two GPUs: the torchrun worker ------------------------------------------------------------------------------

def all_gather(t):
    """The all-gather of msa.distributed's exchanges: all_gather_into_tensor into the concatenated form."""
    import torch.distributed as tdist
    n = tdist.get_world_size()
    out = t.new_empty((n * t.shape[0], *t.shape[1:]))
    tdist.all_gather_into_tensor(out, t.contiguous())
    return out


def worker_indexer_rows(rank: int, world: int, args) -> list:
    rows = []
    B, kv = INDEXER[1], INDEXER[2]
    q = torch.randn((B, INDEX_HEADS, D), device="cuda", dtype=torch.bfloat16,
                    generator=torch.Generator(device="cuda").manual_seed(3))
    gen = torch.Generator(device="cuda").manual_seed(7 + rank)
    for fp8 in (False, True):
        name = INDEXER[0] + ("-fp8" if fp8 else "")
        elem, scale = (1, 4) if fp8 else (2, 0)
        copies = [IndexerCopy(seed, fp8, q) for seed in range(CALLS_PER_GRAPH)]
        views = [c.rank_view(world, rank, gen) for c in copies]
        idx = [torch.empty_like(c.idx) for c in copies]

        def full(i):
            step, k, ks = views[i]
            mdist.sharded_indexer(None, step, q, k, TOPK, k_scale=ks, force_begin=0, force_end=1, out=idx[i])

        cands = [mdist.local_candidates(v[0], q, v[1], TOPK, k_scale=v[2]) for v in views]
        us = timed_graph([lambda i=i: full(i) for i in range(len(copies))], args.iters)
        ex_us = timed_graph([lambda s=s, c=c: mdist.exchange_candidates(None, s, c) for s, c in cands], args.iters)
        copies[0].step()
        full(0)
        bad = rows_differing(idx[0], copies[0].idx)
        nbytes = index_k_bytes(B, kv, world=world, rank=rank, elem_bytes=elem, scale_bytes=scale)
        ex = exchange_bytes(world, B)
        fields = dict(index_k_bytes=nbytes, exchange_sent_bytes=ex["sent"], exchange_recv_bytes=ex["received"])
        rows.append(common.row(name, "M3-indexer", f"gpus={world}", "msa", us,
                               gbps=nbytes / (us * 1e-6) / 1e9, max_err=bad, **fields))
        rows.append(common.row(name, "M3-indexer", f"gpus={world}", "msa-exchange", ex_us, **fields))
        del copies, views, idx, cands
        torch.cuda.empty_cache()
    return rows


def worker_cp_rows(rank: int, world: int, args) -> list:
    rows = []
    for name, batch, qo_len, kv_len in cp_workloads(args):
        p = CPProblem(batch, qo_len, kv_len)
        p.layer()  # the single-GPU reference on this rank's copy of the data
        ref_out, ref_idx = p.out.clone(), p.block_idx.clone()
        shard = mdist.Shard.round_robin(rank, world, batch, p.nb, "cuda")
        (k, v, k_index), table = compact_pool(mdist.shard_page_table(p.table, shard, BLOCK),
                                              [p.k, p.v, p.k_index], torch.Generator(device="cuda").manual_seed(rank))
        del p.k, p.v, p.k_index, p.scores
        torch.cuda.empty_cache()
        geometry = dict(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=BLOCK, topk=TOPK)
        if p.decode:
            step = mdist.DecodeStep(shard, table, p.qo_indptr, p.kv_lens, p.T)
            plan = step.plan(**geometry)
        else:
            step = mdist.PrefillStep(shard, table, [qo_len] * batch, [kv_len] * batch)
            plan = step.plans(**geometry)
        out = torch.empty_like(p.out)

        def layer():
            mdist.sharded_layer(None, step, plan, p.q, k, v, p.q_index, k_index, TOPK, force_begin=0, force_end=1,
                                out=out)

        cand_s = torch.zeros((p.T, HKV, TOPK), device="cuda")
        cand_i = torch.zeros((p.T, HKV, TOPK), device="cuda", dtype=torch.int32)
        part_o = torch.zeros((p.T, HQ, D), device="cuda", dtype=torch.bfloat16)
        part_lse = torch.zeros((p.T, HQ), device="cuda")

        def exchange():
            mdist.exchange_candidates(None, cand_s, cand_i)
            all_gather(part_o)
            all_gather(part_lse)

        us = time_call(p.decode, layer, args.iters)
        ex_us = time_call(p.decode, exchange, args.iters)
        o, idx = mdist.sharded_layer(None, step, plan, p.q, k, v, p.q_index, k_index, TOPK, force_begin=0,
                                     force_end=1, return_block_idx=True)
        err = float((o.float() - ref_out.float()).abs().max())
        bad = rows_differing(idx, ref_idx)
        ex = p.exchange(world)
        fields = dict(index_k_bytes=index_k_bytes(batch, kv_len, world=world, rank=rank),
                      exchange_sent_bytes=ex["sent"], exchange_recv_bytes=ex["received"])
        rows.append(common.row(name, "M3-TP1", f"gpus={world}", "msa", us, max_err=round(err, 5), mismatch_rows=bad,
                               **fields))
        rows.append(common.row(name, "M3-TP1", f"gpus={world}", "msa-exchange", ex_us, **fields))
        del p, k, v, k_index, step, plan, out, o, idx, ref_out, ref_idx
        torch.cuda.empty_cache()
    return rows


def worker(args):
    """One rank of the gpus=2 rows (started by torchrun); rank 0 writes its rows to args.worker_out."""
    import torch.distributed as tdist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    tdist.init_process_group("nccl")
    torch.manual_seed(0)
    rows = worker_indexer_rows(rank, world, args) + worker_cp_rows(rank, world, args)
    tdist.barrier()
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps({"rows": rows}) + "\n")
    tdist.destroy_process_group()


def two_gpu_rows(ceil: dict, args, unsharded: dict, one_gpu: dict) -> list:
    """The gpus=2 rows: this script under torchrun --worker; bars against this process's one-GPU figures."""
    torch.cuda.empty_cache()
    torchrun = shutil.which("torchrun")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
            "--standalone", "--nproc-per-node", "2", str(Path(__file__).resolve()), "--worker", "--worker-out",
            str(out), "--iters", str(args.iters)] + (["--quick"] if args.quick else [])
        env = dict(os.environ, NCCL_NVLS_ENABLE="0")
        print("# gpus=2: " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, env=env)
        if r.returncode != 0 or not out.is_file():
            NOTES.append(f"gpus=2 rows missing: the torchrun worker exited with status {r.returncode}")
            print("# " + NOTES[-1], flush=True)
            return []
        rows = json.loads(out.read_text())["rows"]
    for r in rows:
        if r.get("gbps") is not None:
            r["ratio"] = round(r["gbps"] / ceil["copy_gbps"], 4)
        if r["impl"] != "msa":
            continue
        if r["workload"] in unsharded:
            vs = r["us"] / unsharded[r["workload"]]
            r.update(vs_one_gpu=round(vs, 4), bar=f"vs_one_gpu<={BAR_TWO_GPUS}", meets_bar=vs <= BAR_TWO_GPUS)
        elif r["workload"] in one_gpu:
            speedup = one_gpu[r["workload"]] / r["us"]
            r.update(speedup=round(speedup, 3), bar=f"speedup>={BAR_CP_SPEEDUP}", meets_bar=speedup >= BAR_CP_SPEEDUP)
    for r in rows:
        print_row(r)
    return rows


def print_row(r: dict):
    cli.print_row(r, [("workload", 18), ("shape", 10), ("pattern", 8), ("impl", 13)],
                  ("vs_unsharded", "vs_one_gpu", "speedup", "max_err", "mismatch_rows", "exchange_recv_bytes",
                   "meets_bar"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations; CP rows for the decode step only")
    ap.add_argument("--iters", type=int, default=None, help="graph replays timed per figure (default 10 quick, 30)")
    ap.add_argument("--single-gpu", action="store_true", help="leave out the gpus=2 rows even with two GPUs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one rank under torchrun
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    cli.add_output_options(ap, "sharded")
    args = ap.parse_args()
    load_gpu_modules()
    if not args.worker:
        common.check_record(ap, args)
    args.iters = args.iters or (10 if args.quick else 30)
    if args.worker:
        worker(args)
        return
    torch.manual_seed(0)
    ceil = common.ceilings()
    rows, unsharded = indexer_rows(ceil, args)
    cp_rows, one_gpu = cp_one_gpu_rows(ceil, args)
    rows += cp_rows
    gpus = torch.cuda.device_count()
    if gpus >= 2 and not args.single_gpu:
        rows += two_gpu_rows(ceil, args, unsharded, one_gpu)
    else:
        NOTES.append(f"gpus=2 rows not run: {gpus} GPU(s) visible" + (", --single-gpu" if args.single_gpu else ""))
        print("# " + NOTES[-1], flush=True)
    note = ("ranks=N rows: rank 0's part on one GPU (msa-scan: local_candidates; msa: + merge_candidates). "
            "gpus=2 rows: rank 0 of two NCCL ranks (msa-exchange: the all-gathers alone)."
            + "".join(f"\n- {line}" for line in NOTES))
    common.write_results("sharded", ceil, rows, args.out_dir, record=args.record, note=note)




if __name__ == "__main__":
    main()
