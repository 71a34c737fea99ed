"""Prefill attention benchmark: the P-* workloads of spec/benchmarks.md on msa's Hopper prefill kernels,
with the peers and the ceilings measured in the same run.

    PYTHONPATH=build/python python3 bench/prefill.py [--quick] [--shape M3-TP1] [--workload P-32K]

Workloads (one request, D=128, blocks = pages = 128 tokens, top-16, bf16; `-fp8` rows read an e4m3 copy of the
cache, per-tensor scales 1/64, and carry vs_bf16 = the bf16 row's time over theirs): P-32K (32768 tokens, no
prefix), P-chunk (4096 new tokens after 28672 cached), P-128K (8192 new after 122880 cached); shapes
M3-TP1 (Hq=64, Hkv=4) and M3-TP4 (Hq=16, Hkv=1). Selections (every row holds the token's own block, rows
shuffled): `random` (15 uniformly random earlier blocks per token and KV head), `clustered` (block 0 and
14 drawn from a pool of 24 earlier blocks fixed per 128-token query block and KV head), `shared` (15 earlier
blocks per query block and KV head, the same for all its tokens).

msa rows are timed as CUDA-graph replay (run() only launches: ~10 launches and their host work, ~140 us a
call when eager, are what a serving engine replays from a graph); eager_us beside them includes that host
work. Peers are timed eagerly (one launch each). Every row's `us` is do_bench's method (common.time_flushed):
a 256 MiB memset evicts the L2 before each call and the calls are enqueued back to back, so a call starts
when the GPU reaches it and its inputs come from HBM; `isolated_us` beside it is the older method (synchronize
after every call: each call starts on an idle stream and pays the host's launch latency, ~8 us for a prefill
graph, with the inputs of the last call still in the L2; 0.5% of a P-32K call, 5% of an M3-TP4 P-chunk one). Each timed configuration starts on a rested board: at
least --cooldown seconds idle (default 2), then until nvidia-smi shows no power cap and an averaged draw
under 150 W (at most --cooldown-max, default 20 s; bench/gpu_monitor.py). The board's power limiter averages
the draw over about a second, and a row timed right after a capped one, or over ~1 s, runs at ~1700 instead of
1980 MHz (P-chunk `random` 241 against 253 after P-32K dense; P-32K `shared` 523.6 against 556.7 over 100
timed calls instead of 10). Each row records
the SM clock seen while it was timed (sm_mhz: median of 20 ms samples, sm_mhz_min) and the share of those
samples under the software power cap (power_capped); rows of 30 ms calls (dense P-32K, msa and cuDNN) reach the
cap within their own timing.

Rows: msa (default decomposition, chosen per tile on the device), msa-qmajor / msa-kvmajor (forced through
MSA_SM90_PREFILL; not with --quick), msa-dense (dense causal paged), cudnn-sdpa (torch SDPA, cuDNN backend,
dense causal on the same shapes; for a chunk after a prefix the causal mask is bottom-right aligned, and
the row names the backend that accepted it), flex (FlexAttention with the block mask of the `shared`
selection, own block causal). On a build without sm_90a code (MSA_CUDA_ARCH=80-virtual: the portable family,
what an A100, L40S or RTX part runs) the msa rows are named msa-portable (modes through MSA_PORTABLE_PREFILL;
on a build with sm_90a code, MSA_PORTABLE_PREFILL=qmajor or kvmajor in the environment names them so too, with
--modes qmajor and / or kvmajor: an auto row would run the Hopper kernels, and is refused),
the dense peers include sdpa-flash (the flash backend: FlashAttention-2's kernels; vs_sdpa_flash = its time
over the msa row's), and a run of record is prefill-portable. Effective TFLOP/s = 4 * D * (attended (query head, key) pairs) / time, the
pairs counted exactly from the selections on the GPU. ratio = TFLOP/s over the 8192^3 bf16 matmul of the
same run. max_err: largest abs difference against an fp32 computation of sampled rows (sparse), or against
the cuDNN output (dense).

Experiments (one process, one set of ceilings):
  --variants 'NAME:VAR=V,VAR=V;NAME2:...'  repeat every msa row with these environment settings (read at
                                           plan time, docs/knobs.md: MSA_SM90_KV_WINDOW_TILES, ...); rows are
                                           named msa[NAME] / msa-qmajor[NAME] ...
  --modes auto,qmajor,kvmajor              decompositions timed per sparse pattern (default: auto, or all
                                           three without --quick)
  --patterns dense,random,shared           patterns to run (default: dense and the three sparse ones)
  --no-peers                               skip cuDNN SDPA and FlexAttention
  --flex all|none|SHAPE:WORKLOAD,...       cases where FlexAttention runs (a compile of ~20 s each)
  --profile                                per-kernel device time of each msa row (torch.profiler), in the
                                           row as kernels_us and printed
  --timeline                               the kernels of one graph replay of each msa row in start order
                                           (stream, start and end in us from the first kernel's start), in
                                           the row as timeline and printed: where a short call's time goes
  --once                                   one call of each selected msa row, no timing (for ncu -k ...)
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import inspect
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (LAST_TIMES, add_output_options, capture_graph, ceilings, check_record,  # noqa: E402
                    environment, flush_buffer, main_guard, msa_impl_name, parse_variants, row, time_eager, time_flushed,
                    time_graph, write_results)
from gpu_monitor import GpuMonitor  # noqa: E402

import msa  # noqa: E402

SHAPES = {"M3-TP1": (64, 4), "M3-TP4": (16, 1)}          # (Hq, Hkv)
WORKLOADS = {"P-32K": (32768, 32768), "P-chunk": (4096, 32768), "P-128K": (8192, 131072)}  # (qo_len, kv_len)
BARS = {"random": 250.0, "clustered": 450.0, "shared": 550.0}  # TFLOP/s on P-32K and P-chunk
PORTABLE_BARS = {"random": 175.0, "clustered": 200.0, "shared": 300.0}  # msa-portable rows (2x the Triton path)
D, BLOCK, TOPK = 128, 128, 16
FP8_SCALE = 1.0 / 64  # k_scale = v_scale of the -fp8 rows' e4m3 copy of the cache (N(0, 1) values up to 7 sigma)
POOL, POOL_PICKS = 24, 14
DEV = "cuda"


# ---- data ------------------------------------------------------------------------------------------

class Case:
    """One request: q [T, Hq, D]; K/V both linear [1, Hkv, S, D] (for the peers) and paged
    [pages, Hkv, 128, D] in a shuffled page order (for msa)."""

    def __init__(self, qo_len: int, kv_len: int, hq: int, hkv: int, gen: torch.Generator):
        self.T, self.S, self.hq, self.hkv, self.G = qo_len, kv_len, hq, hkv, hq // hkv
        self.offset = kv_len - qo_len
        self.scale = D ** -0.5
        bf = torch.bfloat16
        self.q = torch.randn(qo_len, hq, D, device=DEV, dtype=bf, generator=gen)
        self.k_lin = torch.randn(1, hkv, kv_len, D, device=DEV, dtype=bf, generator=gen)
        self.v_lin = torch.randn(1, hkv, kv_len, D, device=DEV, dtype=bf, generator=gen)
        pages = math.ceil(kv_len / BLOCK)
        perm = torch.randperm(pages, device=DEV, generator=gen)
        pad = pages * BLOCK - kv_len

        def paged(x):
            x = F.pad(x[0], (0, 0, 0, pad)).view(hkv, pages, BLOCK, D).permute(1, 0, 2, 3)
            out = torch.empty_like(x)
            out[perm] = x
            return out.contiguous()

        self.k_cache, self.v_cache = paged(self.k_lin), paged(self.v_lin)
        # The fp8 e4m3 copy of the cache (per-tensor scale FP8_SCALE) for the -fp8 rows, and its dequantized
        # values (linear) for their max_err.
        self.k8, self.v8 = (self.k_cache.float() / FP8_SCALE).to(torch.float8_e4m3fn), \
            (self.v_cache.float() / FP8_SCALE).to(torch.float8_e4m3fn)
        self.k_lin8 = ((self.k_lin.float() / FP8_SCALE).to(torch.float8_e4m3fn).float() * FP8_SCALE)
        self.v_lin8 = ((self.v_lin.float() / FP8_SCALE).to(torch.float8_e4m3fn).float() * FP8_SCALE)
        self.page_table = perm.to(torch.int32).view(1, pages).contiguous()
        self.qo_indptr = torch.tensor([0, qo_len], device=DEV, dtype=torch.int32)
        self.kv_lens = torch.tensor([kv_len], device=DEV, dtype=torch.int32)
        self.pos = torch.arange(qo_len, device=DEV) + self.offset

    def q_bhsd(self):
        return self.q.permute(1, 0, 2).unsqueeze(0)  # [1, Hq, T, D] (a view)


def _pad_slots(x: torch.Tensor, width: int) -> torch.Tensor:
    if x.shape[-1] >= width:
        return x[..., :width]
    return torch.cat([x, torch.full((*x.shape[:-1], width - x.shape[-1]), -1, device=DEV, dtype=x.dtype)], -1)


def _pick(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indexes of the k largest scores, -1 where the score is negative (not a candidate)."""
    k = min(k, scores.shape[-1])
    vals, idx = scores.topk(k, dim=-1)
    return torch.where(vals >= 0, idx, torch.full_like(idx, -1))


