"""Indexer benchmark: block_scores and select_topk on the M3 indexer shapes (4 index heads of D=128, one
shared index-K head, block = page = 128, top-k 16, own block forced), with the copy and matmul ceilings
measured in the same run.

    PYTHONPATH=build/python python3 bench/indexer.py [--quick] [--variants] [--once]

Rows (workload ids of shared/spec/benchmarks.md):
  I-scores-P-32K, I-topk-P-32K     prefill, 32768 tokens, no prefix (scores: effective TFLOP/s, 2*D*H per
                                   visible (token, key) pair, eager; top-k: us per call in graph replay,
                                   eager_us the Python call launched eagerly)
  I-scores-P-32K-fp8               the same scores with fp8 index keys: msa = fp8 wgmma (queries rounded to
                                   e4m3 per row), msa-exact = the exact path (MSA_INDEXER_PREFILL=portable);
                                   ratio against the bf16 matmul ceiling; agree_entries / agree_rows: the
                                   top-16 against the exact path's
  P-chunk scores / top-k           4096-token chunk on a 28672-token prefix (I-scores-P-chunk-fp8 likewise)
  I-step-D-B1 / I-step-D-B64       decode step (scores + top-k) at 65536 tokens, CUDA-graph replay;
  I-step-D-B64-fp8                 gbps = index-K bytes read (+ fp8 scales) / time
  I-scores-D-B64[-fp8]             the scores kernel alone, graph replay
  I-topk-D-B64                     top-k alone, graph replay
  graph-floor                      a one-element torch kernel replayed the same way (rotate 1 and 8): the
                                   part of a graph-replay figure that is launch and timing overhead
Decode rows replay graphs of 8 calls on 8 copies of the inputs and report the time per call: a graph of
one call costs ~13.5 us to launch and time whatever it holds (graph-floor rotate=1), ~1.8 us per call in a
graph of 8 (in serving, a whole decode step is one graph, so the per-call figure is the representative
one); the copies also keep the 50 MB L2 from serving B=1 from cache.
The fp8 rows also record how often the fp8 top-k equals the bf16 one on unit-variance keys: agree_rows
(whole rows identical) and agree_entries (fraction of the 16 blocks shared); see docs/indexer.md.

--variants adds rows for the streaming decode kernel, behind an environment switch (MSA_INDEXER_DECODE=stream,
docs/knobs.md; impl column msa[stream]).
--once launches each workload once without timing (for ncu).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import msa  # noqa: E402

H, HK, D, BLOCK, TOPK = 4, 1, 128, 128, 16
dev = "cuda"


def paged_cache(num_tokens_per_req, B, dtype=torch.bfloat16, seed=0):
    """Index-K pool [pages, 1, 128, 128] with unit-variance keys, a shuffled dense page table."""
    g = torch.Generator(device=dev).manual_seed(seed)
    pages_per_req = math.ceil(num_tokens_per_req / BLOCK)
    n = B * pages_per_req
    k = torch.randn((n, HK, BLOCK, D), device=dev, generator=g, dtype=torch.float32).to(dtype)
    table = torch.randperm(n, device=dev, generator=g).to(torch.int32).view(B, pages_per_req).contiguous()
    return k, table


def quantize_fp8(k):
    scale = (k.float().abs().amax(-1).clamp_min(1e-12) / 448.0).contiguous()
    return (k.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def i32(x):
    return torch.tensor(x, dtype=torch.int32, device=dev)


def sample_score_error(scores_hkt, q, k, table, qo_indptr, kv_lens, tokens, k_scale=None):
    """Max |error| of sampled tokens' scores against a torch fp32 computation (causal, THK math)."""
    req = torch.searchsorted(qo_indptr[1:].cpu(), torch.tensor(tokens), right=True)
    err = 0.0
    for t, b in zip(tokens, req.tolist()):
        kv = int(kv_lens[b])
        pos = kv - int(qo_indptr[b + 1] - qo_indptr[b]) + (t - int(qo_indptr[b]))
        hi = min(kv, pos + 1)
        nblk = math.ceil(hi / BLOCK)
        pages = table[b, :nblk].long()
        kk = k[pages, 0].float()
        if k_scale is not None:
            kk = kk * k_scale[pages, 0][..., None]
        kk = kk.reshape(-1, D)[:hi]
        s = kk @ q[t].float().T  # [hi, H]
        pad = torch.full((nblk * BLOCK - hi, H), float("-inf"), device=dev)
        ref = torch.cat([s, pad]).view(nblk, BLOCK, H).amax(1).T  # [H, nblk]
        got = scores_hkt[:, :nblk, t]
        err = max(err, (got - ref).abs().max().item())
        assert torch.isneginf(scores_hkt[:, nblk:, t]).all(), "blocks past the visible ones must be -inf"
    return err


