"""Indexer benchmark: block_scores and select_topk on the M3 indexer shapes (4 index heads of D=128, one
shared index-K head, block = page = 128, top-k 16, own block forced), with the copy and matmul ceilings
measured in the same run.

    PYTHONPATH=build/python python3 bench/indexer.py [--quick]

Rows (workload ids of shared/spec/benchmarks.md):
  I-scores-P-32K, I-topk-P-32K     prefill, 32768 tokens, no prefix (scores: effective TFLOP/s, 2*D*H per
                                   visible (token, key) pair; top-k: us)
  P-chunk scores / top-k           4096-token chunk on a 28672-token prefix
  I-step-D-B1 / I-step-D-B64       decode step (scores + top-k) at 65536 tokens, CUDA-graph replay;
  I-step-D-B64-fp8                 gbps = index-K bytes read (+ fp8 scales) / time
  I-topk-D-B64                     top-k alone, graph replay
The fp8 rows also record how often the fp8 top-k equals the bf16 one (agree_rows) on unit-variance keys.
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
        impls = [("msa", None)] + ([("msa-sm80", "portable")] if with_sm80 and layout == "HKT" else [])
        for impl, env in impls:
            if env:
                os.environ["MSA_INDEXER_PREFILL"] = env
            us = common.time_eager(scores_call(q, k, table, qo_indptr, kv_lens, out, layout), iters=iters)
            os.environ.pop("MSA_INDEXER_PREFILL", None)
            hkt = out if layout == "HKT" else out.permute(1, 2, 0)
            err = sample_score_error(hkt, q, k, table, qo_indptr, kv_lens, tokens)
            rows.append(common.row(f"I-scores-{name}", "M3-indexer", layout, impl, us,
                                   tflops=flop / (us * 1e-6) / 1e12, ceil=ceil, max_err=round(err, 6)))
            print(rows[-1], flush=True)
        idx = torch.empty((qo_len, H, TOPK), device=dev, dtype=torch.int32)
        us = common.time_eager(topk_call(out, qo_indptr, kv_lens, idx, layout), iters=iters)
        hkt = out if layout == "HKT" else out.permute(1, 2, 0)
        bad = topk_errors(idx, hkt, qo_indptr, kv_lens, tokens)
        rows.append(common.row(f"I-topk-{name}", "M3-indexer", layout, "msa", us, max_err=bad))
        print(rows[-1], flush=True)
    return rows


def decode_rows(ceil, B, kv_len, iters, fp8, rotate):
    rows = []
    caches = [paged_cache(kv_len, B, seed=i) for i in range(rotate)]
    q = torch.randn((B, H, D), device=dev, dtype=torch.bfloat16)
    qo_indptr, kv_lens = torch.arange(B + 1, device=dev, dtype=torch.int32), i32([kv_len] * B)
    nb = math.ceil(kv_len / BLOCK)
    variants = [("bf16", None)]
    if fp8:
        variants.append(("fp8", [quantize_fp8(k) for k, _ in caches]))
    selections = {}
    for name, q8 in variants:
        for layout in ("HKT", "THK"):
            shape = (H, nb, B) if layout == "HKT" else (B, H, nb)
            outs = [torch.empty(shape, device=dev) for _ in caches]
            idxs = [torch.empty((B, H, TOPK), device=dev, dtype=torch.int32) for _ in caches]

            def step(i):
                k, table = caches[i]
                kk, ks = (k, None) if q8 is None else q8[i]
                msa.block_scores(q, kk, table, qo_indptr, kv_lens, k_scale=ks, out=outs[i], layout=layout)
                msa.select_topk(outs[i], qo_indptr, kv_lens, TOPK, layout=layout, force_begin=0, force_end=1,
                                out=idxs[i])

            us = common.time_graph(None, iters=iters, rotate=[lambda i=i: step(i) for i in range(len(caches))])
            bytes_k = B * kv_len * (D * (1 if q8 is not None else 2) + (4 if q8 is not None else 0))
            hkt = outs[0] if layout == "HKT" else outs[0].permute(1, 2, 0)
            err = sample_score_error(hkt, q, q8[0][0] if q8 else caches[0][0], caches[0][1], qo_indptr, kv_lens,
                                     [0, B - 1], k_scale=q8[0][1] if q8 else None)
            bad = topk_errors(idxs[0], hkt, qo_indptr, kv_lens, list(range(B)))
            extra = {}
            selections[(name, layout)] = idxs[0].clone()
            if name == "fp8":
                ref = selections[("bf16", layout)]
                extra["agree_rows"] = round((idxs[0] == ref).all(-1).float().mean().item(), 4)
            wl = f"I-step-D-B{B}" + ("-fp8" if name == "fp8" else "")
            rows.append(common.row(wl, "M3-indexer", layout, "msa", us, gbps=bytes_k / (us * 1e-6) / 1e9, ceil=ceil,
                                   max_err=round(err, 6), topk_bad_rows=bad, **extra))
            print(rows[-1], flush=True)
            if name == "bf16":
                us = common.time_graph(None, iters=iters, rotate=[
                    (lambda i=i: msa.select_topk(outs[i], qo_indptr, kv_lens, TOPK, layout=layout, force_begin=0,
                                                 force_end=1, out=idxs[i])) for i in range(len(caches))])
                rows.append(common.row(f"I-topk-D-B{B}", "M3-indexer", layout, "msa", us))
                print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations, no sm80 rows, no P-chunk")
    args = ap.parse_args()
    common.main_guard()
    torch.manual_seed(0)
    ceil = common.ceilings()
    iters = 5 if args.quick else 20
    rows = []
    rows += prefill_rows(ceil, "P-32K", 32768, 32768, iters, with_sm80=not args.quick)
    if not args.quick:
        rows += prefill_rows(ceil, "P-chunk", 4096, 32768, iters, with_sm80=False)
    # B=1 reads 16 MB per step (L2 is 50 MB): rotate over 8 caches so each replay reads from HBM.
    rows += decode_rows(ceil, 1, 65536, 20 if args.quick else 50, fp8=False, rotate=8)
    rows += decode_rows(ceil, 64, 65536, 10 if args.quick else 30, fp8=True, rotate=1)
    common.write_results("indexer", ceil, rows)


if __name__ == "__main__":
    main()