def selections(pattern: str, c: Case, gen: torch.Generator) -> torch.Tensor:
    """[T, Hkv, TOPK] int32, rows shuffled, -1 in unused slots."""
    own = c.pos // BLOCK                       # [T]
    nqb = int(own.max()) + 1
    blocks = torch.arange(nqb, device=DEV)
    T, H = c.T, c.hkv
    if pattern == "random":
        sc = torch.rand(T, H, nqb, device=DEV, generator=gen)
        sc = sc.masked_fill(blocks[None, None, :] >= own[:, None, None], -1.0)
        others = _pad_slots(_pick(sc, TOPK - 1), TOPK - 1)
    elif pattern in ("clustered", "shared"):
        qbs = torch.arange(nqb, device=DEV)
        sc = torch.rand(nqb, H, nqb, device=DEV, generator=gen)
        earlier = blocks[None, None, :] < qbs[:, None, None]
        if pattern == "clustered":
            pool = _pad_slots(_pick(sc.masked_fill(~earlier | (blocks == 0)[None, None, :], -1.0), POOL), POOL)
            tp = pool[own]                                               # [T, H, POOL]
            pick = torch.rand(T, H, POOL, device=DEV, generator=gen).masked_fill(tp < 0, -1.0)
            idx = _pick(pick, POOL_PICKS)
            chosen = torch.where(idx >= 0, tp.gather(-1, idx.clamp(min=0)), torch.full_like(idx, -1))
            zero = torch.where(own > 0, 0, -1)[:, None, None].expand(T, H, 1)
            others = _pad_slots(torch.cat([zero, chosen], -1), TOPK - 1)
        else:
            per_qb = _pad_slots(_pick(sc.masked_fill(~earlier, -1.0), TOPK - 1), TOPK - 1)
            others = per_qb[own]
    else:
        raise ValueError(pattern)
    sel = torch.cat([own[:, None, None].expand(T, H, 1), others.to(own.dtype)], -1)
    perm = torch.rand(T, H, TOPK, device=DEV, generator=gen).argsort(dim=-1)
    return sel.gather(-1, perm).to(torch.int32).contiguous()