def topk_errors(idx, scores_hkt, qo_indptr, kv_lens, tokens):
    """Rows of sampled tokens that differ from the CPU backend's selection on the same scores."""
    s = scores_hkt[:, :, tokens].permute(2, 0, 1).contiguous().cpu().numpy()  # [n, H, NB]
    req = torch.searchsorted(qo_indptr[1:].cpu(), torch.tensor(tokens), right=True).tolist()
    pos = [int(kv_lens[b]) - int(qo_indptr[b + 1] - qo_indptr[b]) + (t - int(qo_indptr[b]))
           for t, b in zip(tokens, req)]
    n = len(tokens)
    ref = msa.select_topk(s, np.arange(n + 1, dtype=np.int32), np.array([p + 1 for p in pos], np.int32), TOPK,
                          layout="THK", force_begin=0, force_end=1)
    return int((idx[tokens].cpu().numpy() != ref).any(-1).sum())


def scores_call(q, k, table, qo_indptr, kv_lens, out, layout, k_scale=None):
    return lambda: msa.block_scores(q, k, table, qo_indptr, kv_lens, k_scale=k_scale, out=out, layout=layout)


def topk_call(scores, qo_indptr, kv_lens, idx, layout):
    return lambda: msa.select_topk(scores, qo_indptr, kv_lens, TOPK, layout=layout, force_begin=0, force_end=1,
                                   out=idx)


# The streaming decode kernel (the path of every GPU other than sm_90) behind its environment switch
# (docs/knobs.md).
DECODE_VARIANTS = [("msa[stream]", {"MSA_INDEXER_DECODE": "stream"})]


