"""Decode attention benchmark: the D-* workloads of spec/benchmarks.md on msa's CUDA decode kernels.

    PYTHONPATH=build/python python3 bench/decode.py [--quick] [--shape M3-TP1] [--sweep-splits] [--only D-B1,D-B32]
        [--variants 'a:VAR=V;b:VAR=V'] [--floor] [--pool-pages N] [--rotations N]

Workloads (D=128, blocks = pages = 128 tokens, top-16, bf16): D-B{1,8,32,64,128} (B requests of 65536
cached tokens, one query token each), D-mixed (B=64, lengths uniform in [1024, 131072]), D-mtp (B=32,
4 query tokens per request, 65536 tokens), D-mtp16 (16 tokens per request); sparse with the `random`
pattern (own block + 15 random earlier blocks per token and KV head, rows shuffled) and dense (fewer: B=1
and B=64). The `-fp8` rows read an fp8 e4m3 copy of the same pool (per-tensor k_scale = v_scale = 1/64)
and count its bytes (1 per element).

Each call is timed as CUDA-graph replay; the graph holds R >= 8 calls whose inputs (q, page table, block
indexes) are rotated over a KV pool of several GB with random page placement, so that one call does not
find the previous call's blocks in the L2 (60 MB). `us` times replays enqueued back to back (an event pair
around each, one synchronization at the end: each replay starts when the previous one ends, as on a serving
engine's stream, where a layer's call is one of many kernels of a step's graph); `isolated_us` beside it
synchronizes after every replay, so each starts on an idle stream and its calls share the host's launch of
the graph (~7 us on the H200: 3.5 us per call at R = 2, measured as in-graph kernel time 51.0 us against
54.6 us per call at D-B32; ~0.15 us per call at D-B1's R = 43). Effective bandwidth = (bytes of the selected K and V
blocks, each counted once per request and KV head, only their keys below kv_len, + q and o bytes) / time,
against the device-to-device copy ceiling measured in the same run. max_err: largest abs difference of
a few output rows against a float64 computation of the same rows.

Each row is timed on a rested board (at least --cooldown seconds idle, then until nvidia-smi shows no power cap
and a low averaged draw, as bench/prefill.py does: bench/gpu_monitor.py) and records the SM clock seen while it
was timed (sm_mhz, sm_mhz_min, power_capped).

On a build without sm_90a code (MSA_CUDA_ARCH=80-virtual: what an A100, L40S or RTX part runs, measured on the
H200 through PTX) the rows are named msa-portable, carry that path's bars (D-B32 / B64 / B128 >= 0.85 of copy,
bf16 and fp8, M3-TP1), and a run of record is decode-portable.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (add_output_options, ceilings, check_record, environment, main_guard,  # noqa: E402
                    msa_impl_name, parse_variants, row, time_graph, write_results)
from gpu_monitor import GpuMonitor  # noqa: E402

import msa  # noqa: E402

# (Hq, Hkv). GQA8 (not run unless asked): a group of 8 heads, which the general paged kernel serves (the
# token kernel takes G > 8).
SHAPES = {"M3-TP1": (64, 4), "M3-TP4": (16, 1), "GQA8": (32, 4)}
D, P, BLOCK, TOPK = 128, 128, 128, 16
L2_BYTES = 60e6
MIN_ROTATIONS = 8  # calls per graph at least: amortizes the replay's fixed cost (see the docstring)
DEV = "cuda"


@dataclass
class Workload:
    name: str
    batch: int
    qo_len: int
    kv_lens: np.ndarray
    sparse: bool
    bar: str | None  # "ratio>=X" or "us<=X"
    fp8: bool = False  # the fp8 e4m3 copy of the pool (row name + "-fp8")


FP8_SCALE = 1.0 / 64  # k_scale = v_scale of the fp8 pool: the bf16 pool's N(0, 1) values up to 7 sigma


def workloads(quick: bool, rng, portable: bool = False) -> list[Workload]:
    """The D-* workloads with their bars; portable: msa-portable's (D-B32 / B64 / B128 >= 0.85 of copy, bf16
    and fp8)."""
    full = lambda n: np.full(n, 65536, np.int64)  # noqa: E731
    mixed = rng.integers(1024, 131072 + 1, size=64)
    fp8_bars = {"D-B1": "us<=5.5", "D-B32": "ratio>=0.82", "D-B64": "ratio>=0.90", "D-B128": "ratio>=0.95",
                "D-mixed": "ratio>=0.85", "D-mtp": "ratio>=0.85", "D-mtp16": "ratio>=0.80"}
    ws = []
    for fp8 in (False, True):
        ws.append(Workload("D-B1", 1, 1, full(1), True, "us<=6", fp8))
        if not quick:
            ws.append(Workload("D-B8", 8, 1, full(8), True, None, fp8))
        ws += [Workload(f"D-B{b}", b, 1, full(b), True, "ratio>=0.85", fp8) for b in (32, 64, 128)]
        ws.append(Workload("D-mixed", 64, 1, mixed, True, "ratio>=0.80", fp8))
        ws.append(Workload("D-mtp", 32, 4, full(32), True, "ratio>=0.80", fp8))
        ws.append(Workload("D-mtp16", 32, 16, full(32), True, "ratio>=0.80", fp8))
        ws.append(Workload("D-B1", 1, 1, full(1), False, "ratio>=0.80", fp8))
        if not quick:
            ws.append(Workload("D-B64", 64, 1, full(64), False, None, fp8))
    for w in ws:
        if portable:
            w.bar = "ratio>=0.85" if w.sparse and w.name in ("D-B32", "D-B64", "D-B128") else None
        elif w.fp8:
            w.bar = fp8_bars.get(w.name, w.bar) if w.sparse else w.bar
        if w.fp8:
            w.name += "-fp8"
    return ws


def random_selection(pos: torch.Tensor, hkv: int, gen: torch.Generator) -> torch.Tensor:
    """[T, Hkv, TOPK] int32: each token's own block plus up to TOPK-1 random earlier ones, slots shuffled."""
    own = pos // BLOCK
    nb = int(own.max()) + 1
    T = pos.numel()
    scores = torch.rand(T, hkv, nb, device=DEV, generator=gen)
    earlier = torch.arange(nb, device=DEV)[None, None, :] < own[:, None, None]
    scores = torch.where(earlier, scores, torch.full_like(scores, -1.0))
    k = min(TOPK - 1, nb)
    vals, idx = scores.topk(k, dim=-1)
    idx = torch.where(vals >= 0, idx, torch.full_like(idx, -1))
    sel = torch.cat([own[:, None, None].expand(T, hkv, 1), idx], dim=-1)
    if sel.shape[-1] < TOPK:
        sel = torch.cat([sel, torch.full((T, hkv, TOPK - sel.shape[-1]), -1, device=DEV, dtype=sel.dtype)], -1)
    perm = torch.rand(T, hkv, TOPK, device=DEV, generator=gen).argsort(dim=-1)
    return sel.gather(-1, perm).to(torch.int32).contiguous()