def sparse_pairs(sel: torch.Tensor, c: Case) -> int:
    """Attended (query head, key) pairs: per valid slot, the keys of the block at or before the position."""
    pos = c.pos[:, None, None].to(torch.int64)
    e = sel.to(torch.int64)
    keys = (pos + 1 - e * BLOCK).clamp(0, BLOCK)
    keys = torch.where((e >= 0) & (e * BLOCK < c.S), keys, torch.zeros_like(keys))
    return int(keys.sum().item()) * c.G


def dense_pairs(c: Case) -> int:
    return int((c.pos + 1).clamp(max=c.S).sum().item()) * c.hq


# ---- msa -------------------------------------------------------------------------------------------

def msa_runner(c: Case, sel: torch.Tensor | None, mode: str = "auto", env: dict | None = None, fp8: bool = False):
    knob = "MSA_SM90_PREFILL" if msa_impl_name() == "msa" else "MSA_PORTABLE_PREFILL"  # the family's decomposition
    with environment({knob: mode, **(env or {})}):
        plan = msa.plan_prefill([c.T], [c.S], num_qo_heads=c.hq, num_kv_heads=c.hkv, head_dim=D, page_size=BLOCK,
                                topk=TOPK if sel is not None else 0, causal=True, device=DEV)
    out = torch.empty_like(c.q)
    k, v, scales = (c.k8, c.v8, dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE)) if fp8 else (c.k_cache, c.v_cache, {})

    def call():
        msa.attention(plan, c.q, k, v, c.page_table, c.qo_indptr, c.kv_lens, block_idx=sel, out=out,
                      sm_scale=c.scale, **scales)

    call.plan = plan.describe()  # recorded in the JSON rows: which kernels served the call
    return call, out


