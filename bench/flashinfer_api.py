"""msa.flashinfer's entry points beside msa's native calls on the same data: what the FlashInfer drop-in costs
over the native API, host time included.

    PYTHONPATH=build/python python3 bench/flashinfer_api.py [--quick] [--only D-B64,P-chunk] [--iters N]

Data (M3-TP1: Hq 64, Hkv 4, D 128, block = page = 128, top-k 16): an fp8 e4m3 interleaved K/V pool
[pages, 4, 128, 256] as vLLM keeps it (k = pool[..., :128], v = pool[..., 128:], per-tensor
k_global_scale = v_global_scale = 1/64 over N(0, 1) data), fp8 e4m3 index keys [pages, 1, 128, 128] of unit
variance with no scale (FlashInfer's fp8 index keys; msa.block_scores gets the unit per-token scales that the
drop-in passes), 4 index heads, bf16 queries; pages placed by a shuffled page table.
Workloads (row names + "-fp8"): D-B64, D-B1 (decode, 65536 tokens per request), P-chunk (one request, 4096
new tokens after 28672 cached).
Patterns (the call) and impls:
  proxy_score     msa.flashinfer.msa_proxy_score (max_k_tiles and output given)  /  msa.block_scores (HKT)
  topk_select     msa.flashinfer.msa_topk_select (per-token num_valid_pages, the last block forced, on the
                  scores of the proxy call)  /  msa.select_topk (force_end=1)
  attention       decode: msa.flashinfer.msa_sparse_decode_attention; P-chunk: msa_sparse_attention (plans
                  over the host lengths in every call)  /  msa.attention with a plan built outside the timing;
                  the `random` selection (own block + 15 random earlier ones per token and KV head), passed in
                  FlashInfer's layout (Hkv, T, topk) to the drop-in and in msa's (T, Hkv, topk) to msa.attention
  impl msa.flashinfer / msa, each timed two ways (the pattern's suffix):
    eager  each call launched eagerly on an idle stream (an event pair around it, a synchronization after),
           so the time includes the host work before the first kernel; host_us: the host's time alone
           (median, while the GPU is busy, as bench/run_host.py measures it; not for msa_sparse_attention,
           which reads the lengths on the host and so waits for the device)
    graph  decode only (the capturable calls): CUDA-graph replay of 8 calls back to back, us per call
The drop-in rows carry native_us (msa's figure of the same pattern) and over_native_us (the difference), and
max_err against the native call's output on the same inputs (scores: largest abs difference; top-k: rows whose
sets of blocks differ; attention: largest abs difference). Every timed graph and eager loop rotates over 8
input sets (q, page tables, selections) on a 4.5 GB pool, so no call finds the previous one's data in the L2.
gbps (attention and proxy_score): the fp8 bytes that the native call needs (selected K/V blocks once per
request and KV head, q and o; the index keys) / time.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli  # noqa: E402  (bench/cli.py: no torch)

BLOCK = 128
D = 128
TOPK = 16
HQ, HKV = 64, 4           # M3-TP1
INDEX_HEADS = 4           # index queries; one shared index-K head
SHAPE = "M3-TP1"
FP8_SCALE = 1.0 / 64      # k_global_scale = v_global_scale: N(0, 1) values up to 7 sigma within e4m3's 448
ROTATIONS = 8
SUMMARY: list = []  # the drop-in against native, one line per drop-in row, for the .md note
# (workload, batch, query tokens per request, tokens per request)
WORKLOADS = [("D-B64", 64, 1, 65536), ("D-B1", 1, 1, 65536), ("P-chunk", 1, 4096, 32768)]

# torch, bench/common.py, msa and msa.flashinfer are loaded by load_gpu_modules(): the byte counts below and
# --help need none of them.
torch = common = msa = fi = decode = None


# ---- byte counts (no torch) ------------------------------------------------------------------------------------

def token_positions(qo_lens, kv_lens) -> np.ndarray:
    """Absolute position of every query token, right-aligned in its request (kv_len - qo_len + i)."""
    return np.concatenate([np.arange(k - q, k, dtype=np.int64) for q, k in zip(qo_lens, kv_lens)])


def valid_pages(qo_lens, kv_lens) -> np.ndarray:
    """FlashInfer's per-token num_valid_pages under causality: the blocks up to the token's own, int32."""
    return (token_positions(qo_lens, kv_lens) // BLOCK + 1).astype(np.int32)


def selected_kv_bytes(block_idx, qo_lens, kv_lens, *, head_dim: int = D, elem_bytes: int = 1) -> int:
    """Bytes of the selected K and V blocks, each distinct block once per (request, KV head), its keys below
    kv_len. block_idx: int [T, Hkv, topk] in msa's layout, -1 for empty slots."""
    bi = np.asarray(block_idx)
    keys, t0 = 0, 0
    for q, kv in zip(qo_lens, kv_lens):
        rows = bi[t0:t0 + q]
        t0 += q
        nblk = -(-int(kv) // BLOCK)
        for g in range(bi.shape[1]):
            blocks = np.unique(rows[:, g].reshape(-1))
            blocks = blocks[(blocks >= 0) & (blocks < nblk)].astype(np.int64)
            keys += int(np.minimum(BLOCK, kv - blocks * BLOCK).sum())
    return keys * head_dim * elem_bytes * 2


def qo_bytes(tokens: int, *, num_qo_heads: int = HQ, head_dim: int = D, elem_bytes: int = 2) -> int:
    """q and o of an attention call."""
    return 2 * tokens * num_qo_heads * head_dim * elem_bytes


def index_key_bytes(kv_lens, *, dim: int = D, elem_bytes: int = 1) -> int:
    """The index keys a scores call reads: every request's keys below kv_len, one index-K head."""
    return int(np.sum(np.asarray(kv_lens, dtype=np.int64))) * dim * elem_bytes


# ---- GPU part --------------------------------------------------------------------------------------------------

def load_gpu_modules():
    global torch, common, msa, fi, decode
    torch, common = cli.load_torch_and_common("bench/flashinfer_api.py")
    import msa as msa_module
    import msa.flashinfer as fi_module
    import decode as decode_module  # bench/decode.py: the `random` selection
    msa, fi, decode = msa_module, fi_module, decode_module


class Pool:
    """The fp8 interleaved K/V pool [pages, Hkv, 128, 2D] and the fp8 index-K pool [pages, 1, 128, D]."""

    def __init__(self, pages: int, gen, chunk: int = 2048):
        self.pages = pages
        self.kv = torch.empty((pages, HKV, BLOCK, 2 * D), device="cuda", dtype=torch.float8_e4m3fn)
        self.k_index = torch.empty((pages, 1, BLOCK, D), device="cuda", dtype=torch.float8_e4m3fn)
        for i in range(0, pages, chunk):  # in chunks: the fp32 source of the whole pool would be 4x its size
            n = min(chunk, pages - i)
            src = torch.empty((n, HKV, BLOCK, 2 * D), device="cuda").normal_(generator=gen)
            self.kv[i:i + n] = (src / FP8_SCALE).clamp_(-448, 448).to(torch.float8_e4m3fn)
            src = torch.empty((n, 1, BLOCK, D), device="cuda").normal_(generator=gen)
            self.k_index[i:i + n] = src.clamp_(-448, 448).to(torch.float8_e4m3fn)
        self.k, self.v = self.kv[..., :D], self.kv[..., D:]
        # msa.block_scores' per-token scales of the unscaled index keys: the unit tensor the drop-in builds
        self.k_index_scale = torch.ones((1, 1, 1), device="cuda").expand(pages, 1, BLOCK)


class Inputs:
    """One rotation's inputs of a workload and the outputs of both paths."""

    def __init__(self, batch: int, qo_len: int, kv_len: int, pool: Pool, gen):
        T = batch * qo_len
        self.batch, self.qo_len, self.kv_len, self.T = batch, qo_len, kv_len, T
        self.decode = qo_len == 1
        self.pool = pool
        self.nb = math.ceil(kv_len / BLOCK)
        self.q = torch.empty((T, HQ, D), device="cuda", dtype=torch.bfloat16).normal_(generator=gen)
        self.q_index = torch.empty((T, INDEX_HEADS, D), device="cuda", dtype=torch.bfloat16).normal_(generator=gen)
        perm = torch.randperm(pool.pages, device="cuda", generator=gen)[:batch * self.nb]
        self.page_table = perm.view(batch, self.nb).to(torch.int32).contiguous()
        self.qo_indptr = torch.arange(0, T + 1, qo_len, device="cuda", dtype=torch.int32)
        self.kv_lens = torch.full((batch,), kv_len, device="cuda", dtype=torch.int32)
        self.num_valid_pages = torch.from_numpy(valid_pages([qo_len] * batch, [kv_len] * batch)).cuda()
        pos = torch.from_numpy(token_positions([qo_len] * batch, [kv_len] * batch)).cuda()
        self.sel = decode.random_selection(pos, HKV, gen)              # msa's [T, Hkv, topk]
        self.q2k = self.sel.permute(1, 0, 2).contiguous()              # FlashInfer's [Hkv, T, topk]
        self.scores = {impl: torch.empty((INDEX_HEADS, self.nb, T), device="cuda") for impl in ("fi", "msa")}
        self.idx = {impl: torch.empty((T, INDEX_HEADS, TOPK), device="cuda", dtype=torch.int32)
                    for impl in ("fi", "msa")}
        self.out = {impl: torch.empty((T, HQ, D), device="cuda", dtype=torch.bfloat16) for impl in ("fi", "msa")}

    # the drop-in
    def fi_proxy(self):
        p = self.pool
        fi.msa_proxy_score(self.q_index, p.k_index, self.qo_indptr, page_table=self.page_table,
                           seqused_k=self.kv_lens, causal=True, max_k_tiles=self.nb, output=self.scores["fi"])

    def fi_topk(self):
        fi.msa_topk_select(self.scores["fi"], TOPK, num_valid_pages=self.num_valid_pages, output=self.idx["fi"],
                           force_begin_blocks=0, force_end_blocks=1)

    def fi_attention(self):
        p = self.pool
        if self.decode:
            fi.msa_sparse_decode_attention(self.q, p.k, p.v, self.q2k, page_table=self.page_table,
                                           seqused_k=self.kv_lens, seqlen_q=1, causal=True,
                                           k_global_scale=FP8_SCALE, v_global_scale=FP8_SCALE, out=self.out["fi"])
        else:
            fi.msa_sparse_attention(self.q, p.k, p.v, self.q2k, self.qo_indptr, None, True,
                                    page_table=self.page_table, seqused_k=self.kv_lens, k_global_scale=FP8_SCALE,
                                    v_global_scale=FP8_SCALE, out=self.out["fi"])

    # msa's native calls
    def msa_proxy(self):
        p = self.pool
        msa.block_scores(self.q_index, p.k_index, self.page_table, self.qo_indptr, self.kv_lens,
                         k_scale=p.k_index_scale, out=self.scores["msa"], layout="HKT")

    def msa_topk(self):
        msa.select_topk(self.scores["msa"], self.qo_indptr, self.kv_lens, TOPK, layout="HKT", force_begin=0,
                        force_end=1, out=self.idx["msa"])

    def msa_attention(self, plan):
        p = self.pool
        msa.attention(plan, self.q, p.k, p.v, self.page_table, self.qo_indptr, self.kv_lens, block_idx=self.sel,
                      out=self.out["msa"], k_scale=FP8_SCALE, v_scale=FP8_SCALE)

    def errors(self) -> dict:
        """The drop-in's outputs against the native ones (after one call of each)."""
        a, b = self.scores["fi"], self.scores["msa"]
        both = torch.isfinite(a) & torch.isfinite(b)
        scores_err = float("inf") if bool((~both & (a != b)).any()) else \
            float(torch.where(both, (a - b).abs(), torch.zeros_like(a)).max())
        big = torch.iinfo(torch.int32).max
        fi_rows, msa_rows = (torch.where(x >= 0, x, big).sort(-1).values for x in (self.idx["fi"], self.idx["msa"]))
        return {"proxy_score": round(scores_err, 6),
                "topk_select": int((fi_rows != msa_rows).any(-1).sum()),
                "attention": round(float((self.out["fi"].float() - self.out["msa"].float()).abs().max()), 5)}

    def bytes(self) -> dict:
        lens = [self.kv_len] * self.batch
        return {"proxy_score": index_key_bytes(lens),
                "attention": selected_kv_bytes(self.sel.cpu().numpy(), [self.qo_len] * self.batch, lens)
                + qo_bytes(self.T)}


def cycling(calls):
    """One argument-free call that runs the next of `calls` each time (eager loops over the rotations)."""
    it = itertools.cycle(calls)
    return lambda: next(it)()


def bench_workload(name: str, batch: int, qo_len: int, kv_len: int, pool: Pool, ceil: dict, args, gen) -> list:
    inputs = [Inputs(batch, qo_len, kv_len, pool, gen) for _ in range(ROTATIONS)]
    geometry = dict(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=BLOCK, topk=TOPK, device="cuda")
    if qo_len == 1:
        plan = msa.plan_decode(batch, 1, kv_len, **geometry)
    else:
        plan = msa.plan_prefill([qo_len] * batch, [kv_len] * batch, causal=True, **geometry)
    decode_step = qo_len == 1
    for x in inputs:  # the first calls: the drop-in's decode plan is built here; scores for the top-k calls
        x.fi_proxy()
        x.msa_proxy()
        x.fi_topk()
        x.msa_topk()
        x.fi_attention()
        x.msa_attention(plan)
    torch.cuda.synchronize()
    errors = inputs[0].errors()
    per_input = [x.bytes() for x in inputs]
    nbytes = {k: sum(b[k] for b in per_input) / len(per_input) for k in per_input[0]}
    calls = {"proxy_score": ([x.fi_proxy for x in inputs], [x.msa_proxy for x in inputs]),
             "topk_select": ([x.fi_topk for x in inputs], [x.msa_topk for x in inputs]),
             "attention": ([x.fi_attention for x in inputs], [lambda x=x: x.msa_attention(plan) for x in inputs])}
    workload = f"{name}-fp8"
    rows = []
    for call, (fi_calls, msa_calls) in calls.items():
        host_waits = call == "attention" and not decode_step  # msa_sparse_attention reads the lengths
        modes = ["eager"] + (["graph"] if decode_step else [])
        for mode in modes:
            figures, hosts = {}, {}
            for impl, fns in (("msa", msa_calls), ("msa.flashinfer", fi_calls)):
                if mode == "eager":
                    us = common.time_eager(cycling(fns), iters=args.iters, warmup=len(fns))
                    host = None
                    if not (host_waits and impl == "msa.flashinfer"):
                        host = round(common.host_us(cycling(fns), args.reps, sleep_every=25)[0], 2)
                else:
                    us = common.time_graph(None, iters=args.iters, rotate=fns, back_to_back=True)
                    host = None
                figures[impl], hosts[impl] = us, host
                b = nbytes.get(call)
                extra = {}
                if host is not None:
                    extra["host_us"] = host
                if impl == "msa.flashinfer":
                    extra.update(native_us=round(figures["msa"], 2), over_native_us=round(us - figures["msa"], 2))
                    native = figures["msa"]
                    line = f"{workload} {call} {mode}: {us:.2f} us, native {native:.2f} us ({us - native:+.2f})"
                    if host is not None:
                        line += f", host {host} us (native {hosts['msa']} us)"
                    SUMMARY.append(line)
                r = common.row(workload, SHAPE, f"{call} {mode}", impl, us, ceil=ceil,
                               gbps=None if b is None else b / (us * 1e-6) / 1e9,
                               max_err=errors[call] if impl == "msa.flashinfer" else None, **extra)
                rows.append(r)
                print_row(r)
    del inputs, plan
    torch.cuda.empty_cache()
    return rows


def print_row(r: dict):
    cli.print_row(r, [("workload", 12), ("pattern", 18), ("impl", 15)], ("host_us", "over_native_us", "max_err"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations and host repetitions")
    ap.add_argument("--only", nargs="+", default=None,
                    help="workloads to run, comma- or space-separated (D-B64, D-B1, P-chunk)")
    ap.add_argument("--iters", type=int, default=None, help="timed calls or graph replays (default 10 quick, 30)")
    ap.add_argument("--reps", type=int, default=None, help="host-time repetitions (default 50 quick, 200)")
    cli.add_output_options(ap, "flashinfer_api")
    args = ap.parse_args()
    load_gpu_modules()
    common.check_record(ap, args)
    args.iters = args.iters or (10 if args.quick else 30)
    args.reps = args.reps or (50 if args.quick else 200)
    ws = WORKLOADS
    if args.only:
        names = {n for arg in args.only for n in arg.split(",") if n}
        unknown = names - {w[0] for w in WORKLOADS}
        if unknown:
            ap.error(f"--only: unknown workload(s) {sorted(unknown)}")
        ws = [w for w in WORKLOADS if w[0] in names]
    ceil = common.ceilings()
    gen = torch.Generator(device="cuda").manual_seed(1234)
    pages = max(b * math.ceil(kv / BLOCK) for _, b, _, kv in ws)
    pool = Pool(pages, gen)
    print(f"# fp8 pools: K/V {pool.kv.numel() / 2**30:.2f} GiB interleaved, index K "
          f"{pool.k_index.numel() / 2**30:.2f} GiB", flush=True)
    rows = []
    for name, batch, qo_len, kv_len in ws:
        rows += bench_workload(name, batch, qo_len, kv_len, pool, ceil, args, gen)
    note = ("Each msa.flashinfer row's over_native_us is its time less msa's native call of the same pattern; "
            "host_us is the host's time alone (GPU busy). msa_sparse_attention plans over the host lengths in "
            "every call (it reads them from the device), so its eager row has no host_us.\n\n"
            + "".join(f"- {line}\n" for line in SUMMARY))
    common.write_results("flashinfer_api", ceil, rows, args.out_dir, record=args.record, note=note)


if __name__ == "__main__":
    main()