class Pool:
    """A paged KV pool [pages, Hkv, P, D] of random bf16 data, shared by the workloads of one shape, and its
    fp8 e4m3 copy (scale FP8_SCALE)."""

    def __init__(self, pages: int, hkv: int, gen: torch.Generator):
        self.pages = pages
        self.k = torch.empty(pages, hkv, P, D, device=DEV, dtype=torch.bfloat16).normal_(generator=gen)
        self.v = torch.empty(pages, hkv, P, D, device=DEV, dtype=torch.bfloat16).normal_(generator=gen)
        self.k8 = (self.k.float() / FP8_SCALE).to(torch.float8_e4m3fn)
        self.v8 = (self.v.float() / FP8_SCALE).to(torch.float8_e4m3fn)

    def kv(self, fp8: bool):
        """(k, v, attention's keyword scales) of the bf16 pool or of its fp8 copy."""
        if fp8:
            return self.k8, self.v8, dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE)
        return self.k, self.v, {}


class Inputs:
    """One rotation's inputs of a workload: q, page table, block indexes, output."""

    def __init__(self, w: Workload, hq: int, hkv: int, pool: Pool, gen: torch.Generator):
        B, n = w.batch, w.qo_len
        self.pool = pool
        self.kv_lens = torch.from_numpy(w.kv_lens.astype(np.int32)).to(DEV)
        self.qo_indptr = torch.arange(0, (B + 1) * n, n, device=DEV, dtype=torch.int32)
        T = B * n
        self.q = torch.empty(T, hq, D, device=DEV, dtype=torch.bfloat16).normal_(generator=gen)
        ppr = math.ceil(int(w.kv_lens.max()) / P)
        perm = torch.randperm(pool.pages, device=DEV, generator=gen)[:B * ppr]
        self.page_table = perm.view(B, ppr).to(torch.int32).contiguous()
        # The same rows as a flat table (kv_page_indptr = b * ppr), the form any page buffer other than
        # sglang's dense [B, max_pages] one takes (--page-table flat).
        self.page_indptr = torch.arange(0, (B + 1) * ppr, ppr, device=DEV, dtype=torch.int32)
        self.pos = (torch.from_numpy(np.repeat(w.kv_lens, n)).to(DEV)
                    - n + torch.arange(n, device=DEV).repeat(B)).to(torch.int64)
        self.block_idx = random_selection(self.pos, hkv, gen) if w.sparse else None
        self.out = torch.empty(T, hq, D, device=DEV, dtype=torch.bfloat16)
        self.fp8 = w.fp8

    def kv_bytes(self, w: Workload, hkv: int) -> int:
        """Bytes of the selected K and V blocks, each once per (request, KV head), keys below kv_len only."""
        kv = w.kv_lens.astype(np.int64)
        elem = 1 if w.fp8 else 2
        if not w.sparse:
            return int(kv.sum()) * hkv * D * elem * 2
        bi = self.block_idx.cpu().numpy().reshape(w.batch, w.qo_len, hkv, TOPK)
        total = 0
        for b in range(w.batch):
            nblk = math.ceil(kv[b] / BLOCK)
            for g in range(hkv):
                blocks = np.unique(bi[b, :, g])
                blocks = blocks[(blocks >= 0) & (blocks < nblk)]
                total += int(np.minimum(BLOCK, kv[b] - blocks * BLOCK).sum())
        return total * D * elem * 2

    def call(self, plan, flat: bool = False):
        table = self.page_table.view(-1) if flat else self.page_table
        k, v, scales = self.pool.kv(self.fp8)
        msa.attention(plan, self.q, k, v, table, self.qo_indptr, self.kv_lens, block_idx=self.block_idx,
                      out=self.out, page_indptr=self.page_indptr if flat else None, **scales)