def sparse_max_err(c: Case, sel: torch.Tensor, out: torch.Tensor, gen: torch.Generator, n: int = 16,
                   fp8: bool = False) -> float:
    """Largest abs error of n sampled tokens' rows against fp32 attention over their selected keys (the
    dequantized fp8 cache for fp8 rows)."""
    toks = torch.randint(0, c.T, (n,), device=DEV, generator=gen)
    e = sel[toks].to(torch.int64)                                          # [n, H, K]
    keys = e[..., None] * BLOCK + torch.arange(BLOCK, device=DEV)          # [n, H, K, 128]
    ok = (e[..., None] >= 0) & (keys <= c.pos[toks][:, None, None, None]) & (keys < c.S)
    keys = keys.clamp(0, c.S - 1).flatten(2)                               # [n, H, K*128]
    ok = ok.flatten(2)
    h = torch.arange(c.hkv, device=DEV)[None, :, None]
    k = (c.k_lin8 if fp8 else c.k_lin)[0][h, keys].float()                # [n, H, L, D]
    v = (c.v_lin8 if fp8 else c.v_lin)[0][h, keys].float()
    q = c.q[toks].float().view(n, c.hkv, c.G, D)
    s = torch.einsum("nhgd,nhld->nhgl", q, k) * c.scale
    s = s.masked_fill(~ok[:, :, None, :], float("-inf"))
    ref = torch.einsum("nhgl,nhld->nhgd", torch.softmax(s, -1), v).reshape(n, c.hq, D)
    return float((out[toks].float() - ref).abs().max().item())


# ---- peers -----------------------------------------------------------------------------------------