class env_vars:
    """Sets environment variables for the duration of a with-block (the library reads them per call)."""

    def __init__(self, values):
        self.values = values or {}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def prefill_rows(ceil, name, qo_len, kv_len, iters, with_sm80):
    rows = []
    k, table = paged_cache(kv_len, 1)
    q = torch.randn((qo_len, H, D), device=dev, dtype=torch.bfloat16)
    qo_indptr, kv_lens = i32([0, qo_len]), i32([kv_len])
    nb = math.ceil(kv_len / BLOCK)
    prefix = kv_len - qo_len
    pairs = qo_len * prefix + qo_len * (qo_len + 1) // 2
    flop = 2 * D * H * pairs
    tokens = sorted({0, qo_len - 1, qo_len // 2, *torch.randint(0, qo_len, (13,)).tolist()})
    for layout in ("HKT", "THK"):
        out = torch.empty((H, nb, qo_len) if layout == "HKT" else (qo_len, H, nb), device=dev)
        impls = [("msa", None)] + ([("msa-sm80", {"MSA_INDEXER_PREFILL": "portable"})]
                                   if with_sm80 and layout == "HKT" else [])
        for impl, env in impls:
            with env_vars(env):
                us = common.time_eager(scores_call(q, k, table, qo_indptr, kv_lens, out, layout), iters=iters)
            hkt = out if layout == "HKT" else out.permute(1, 2, 0)
            err = sample_score_error(hkt, q, k, table, qo_indptr, kv_lens, tokens)
            rows.append(common.row(f"I-scores-{name}", "M3-indexer", layout, impl, us,
                                   tflops=flop / (us * 1e-6) / 1e12, ceil=ceil, max_err=round(err, 6)))
            print(rows[-1], flush=True)
        idx = torch.empty((qo_len, H, TOPK), device=dev, dtype=torch.int32)
        eager_us = common.time_eager(topk_call(out, qo_indptr, kv_lens, idx, layout), iters=iters)
        hkt = out if layout == "HKT" else out.permute(1, 2, 0)
        bad = topk_errors(idx, hkt, qo_indptr, kv_lens, tokens)
        # The kernel's time: graph replay of 4 calls alternating over two copies of the scores (2 x 134 MB at
        # P-32K, so no call finds its scores in the L2). The eager figure adds the host's ~40 us per call.
        out2 = out.clone()
        idx2 = torch.empty_like(idx)
        calls = [topk_call(o, qo_indptr, kv_lens, i, layout) for o, i in ((out, idx), (out2, idx2))] * 2
        us = common.time_graph(None, iters=iters, rotate=calls)
        del out2, idx2
        rows.append(common.row(f"I-topk-{name}", "M3-indexer", layout, "msa", us, max_err=bad,
                               eager_us=round(eager_us, 2)))
        print(rows[-1], flush=True)
    return rows


def shared_entries(a, b):
    """Fraction of b's valid entries (>= 0) that a's row of the same (token, head) also holds, and the
    fraction of identical rows: index tensors [..., topk]."""
    hit = ((a[..., :, None] == b[..., None, :]) & (b[..., None, :] >= 0)).any(-2).sum()
    return (round(hit.item() / max(1, (b >= 0).sum().item()), 4),
            round((a == b).all(-1).float().mean().item(), 4))


def fp8_prefill_rows(ceil, name, qo_len, kv_len, iters, with_exact):
    """Scores with fp8 index keys: the default (fp8 wgmma, queries rounded to e4m3 per row) and, with
    with_exact, the exact path (MSA_INDEXER_PREFILL=portable: keys converted to fp16). ratio is against the
    bf16 matmul ceiling; max_err against fp32 scores of the dequantized keys and the unrounded queries;
    agree_entries / agree_rows: the top-16 against the exact path's (unit-variance q and k)."""
    rows = []
    k, table = paged_cache(kv_len, 1)
    k8, ks = quantize_fp8(k)
    del k
    q = torch.randn((qo_len, H, D), device=dev, dtype=torch.bfloat16)
    qo_indptr, kv_lens = i32([0, qo_len]), i32([kv_len])
    nb = math.ceil(kv_len / BLOCK)
    prefix = kv_len - qo_len
    flop = 2 * D * H * (qo_len * prefix + qo_len * (qo_len + 1) // 2)
    tokens = sorted({0, qo_len - 1, qo_len // 2, *torch.randint(0, qo_len, (13,)).tolist()})
    exact_env = {"MSA_INDEXER_PREFILL": "portable"}
    for layout in ("HKT", "THK"):
        out = torch.empty((H, nb, qo_len) if layout == "HKT" else (qo_len, H, nb), device=dev)
        hkt = out if layout == "HKT" else out.permute(1, 2, 0)
        impls = [("msa", None)] + ([("msa-exact", exact_env)] if with_exact else [])
        for impl, env in impls:
            with env_vars(env):
                us = common.time_eager(scores_call(q, k8, table, qo_indptr, kv_lens, out, layout, k_scale=ks),
                                       iters=iters)
            err = sample_score_error(hkt, q, k8, table, qo_indptr, kv_lens, tokens, k_scale=ks)
            extra = {}
            if impl == "msa" and layout == "HKT":
                idx = torch.empty((qo_len, H, TOPK), device=dev, dtype=torch.int32)
                ref_out = torch.empty_like(out)
                ref_idx = torch.empty_like(idx)
                with env_vars(exact_env):
                    scores_call(q, k8, table, qo_indptr, kv_lens, ref_out, layout, k_scale=ks)()
                topk_call(out, qo_indptr, kv_lens, idx, layout)()
                topk_call(ref_out, qo_indptr, kv_lens, ref_idx, layout)()
                extra["agree_entries"], extra["agree_rows"] = shared_entries(idx, ref_idx)
                del ref_out
            rows.append(common.row(f"I-scores-{name}-fp8", "M3-indexer", layout, impl, us,
                                   tflops=flop / (us * 1e-6) / 1e12, ceil=ceil, max_err=round(err, 6), **extra))
            print(rows[-1], flush=True)
    return rows


def decode_rows(ceil, B, kv_len, iters, fp8, rotate, variants=False):
    rows = []
    caches = [paged_cache(kv_len, B, seed=i) for i in range(rotate)]
    q = torch.randn((B, H, D), device=dev, dtype=torch.bfloat16)
    qo_indptr, kv_lens = torch.arange(B + 1, device=dev, dtype=torch.int32), i32([kv_len] * B)
    nb = math.ceil(kv_len / BLOCK)
    kinds = [("bf16", None)]
    if fp8:
        kinds.append(("fp8", [quantize_fp8(k) for k, _ in caches]))
    impls = [("msa", None)] + (DECODE_VARIANTS if variants else [])
    selections = {}
    for name, q8 in kinds:
        for layout in ("HKT", "THK"):
            shape = (H, nb, B) if layout == "HKT" else (B, H, nb)
            outs = [torch.empty(shape, device=dev) for _ in caches]
            idxs = [torch.empty((B, H, TOPK), device=dev, dtype=torch.int32) for _ in caches]

            def scores(i):
                k, table = caches[i]
                kk, ks = (k, None) if q8 is None else q8[i]
                msa.block_scores(q, kk, table, qo_indptr, kv_lens, k_scale=ks, out=outs[i], layout=layout)

            def topk(i):
                msa.select_topk(outs[i], qo_indptr, kv_lens, TOPK, layout=layout, force_begin=0, force_end=1,
                                out=idxs[i])

            def step(i):
                scores(i)
                topk(i)

            suffix = "-fp8" if name == "fp8" else ""
            bytes_k = B * kv_len * (D * (1 if q8 is not None else 2) + (4 if q8 is not None else 0))
            for impl, env in impls:
                with env_vars(env):
                    us = common.time_graph(None, iters=iters, rotate=[lambda i=i: step(i) for i in range(len(caches))])
                    us_s = common.time_graph(None, iters=iters,
                                             rotate=[lambda i=i: scores(i) for i in range(len(caches))])
                hkt = outs[0] if layout == "HKT" else outs[0].permute(1, 2, 0)
                err = sample_score_error(hkt, q, q8[0][0] if q8 else caches[0][0], caches[0][1], qo_indptr,
                                         kv_lens, [0, B - 1], k_scale=q8[0][1] if q8 else None)
                bad = topk_errors(idxs[0], hkt, qo_indptr, kv_lens, list(range(B)))
                extra = {}
                if impl == "msa":
                    selections[(name, layout)] = idxs[0].clone()
                    if name == "fp8":
                        ref, got = selections[("bf16", layout)], idxs[0]
                        extra["agree_rows"] = round((got == ref).all(-1).float().mean().item(), 4)
                        shared = [len(set(a) & set(b)) for a, b in zip(got.view(-1, TOPK).tolist(),
                                                                        ref.view(-1, TOPK).tolist())]
                        extra["agree_entries"] = round(sum(shared) / (TOPK * len(shared)), 4)
                rows.append(common.row(f"I-step-D-B{B}{suffix}", "M3-indexer", layout, impl, us,
                                       gbps=bytes_k / (us * 1e-6) / 1e9, ceil=ceil, max_err=round(err, 6),
                                       topk_bad_rows=bad, **extra))
                print(rows[-1], flush=True)
                rows.append(common.row(f"I-scores-D-B{B}{suffix}", "M3-indexer", layout, impl, us_s,
                                       gbps=bytes_k / (us_s * 1e-6) / 1e9, ceil=ceil))
                print(rows[-1], flush=True)
            if name == "bf16":
                us = common.time_graph(None, iters=iters, rotate=[lambda i=i: topk(i) for i in range(len(caches))])
                rows.append(common.row(f"I-topk-D-B{B}", "M3-indexer", layout, "msa", us))
                print(rows[-1], flush=True)
    return rows


def graph_floor_rows(iters):
    """A one-element kernel replayed like the decode rows: what launch and event timing cost alone."""
    rows = []
    xs = [torch.zeros(1, device=dev) for _ in range(8)]
    for n in (1, 8):
        us = common.time_graph(None, iters=iters, rotate=[lambda x=x: x.add_(1) for x in xs[:n]])
        rows.append(common.row("graph-floor", "1 element", f"rotate={n}", "torch", us))
        print(rows[-1], flush=True)
    return rows


def launch_once():
    """Each workload once, untimed, default kernels (for ncu -k regex:...)."""
    k, table = paged_cache(32768, 1)
    q = torch.randn((32768, H, D), device=dev, dtype=torch.bfloat16)
    out = torch.empty((H, 256, 32768), device=dev)
    qo, kv = i32([0, 32768]), i32([32768])
    scores_call(q, k, table, qo, kv, out, "HKT")()
    k8, ks = quantize_fp8(k)
    scores_call(q, k8, table, qo, kv, out, "HKT", k_scale=ks)()
    topk_call(out, qo, kv, torch.empty((32768, H, TOPK), device=dev, dtype=torch.int32), "HKT")()
    B = 64
    k, table = paged_cache(65536, B)
    q = torch.randn((B, H, D), device=dev, dtype=torch.bfloat16)
    qo, kv = torch.arange(B + 1, device=dev, dtype=torch.int32), i32([65536] * B)
    out = torch.empty((H, 512, B), device=dev)
    idx = torch.empty((B, H, TOPK), device=dev, dtype=torch.int32)
    k8, ks = quantize_fp8(k)
    scores_call(q, k, table, qo, kv, out, "HKT")()
    scores_call(q, k8, table, qo, kv, out, "HKT", k_scale=ks)()
    topk_call(out, qo, kv, idx, "HKT")()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations, no sm80 rows, no P-chunk")
    ap.add_argument("--variants", action="store_true", help="also the streaming decode kernel (MSA_INDEXER_DECODE)")
    ap.add_argument("--once", action="store_true", help="launch each workload once, untimed (for ncu)")
    common.add_output_options(ap)
    args = ap.parse_args()
    common.check_record(ap, args)
    common.main_guard()
    torch.manual_seed(0)
    if args.once:
        launch_once()
        return
    ceil = common.ceilings()
    iters = 5 if args.quick else 20
    rows = []
    rows += graph_floor_rows(50)
    rows += prefill_rows(ceil, "P-32K", 32768, 32768, iters, with_sm80=not args.quick)
    rows += fp8_prefill_rows(ceil, "P-32K", 32768, 32768, iters, with_exact=not args.quick)
    if not args.quick:
        rows += prefill_rows(ceil, "P-chunk", 4096, 32768, iters, with_sm80=False)
        rows += fp8_prefill_rows(ceil, "P-chunk", 4096, 32768, iters, with_exact=False)
    rows += decode_rows(ceil, 1, 65536, 20 if args.quick else 50, fp8=False, rotate=8, variants=args.variants)
    rows += decode_rows(ceil, 64, 65536, 10 if args.quick else 30, fp8=True, rotate=8, variants=args.variants)
    common.write_results("indexer", ceil, rows, args.out_dir, record=args.record)


if __name__ == "__main__":
    main()