def check_rows(x: Inputs, w: Workload, hq: int, hkv: int, gen_np) -> float:
    """Largest abs error of a few tokens' outputs (all heads) against float64 (over the dequantized fp8 pool)."""
    G, scale = hq // hkv, D ** -0.5
    T = x.q.shape[0]
    err = 0.0
    bi = x.block_idx.cpu().numpy() if x.block_idx is not None else None
    pos = x.pos.cpu().numpy()
    for t in gen_np.choice(T, size=min(3, T), replace=False):
        b, p = t // w.qo_len, int(pos[t])
        kv = int(w.kv_lens[b])
        hi = min(kv, p + 1)
        for g in range(hkv):
            if bi is None:
                keys = np.arange(hi)
            else:
                blocks = sorted({int(e) for e in bi[t, g] if 0 <= e < math.ceil(kv / BLOCK) and e * BLOCK < hi})
                keys = np.concatenate([np.arange(e * BLOCK, min(e * BLOCK + BLOCK, hi)) for e in blocks])
            keys_t = torch.from_numpy(keys).to(DEV)
            pages = x.page_table[b, keys_t // P].long()
            offs = keys_t % P
            kc, vc, scales = x.pool.kv(x.fp8)
            k = kc[pages, g, offs].double() * scales.get("k_scale", 1.0)
            v = vc[pages, g, offs].double() * scales.get("v_scale", 1.0)
            qh = x.q[t, g * G:(g + 1) * G].double()
            ref = torch.softmax(qh @ k.T * scale, dim=-1) @ v
            err = max(err, float((x.out[t, g * G:(g + 1) * G].double() - ref).abs().max()))
    return err


def floor_rows(w: Workload, shape: str, impl: str, plan, inputs: list, ceil: dict, rows: list):
    """The fixed cost of a call, in pieces: the same plan and graph with every request empty (the kernel
    reads qo_indptr and returns: launch + one device read), then with every selection -1 (block indexes
    read and sorted, the split merge, o = 0 written; no page or K/V read)."""
    import copy
    cases = []
    for x in inputs:
        e = copy.copy(x)
        e.qo_indptr = torch.zeros_like(x.qo_indptr)
        n = copy.copy(x)
        n.block_idx = torch.full_like(x.block_idx, -1)
        cases.append((e, n))
    for tag, k in (("floor-no-token", 0), ("floor-no-block", 1)):
        us = time_graph(None, iters=20, rotate=[(lambda c=c: c[k].call(plan)) for c in cases])
        rows.append(row(w.name, shape, "random", f"{impl}-{tag}", us, ceil=ceil))
        print(f"{w.name:8s} {shape} random {impl}-{tag:14s} {us:8.2f} us", flush=True)


def bench_shape(shape: str, ws: list[Workload], ceil: dict, args, rows: list):
    hq, hkv = SHAPES[shape]
    gen = torch.Generator(device=DEV)
    gen.manual_seed(1234)
    gen_np = np.random.default_rng(5)
    pages = args.pool_pages or max(max(w.batch * math.ceil(int(w.kv_lens.max()) / P) for w in ws), 8192)
    pool = Pool(pages, hkv, gen)
    print(f"# {shape}: Hq={hq} Hkv={hkv}, KV pool {pages} pages ({2 * pool.k.numel() * 2 / 2**30:.1f} GiB bf16, "
          f"and its fp8 copy)", flush=True)
    for w in ws:
        x0 = Inputs(w, hq, hkv, pool, gen)
        per_call = x0.kv_bytes(w, hkv)
        rot = int(min(64, max(MIN_ROTATIONS, math.ceil(3 * L2_BYTES / max(per_call, 1)))))
        distinct = min(args.rotations or rot, rot)  # --rotations: fewer distinct input sets, as many calls
        sets = [x0] + [Inputs(w, hq, hkv, pool, gen) for _ in range(distinct - 1)]
        inputs = [sets[i % distinct] for i in range(rot)]
        kv_bytes = sum(x.kv_bytes(w, hkv) for x in inputs) / rot
        qo_bytes = 2 * w.batch * w.qo_len * hq * D * 2
        pattern = "random" if w.sparse else "dense"
        tables = {"dense": [False], "flat": [True], "both": [False, True]}[args.page_table]
        base = args.impl
        variants = [(f"{base}{'-flat' if flat else ''}{suffix}", 0, env, flat) for suffix, env in args.variants
                    for flat in tables]
        if args.sweep_splits and w.batch <= 32:
            # dense: past 16 splits, the merge kernel (general kernel: clusters of 16, then the workspace)
            counts = (1, 2, 4, 8, 16) if w.sparse else (8, 16, 32, 48, 64, 96, 128, 192, 256)
            variants += [(f"{base}-splits{s}{suffix}", s, env, False) for s in counts if w.batch * s <= 512
                         for suffix, env in args.variants]
        for impl, max_splits, env, flat in variants:
            with environment(env):
                plan = msa.plan_decode(w.batch, w.qo_len, int(w.kv_lens.max()), num_qo_heads=hq, num_kv_heads=hkv,
                                       head_dim=D, page_size=P, topk=TOPK if w.sparse else 0, device=DEV,
                                       max_splits=max_splits)
            rotated = [(lambda x=x: x.call(plan, flat)) for x in inputs]
            torch.cuda.synchronize()
            rest_s = args.monitor.rest(args.cooldown, max(args.cooldown, args.cooldown_max))
            with args.monitor.window() as win:
                us = time_graph(None, iters=args.iters, rotate=rotated, back_to_back=True)
            isolated = time_graph(None, iters=args.iters, rotate=rotated)
            torch.cuda.synchronize()
            err = check_rows(x0, w, hq, hkv, gen_np)
            gbps = (kv_bytes + qo_bytes) / (us * 1e-6) / 1e9
            ratio = gbps / ceil["copy_gbps"]
            meets = None
            # the bars are the M3 shapes' default plans with the dense table; the fp8 rows' bars are M3-TP1's
            # (M3-TP4 fp8 rows are reported)
            default_splits = ("-splits" not in impl and not flat and shape.startswith("M3")
                              and not ((w.fp8 or args.impl != "msa") and shape != "M3-TP1"))
            if w.bar and default_splits:
                kind, _, limit = w.bar.partition(">=") if ">=" in w.bar else w.bar.partition("<=")
                meets = ratio >= float(limit) if kind == "ratio" else us <= float(limit)
            r = row(w.name, shape, pattern, impl, us, gbps=gbps, ceil=ceil, max_err=round(err, 5),
                    bar=w.bar if default_splits else None, meets_bar=meets, rotations=rot, distinct_inputs=distinct,
                    isolated_us=round(isolated, 3), rest_s=round(rest_s, 1), **win.fields(),
                    mib_per_call=round((kv_bytes + qo_bytes) / 2**20, 1), plan=plan.describe())
            rows.append(r)
            clk = f"  {r['sm_mhz']} MHz (capped {r['power_capped']})" if "sm_mhz" in r else ""
            print(f"{w.name:8s} {shape} {pattern:6s} {impl:14s} {us:8.2f} us (isolated {isolated:.2f}) {gbps:7.0f} GB/s ratio {ratio:.3f} "
                  f"err {err:.2e}" + ("" if meets is None else f"  bar {w.bar}: {'met' if meets else 'MISSED'}") + clk,
                  flush=True)
            if args.floor and w.batch == 1 and w.sparse and max_splits == 0:
                floor_rows(w, shape, impl, plan, inputs, ceil, rows)
        del inputs, x0
    del pool
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="M3-TP1 only, the workloads with bars, fewer iterations")
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append", help="restrict to a shape (repeatable)")
    ap.add_argument("--sweep-splits", action="store_true",
                    help="also time max_splits 1/2/4/8/16 at B <= 32 (dense rows: 8 to 256)")
    ap.add_argument("--only", nargs="+", default=None,
                    help="workload names to run, comma- or space-separated (e.g. D-B1,D-mtp or D-B1 D-mtp; "
                         "scripts/device_check.sh turns commas into spaces)")
    ap.add_argument("--page-table", choices=["dense", "flat", "both"], default="dense",
                    help="the page table's form: dense [B, pages] (default), flat with page_indptr (rows 'msa-flat'), "
                         "or both")
    ap.add_argument("--iters", type=int, default=None, help="graph replays timed (default 20 quick, 50 full)")
    ap.add_argument("--variants", help="'NAME:VAR=V,VAR=V;NAME2:...' environment settings read at plan time, one "
                    "msa row each (e.g. 'tok:MSA_PAGED_TOKEN_KERNEL=1;gen:MSA_PAGED_TOKEN_KERNEL=0')")
    ap.add_argument("--pool-pages", type=int, default=None,
                    help="KV pool size in pages (default: the largest workload's need, >= 8192; a small pool "
                         "shows what the address translation of a multi-GB pool costs)")
    ap.add_argument("--rotations", type=int, default=None,
                    help="distinct input sets among the calls of the timed graph (default: all distinct, enough "
                         "calls to overflow the L2 3x; 1: the same inputs in every call, warm in the L2 and the "
                         "TLBs - a diagnostic; the graph keeps its number of calls)")
    ap.add_argument("--floor", action="store_true",
                    help="at B=1 also time the call with no query token and with no selected block (fixed costs)")
    ap.add_argument("--cooldown", type=float, default=0.5, help="least seconds idle before each row")
    ap.add_argument("--cooldown-max", type=float, default=10.0,
                    help="most seconds to wait for the board to rest before each row (0: only --cooldown)")
    add_output_options(ap)
    args = ap.parse_args()
    check_record(ap, args)
    main_guard()
    args.iters = args.iters or (20 if args.quick else 50)
    args.monitor = GpuMonitor()
    args.variants = parse_variants(args.variants)
    shapes = args.shape or (["M3-TP1"] if args.quick else ["M3-TP1", "M3-TP4"])
    ceil = ceilings()
    rows: list = []
    rng = np.random.default_rng(2026)
    args.impl = msa_impl_name()
    ws = workloads(args.quick, rng, portable=args.impl == "msa-portable")
    if args.only:
        names = {n for arg in args.only for n in arg.split(",") if n}
        ws = [w for w in ws if w.name in names]
    for shape in shapes:
        bench_shape(shape, ws, ceil, args, rows)
    write_results("decode" if args.impl == "msa" else "decode-portable", ceil, rows, args.out_dir, record=args.record)


if __name__ == "__main__":
    main()