def sdpa_runner(c: Case, flash_only: bool = False):
    """Dense causal SDPA on the cuDNN backend (flash_only: on the flash backend); (callable, output [1, Hq, T, D],
    impl name) or raises. T < S needs a bottom-right aligned causal mask: tried on cuDNN, then on the flash backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = c.q_bhsd().contiguous(), c.k_lin, c.v_lin
    attempts = []
    if c.T == c.S:
        attempts.append(("cudnn-sdpa", SDPBackend.CUDNN_ATTENTION, dict(is_causal=True)))
        attempts.append(("sdpa-flash", SDPBackend.FLASH_ATTENTION, dict(is_causal=True)))
    else:
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(c.T, c.S)
        attempts += [("cudnn-sdpa", SDPBackend.CUDNN_ATTENTION, dict(attn_mask=bias)),
                     ("sdpa-flash", SDPBackend.FLASH_ATTENTION, dict(attn_mask=bias))]
    if flash_only:
        attempts = [a for a in attempts if a[0] == "sdpa-flash"]
    elif c.T == c.S:
        attempts = attempts[:1]
    errors = []
    for name, backend, kw in attempts:
        for gqa in (True, False):
            kk, vv = (k, v) if gqa else (k.repeat_interleave(c.G, 1), v.repeat_interleave(c.G, 1))
            extra = dict(enable_gqa=True) if gqa else {}

            def call(backend=backend, kw=kw, kk=kk, vv=vv, extra=extra):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, kk, vv, scale=c.scale, **kw, **extra)

            try:
                o = call()
                torch.cuda.synchronize()
                return call, o, name
            except Exception as e:  # noqa: BLE001 (a backend refusing the shape: try the next)
                errors.append(f"{name}{'' if gqa else ' (expanded K/V)'}: {type(e).__name__}: {str(e)[:120]}")
    raise RuntimeError("; ".join(errors))


def flex_runner(c: Case, sel: torch.Tensor):
    """FlexAttention with the block mask of a `shared` selection: the earlier blocks full, the own block
    causal. Requires the chunk to start on a block boundary (it does for every P-* workload)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    assert c.offset % BLOCK == 0
    nq, nk = math.ceil(c.T / BLOCK), math.ceil(c.S / BLOCK)
    first = sel[::BLOCK].to(torch.int64)                                   # [nq, Hkv, K]: one row per q block
    own = (c.pos[::BLOCK] // BLOCK)[:, None, None]
    full = torch.where((first >= 0) & (first < own), first, torch.full_like(first, nk))
    full = full.sort(dim=-1).values                                        # valid ones first, nk = none
    full_num = (full < nk).sum(-1)                                         # [nq, Hkv]
    full_idx = torch.zeros(nq, c.hkv, nk, device=DEV, dtype=torch.int64)
    full_idx[..., :TOPK] = full.clamp(max=nk - 1)
    part_idx = torch.zeros(nq, c.hkv, nk, device=DEV, dtype=torch.int64)
    part_idx[..., 0] = own[:, :, 0]

    def per_head(x):  # [nq, Hkv, ...] -> [1, Hq, nq, ...]
        return x.transpose(0, 1).repeat_interleave(c.G, 0).unsqueeze(0).to(torch.int32).contiguous()

    offset = c.offset

    def causal(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    kw = dict(BLOCK_SIZE=BLOCK, mask_mod=causal)
    if "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters:
        kw["seq_lengths"] = (c.T, c.S)
    bm = BlockMask.from_kv_blocks(per_head(torch.ones(nq, c.hkv, device=DEV)), per_head(part_idx),
                                  per_head(full_num), per_head(full_idx), **kw)
    flex = torch.compile(flex_attention, dynamic=False)
    q, k, v = c.q_bhsd().contiguous(), c.k_lin, c.v_lin

    def call():
        return flex(q, k, v, block_mask=bm, scale=c.scale, enable_gqa=True)

    o = call()
    torch.cuda.synchronize()
    return call, o


# ---- driver ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def watchdog(seconds: int):
    """A hung kernel blocks inside CUDA where Python cannot interrupt it: dump the stacks and exit."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def tflops(pairs: int, us: float) -> float:
    return 4.0 * D * pairs / (us * 1e-6) / 1e12


KERNEL_NAMES = [("qmajor_prefill_kernel", "qmajor"), ("kvmajor_prefill_kernel", "kvmajor"), ("kv_merge", "merge"),
                ("kv_rank", "rank"), ("kv_scan", "scan"), ("kv_fill", "fill"), ("tile_lists", "lists"),
                ("tile_schedule", "schedule"), ("fp8_copy_widen", "widen"),
                ("emset", "memset")]


def kernel_breakdown(call, calls: int = 3) -> dict:
    """Device microseconds per call of each kernel msa launches (torch.profiler over `calls` calls)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    out: dict = {}
    for evt in prof.key_averages():
        t = getattr(evt, "device_time_total", None)
        if t is None:
            t = getattr(evt, "cuda_time_total", 0.0)
        if not t:
            continue
        short = short_name(evt.key)
        if short == evt.key[:40]:
            continue
        out[short] = round(out.get(short, 0.0) + t / calls, 1)
    return out


def short_name(name: str) -> str:
    return next((v for k, v in KERNEL_NAMES if k in name), name[:40])


def kernel_timeline(call, replays: int = 3, flush_bytes: int = 0) -> dict:
    """The kernels of the last of `replays` graph replays of call(): [(short name, stream, start us, end us)]
    from the replay's first kernel start, and its span (first start to last end). Read from the profiler's
    chrome trace, which keeps each kernel's device timestamps (key_averages() does not).
    flush_bytes > 0: as time_flushed runs it (a memset of that size before each replay, the replays enqueued
    back to back, one synchronization at the end); times then count from the memset's end, `start_us` is the
    first kernel's start on that clock (the graph's launch behind the memset) and `span_us` the last end."""
    import json
    import tempfile
    from torch.profiler import ProfilerActivity, profile

    g = capture_graph([call], warmup=1)
    g.replay()
    torch.cuda.synchronize()
    cache = flush_buffer(flush_bytes) if flush_bytes else None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            if cache is not None:
                cache.zero_()
            g.replay()
            if cache is None:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    ks = sorted((float(e["ts"]), float(e["dur"]), e.get("tid"), e["name"]) for e in trace.get("traceEvents", [])
                if e.get("cat") in ("kernel", "gpu_memset"))
    if not ks:
        return {}
    if len(ks) % replays:
        return {"error": f"{len(ks)} kernels in {replays} replays"}
    per = len(ks) // replays  # every replay launches the same kernels (and the flush before it)
    last = ks[-per:]
    t0 = last[0][0]
    if cache is not None:  # the flush comes first; the clock starts at its end
        t0 += last[0][1]
        last = last[1:]
    rows = [(short_name(n), tid, round(ts - t0, 1), round(ts + d - t0, 1)) for ts, d, tid, n in last]
    out = {"span_us": round(max(r[3] for r in rows), 1), "kernels": rows}
    if cache is not None:
        out["start_us"] = rows[0][2]
        # each replay's end after its flush's end: do the profiled replays differ?
        out["ends_us"] = [round(max(ts + d for ts, d, _, _ in ks[i * per + 1:(i + 1) * per]) - ks[i * per][0] - ks[i * per][1], 1)
                          for i in range(replays)]
    return out


def bench_case(shape: str, wl: str, opts, ceil: dict, rows: list, seed: int) -> None:
    hq, hkv = SHAPES[shape]
    qo_len, kv_len = WORKLOADS[wl]
    gen = torch.Generator(device=DEV).manual_seed(seed)
    c = Case(qo_len, kv_len, hq, hkv, gen)
    iters = opts.iters or (10 if opts.quick else 20)

    bf16_us = {}  # (pattern, impl) -> us of the bf16-cache row, for the fp8 rows' ratio
    peer_us = {}  # dense peer -> us

    def emit(pattern, impl, us, pairs, fp8=False, **extra):
        tf = tflops(pairs, us)
        bars = BARS if opts.impl == "msa" else PORTABLE_BARS
        bar = bars.get(pattern) if wl in ("P-32K", "P-chunk") and impl == opts.impl and not fp8 else None
        if pattern == "dense" and "sdpa-flash" in peer_us and impl.startswith(opts.impl) and not fp8:
            extra["vs_sdpa_flash"] = round(peer_us["sdpa-flash"] / us, 3)  # the portable bar: >= 1 / 1.15
        if fp8 and (pattern, impl) in bf16_us:
            # the fp8 bar: >= 0.95 of the bf16-cache figure of the same run
            extra["vs_bf16"] = round(bf16_us[(pattern, impl)] / us, 3)
        elif not fp8:
            bf16_us[(pattern, impl)] = us
        r = row(wl + ("-fp8" if fp8 else ""), shape, pattern, impl, us, tflops=tf, ceil=ceil, pairs=pairs,
                bar_tflops=bar, **extra)
        rows.append(r)
        err = "" if r["max_err"] is None else f"  max_err {r['max_err']:.2e}"
        eager = "" if "eager_us" not in extra else f"  eager {extra['eager_us']:.1f} us"
        if "eager_flushed_us" in extra:
            eager += f" (flushed {extra['eager_flushed_us']:.1f})"
        if "isolated_us" in extra:
            eager = f"  isolated {extra['isolated_us']:.1f} us" + eager
        kern = "" if "kernels_us" not in extra else "  " + " ".join(f"{k} {v}" for k, v in extra["kernels_us"].items())
        clk = "" if "sm_mhz" not in extra else f"  {extra['sm_mhz']} MHz (min {extra['sm_mhz_min']}, capped {extra['power_capped']})"
        vs = "" if "vs_bf16" not in extra else f"  vs bf16 {extra['vs_bf16']:.3f}"
        vs += "" if "vs_sdpa_flash" not in extra else f"  vs sdpa-flash {extra['vs_sdpa_flash']:.3f}"
        print(f"{wl + ('-fp8' if fp8 else ''):12s} {shape:7s} {pattern:9s} {impl:18s} {us:10.1f} us {tf:7.1f} "
              f"TFLOP/s{err}{vs}{eager}{clk}{kern}", flush=True)

    def settle() -> dict:
        """Rests the board (see the docstring) so that a row does not inherit the power cap of the last."""
        torch.cuda.synchronize()
        if opts.once or opts.cooldown_max <= 0:
            return {}
        return {"rest_s": round(opts.monitor.rest(opts.cooldown, max(opts.cooldown, opts.cooldown_max)), 1)}

    def time_msa(call):
        """(median us, extra row fields) of one msa configuration: CUDA-graph replay (run() only launches,
        so a serving engine replays it from a graph), with the eager time (host work of every launch
        included) beside it."""
        if opts.once:
            call()
            torch.cuda.synchronize()
            return None, {}
        rest = settle()
        with watchdog(300):
            # The graph first, on the rested board (the eager calls after it: timed eager-first, the graph
            # replays of the long rows ran 2-11% slower than the eager calls before them).
            extra = {}
            with opts.monitor.window() as w:
                try:
                    us = time_flushed(call, iters=iters, warmup=3)
                except Exception as e:  # noqa: BLE001 (report the eager time and why)
                    us, extra["graph_error"] = None, str(e)[:200]
            extra.update(w.fields(), **rest)
            if us is not None:
                extra["isolated_us"] = round(time_graph(call, iters=iters, warmup=1), 1)
            eager = time_eager(call, iters=iters)
            extra["eager_us"] = round(eager, 1)
            # Eager calls timed as the peers are (do_bench: flushed, back to back): the GPU's time when the host's
            # work per call fits under the flush, else the host's (bench/run_host.py measures that work).
            extra["eager_flushed_us"] = round(time_flushed(call, iters=iters, graph=False), 1)
            if us is None:
                us = eager
            if opts.profile:
                extra["kernels_us"] = kernel_breakdown(call)
            if opts.timeline:
                extra["timeline"] = kernel_timeline(call)
                tl = extra["timeline"]
                if "kernels" in tl:
                    print(f"  timeline (graph replay, span {tl['span_us']} us): " +
                          "  ".join(f"{n}@{tid}[{a}-{b}]" for n, tid, a, b in tl["kernels"]), flush=True)
                timed = list(LAST_TIMES)
                extra["timeline_flushed"] = tl = kernel_timeline(call, replays=8, flush_bytes=256 << 20)
                if "kernels" in tl:
                    print(f"  timeline (after the 256 MiB flush, as timed; end {tl['span_us']} us): " +
                          "  ".join(f"{n}@{tid}[{a}-{b}]" for n, tid, a, b in tl["kernels"]), flush=True)
                    print(f"  profiled flushed replays end at {tl['ends_us']} us; timed calls (sorted) "
                          f"{[round(t, 1) for t in timed]}", flush=True)
        return us, extra

    flex_wanted = opts.flex == "all" or f"{shape}:{wl}" in opts.flex.split(",")

    # dense causal: msa against cuDNN SDPA (and, for msa-portable, the flash backend: FlashAttention-2's kernels)
    pairs = dense_pairs(c)
    ref = None
    if opts.peers and not opts.once and "dense" in opts.patterns:
        for flash in (False, True) if opts.impl == "msa-portable" else (False,):
            try:
                sdpa_call, o, sdpa_name = sdpa_runner(c, flash_only=flash)
                ref = o if ref is None else ref
                rest = settle()
                with opts.monitor.window() as w:
                    sus = time_flushed(sdpa_call, iters=iters, graph=False)
                iso = round(time_eager(sdpa_call, iters=iters), 1)
                emit("dense", sdpa_name, sus, pairs, isolated_us=iso, **w.fields(), **rest)
                peer_us[sdpa_name] = sus
                del o
            except Exception as e:  # noqa: BLE001
                name = "sdpa-flash" if flash else "cudnn-sdpa"
                rows.append(row(wl, shape, "dense", name, 0.0, error=str(e)[:400]))
                print(f"{wl} {shape} dense {name}: {e}", flush=True)
    if "dense" in opts.patterns:
        for vname, env in opts.variants:
            for fp8 in opts.kv_fp8:
                call, out = msa_runner(c, None, env=env, fp8=fp8)
                us, extra = time_msa(call)
                if us is None:
                    continue
                err = None if ref is None or fp8 else float((out - ref[0].transpose(0, 1)).abs().max().item())
                emit("dense", f"{opts.impl}-dense{vname}", us, pairs, max_err=err, plan=call.plan, fp8=fp8, **extra)
    del ref

    for pattern in ("random", "clustered", "shared"):
        if pattern not in opts.patterns:
            continue
        sel = selections(pattern, c, gen)
        pairs = sparse_pairs(sel, c)
        out = None
        for mode in opts.modes:
            for vname, env in opts.variants:
                for fp8 in opts.kv_fp8:
                    impl = (opts.impl if mode == "auto" else f"{opts.impl}-{mode}") + vname
                    try:
                        call, o = msa_runner(c, sel, mode, env, fp8)
                        us, extra = time_msa(call)
                        if us is None:
                            continue
                        emit(pattern, impl, us, pairs, max_err=sparse_max_err(c, sel, o, gen, fp8=fp8), plan=call.plan,
                             fp8=fp8, **extra)
                        if out is None and not fp8:
                            out = o
                    except Exception as e:  # noqa: BLE001
                        rows.append(row(wl + ("-fp8" if fp8 else ""), shape, pattern, impl, 0.0, error=str(e)[:400]))
                        print(f"{wl} {shape} {pattern} {impl} fp8={fp8}: {e}", flush=True)
        if pattern == "shared" and opts.peers and not opts.once and flex_wanted:
            try:
                fcall, fo = flex_runner(c, sel)
                rest = settle()
                with opts.monitor.window() as w:
                    fus = time_flushed(fcall, iters=iters, graph=False)
                iso = round(time_eager(fcall, iters=iters), 1)
                ferr = None if out is None else float((fo[0].transpose(0, 1) - out).abs().max().item())  # against msa
                emit(pattern, "flex", fus, pairs, max_err=ferr, isolated_us=iso, **w.fields(), **rest)
            except Exception as e:  # noqa: BLE001
                rows.append(row(wl, shape, pattern, "flex", 0.0, error=str(e)[:400]))
                print(f"{wl} {shape} flex: {e}", flush=True)
        del sel
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="P-32K and P-chunk at M3-TP1 only, default decomposition")
    ap.add_argument("--shape", choices=list(SHAPES), action="append")
    ap.add_argument("--workload", choices=list(WORKLOADS), action="append")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", help="'NAME:VAR=V,VAR=V;NAME2:...' environment settings per msa variant")
    ap.add_argument("--modes", help="decompositions per sparse pattern, e.g. auto,qmajor,kvmajor")
    ap.add_argument("--patterns", help="dense,random,clustered,shared (default: all)")
    ap.add_argument("--no-peers", dest="peers", action="store_false", help="skip cuDNN SDPA and FlexAttention")
    ap.add_argument("--kv", default="bf16,fp8",
                    help="K/V caches timed per msa row: bf16, fp8 (rows named <workload>-fp8, an e4m3 copy with "
                         "k_scale = v_scale = 1/64, vs_bf16 = the bf16 row's time over theirs) or both (default)")
    ap.add_argument("--flex", default="all",
                    help="cases where FlexAttention runs: all, none, or SHAPE:WORKLOAD,... (its compile takes ~20 s a case)")
    ap.add_argument("--profile", action="store_true", help="per-kernel device time of each msa row")
    ap.add_argument("--timeline", action="store_true", help="kernel start/end of one graph replay per msa row")
    ap.add_argument("--once", action="store_true", help="one call per msa row, no timing (for ncu)")
    add_output_options(ap)
    ap.add_argument("--iters", type=int, default=None,
                    help="timed calls per configuration (default 10 with --quick, else 20); longer runs show the power limiter")
    ap.add_argument("--cooldown", type=float, default=2.0,
                    help="least seconds of idle GPU before each timed configuration (see the docstring)")
    ap.add_argument("--cooldown-max", type=float, default=20.0,
                    help="most seconds to wait for the board to rest before each configuration (0: no rest at all)")
    args = ap.parse_args()
    check_record(ap, args)
    main_guard()
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = args.shape or (["M3-TP1"] if args.quick else list(SHAPES))
    wls = args.workload or (["P-32K", "P-chunk"] if args.quick else list(WORKLOADS))
    args.variants = parse_variants(args.variants)
    args.modes = args.modes.split(",") if args.modes else (["auto"] if args.quick else ["auto", "qmajor", "kvmajor"])
    args.patterns = args.patterns.split(",") if args.patterns else ["dense", "random", "clustered", "shared"]
    kinds = args.kv.split(",")
    if not kinds or set(kinds) - {"bf16", "fp8"}:
        ap.error(f"--kv: expected bf16, fp8 or bf16,fp8, got {args.kv!r}")
    args.kv_fp8 = [k == "fp8" for k in ("bf16", "fp8") if k in kinds]
    args.monitor = GpuMonitor(enabled=not args.once)  # no sampler beside an ncu run
    args.impl = msa_impl_name()
    if args.impl == "msa-portable" and "auto" in args.modes:
        # MSA_PORTABLE_PREFILL=qmajor|kvmajor puts an sm_90a build's plans on the portable family, but every row sets
        # the knob to its mode: an auto row would run the Hopper kernels under the msa-portable name.
        forced = os.environ.get("MSA_PORTABLE_PREFILL")
        with environment({"MSA_PORTABLE_PREFILL": "auto"}):
            hopper = msa_impl_name() == "msa"
        if hopper:
            ap.error(f"--modes: got {','.join(args.modes)}; with MSA_PORTABLE_PREFILL={forced} on a build with sm_90a "
                     "code only the forced modes run the portable family (pass --modes qmajor and / or kvmajor)")
    ceil = {"copy_gbps": None, "matmul_tflops": None} if args.once else ceilings()
    rows: list = []
    for shape in shapes:
        for wl in wls:
            bench_case(shape, wl, args, ceil, rows, args.seed)
    if not args.once:
        write_results("prefill" if args.impl == "msa" else "prefill-portable", ceil, rows, args.out_dir,
                      record=args.record)


if __name__ == "__main__":
    main()
