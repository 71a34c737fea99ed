"""Sparse-layer decode benchmark: one MiniMax-M3 layer's decode step - index scores -> top-k -> sparse
attention (msa.sparse_attention_layer) - captured in one CUDA graph and timed by replay, all bf16 and all fp8.

    PYTHONPATH=build/python python3 bench/layer.py [--quick] [--iters N]

Rows (workload ids of shared/spec/benchmarks.md; D = 128, block = page = 128, top-k 16, own block forced,
score layout THK, every tensor unit-variance random, pages placed by a shuffled page table):
  L-step-D-B64        M3-TP1 and M3-TP4, B=64, 65536 tokens per request, bf16 index K and K/V
  L-step-D-B64-fp8    the same with fp8 e4m3 index K (per-token fp32 scales) and fp8 e4m3 K/V (per-tensor
                      k_scale / v_scale = amax / 448), quantized from the bf16 data
  L-step-D-1M-B8[-fp8] M3-TP1, B=8, 1,048,576 tokens per request
Index heads: one per KV head (4 at TP1, 1 at TP4), all reading the one shared index-K head, so the index
scan is the same at both shapes. Patterns:
  chain           the layer call; gbps = roofline bytes / time, ratio = roofline time / measured time, where
                  roofline bytes = index-K bytes read (+ the fp8 rows' 4-byte per-token scales) + the selected
                  K/V bytes (distinct selected blocks per (request, KV head), keys below kv_len, K and V)
                  + q, q_index and o bytes, and roofline time = roofline bytes / the copy ceiling of the run
  scores, topk, attention   each stage captured alone on the same inputs (attention on the chain's
                  selection); scores' gbps over the index-K bytes, attention's over the K/V, q and o bytes
  sum-of-stages   the three stage times added: against the chain, what running the stages as one graph (the
                  kernels launched with programmatic dependent launch) saves or costs
Timing: each graph holds 8 copies of its call and is replayed back to back (an event pair around each replay,
one synchronization at the end), as on a serving engine's stream; us is per call. One step reads >= 0.58 GB,
ten times the L2, so repeating the inputs does not serve a call from the cache; the intermediates (scores,
selection) are L2-resident in the chain and in the stage graphs alike.
max_err: a few tokens' outputs against float64 attention over the chain's selection (fp8 rows: over the
dequantized K/V); topk_bad_rows: rows of the chain's selection that differ from the CPU backend's on the same
scores. The fp8 chain rows carry the accuracy line: recall (fraction of the bf16 selection's blocks the fp8
selection keeps) and the output's distance from the bf16 layer's (out_max_abs, out_rel_fro: relative Frobenius).
A quoted row: FlashInfer's whole fp8 layer step at B=64 (flashinfer-quoted), from the benchmark spec, not run
here; its ratio counts no index-K scales, so the fp8 chain rows also give ratio_excl_scales.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli  # noqa: E402  (bench/cli.py: no torch)

BLOCK = 128  # tokens per block and per page
D = 128      # head dim of q, K, V and of the index keys
TOPK = 16
SHAPES = {"M3-TP1": (64, 4), "M3-TP4": (16, 1)}  # (Hq, Hkv); index heads = Hkv
# (workload, shape, batch, tokens per request)
WORKLOADS = [("L-step-D-B64", "M3-TP1", 64, 65536), ("L-step-D-B64", "M3-TP4", 64, 65536),
             ("L-step-D-1M-B8", "M3-TP1", 8, 1 << 20)]
BARS = {("L-step-D-B64", "M3-TP1"): 0.93, ("L-step-D-B64-fp8", "M3-TP1"): 0.92}  # ratio >= bar
# Not run here: the benchmark spec's measurement (flashinfer-python 0.7.4 msa_ops on an H200, copy 4284 GB/s).
FLASHINFER_FP8_STEP_B64 = {"us": 180.5, "ratio": 0.871}
CALLS_PER_GRAPH = 8
NOTES: list = []  # the accuracy lines and any refusal, for the .md note

# torch, bench/common.py and msa are loaded by main(): the byte count below and --help need none of them.
torch = common = msa = None


def roofline_bytes(block_idx, qo_indptr, kv_lens, *, num_qo_heads, kv_elem_bytes, index_elem_bytes,
                   index_scale_bytes=0, index_k_heads=1, head_dim=D, index_dim=D, q_bytes=2) -> dict:
    """The bytes a layer step cannot avoid moving, by part (all ints):
    index_k: every request's index keys below kv_len, index_k_heads heads of index_dim elements plus a
        per-token scale of index_scale_bytes (fp8 index K);
    kv: the selected K and V blocks, each distinct block once per (request, KV head), its keys below kv_len;
    qo: q and o ([T, Hq, head_dim]) and q_index ([T, Hkv, index_dim]), q_bytes per element;
    total: their sum.
    block_idx: int [T, Hkv, topk] (-1 = empty slot); qo_indptr [B+1]; kv_lens [B]."""
    bi = np.asarray(block_idx)
    indptr = np.asarray(qo_indptr, dtype=np.int64)
    lens = np.asarray(kv_lens, dtype=np.int64)
    T, hkv = bi.shape[0], bi.shape[1]
    index_k = int(lens.sum()) * index_k_heads * (index_dim * index_elem_bytes + index_scale_bytes)
    keys = 0
    for b in range(len(lens)):
        nblk = -(-int(lens[b]) // BLOCK)
        rows = bi[indptr[b]:indptr[b + 1]]
        for g in range(hkv):
            blocks = np.unique(rows[:, g].reshape(-1))
            blocks = blocks[(blocks >= 0) & (blocks < nblk)].astype(np.int64)
            keys += int(np.minimum(BLOCK, lens[b] - blocks * BLOCK).sum())
    kv = keys * head_dim * kv_elem_bytes * 2
    qo = T * (2 * num_qo_heads * head_dim + hkv * index_dim) * q_bytes
    return {"index_k": index_k, "kv": kv, "qo": qo, "total": index_k + kv + qo}


def selection_recall(ref_idx, got_idx) -> float:
    """Fraction of the valid (>= 0) entries of ref_idx's rows that got_idx's same rows also hold
    ([..., topk] int arrays; rows compared as sets). 1.0 when ref has no valid entry."""
    ref = np.asarray(ref_idx).reshape(-1, np.asarray(ref_idx).shape[-1])
    got = np.asarray(got_idx).reshape(ref.shape)
    kept = total = 0
    for r, g in zip(ref, got):
        want = set(int(x) for x in r if x >= 0)
        total += len(want)
        kept += len(want & set(int(x) for x in g if x >= 0))
    return kept / total if total else 1.0


# ---- GPU part --------------------------------------------------------------------------------------------------

def load_gpu_modules():
    global torch, common, msa
    torch, common = cli.load_torch_and_common("bench/layer.py")
    import msa as msa_module
    msa = msa_module


def randn(shape, gen, dtype):
    return torch.empty(shape, device="cuda", dtype=dtype).normal_(generator=gen)


def per_tensor_fp8(x, chunk_pages: int = 4096):
    """(e4m3 copy, scale) with scale = amax / 448, converted in page chunks (a multi-GB pool in fp32 at once
    would need 2x its size again)."""
    amax = max(float(x[i:i + chunk_pages].abs().amax()) for i in range(0, x.shape[0], chunk_pages))
    scale = amax / 448.0 if amax > 0 else 1.0
    out = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    for i in range(0, x.shape[0], chunk_pages):
        out[i:i + chunk_pages] = (x[i:i + chunk_pages].float() / scale).to(torch.float8_e4m3fn)
    return out, scale


def per_token_fp8(k):
    """The fp8 index keys as bench/indexer.py builds them: per-token scale amax / 448, fp32 [pages, 1, 128]."""
    scale = (k.float().abs().amax(-1).clamp_min(1e-12) / 448.0).contiguous()
    return (k.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


class Problem:
    """One workload's tensors: bf16 K/V and index-K pools, their fp8 copies, q, q_index, a shuffled page table."""

    def __init__(self, shape: str, batch: int, kv_len: int, seed: int = 0):
        hq, hkv = SHAPES[shape]
        self.hq, self.hkv, self.batch, self.kv_len = hq, hkv, batch, kv_len
        gen = torch.Generator(device="cuda").manual_seed(seed)
        ppr = math.ceil(kv_len / BLOCK)
        pages = batch * ppr
        self.k = randn((pages, hkv, BLOCK, D), gen, torch.bfloat16)
        self.v = randn((pages, hkv, BLOCK, D), gen, torch.bfloat16)
        self.k_index = randn((pages, 1, BLOCK, D), gen, torch.bfloat16)
        self.q = randn((batch, hq, D), gen, torch.bfloat16)
        self.q_index = randn((batch, hkv, D), gen, torch.bfloat16)
        self.page_table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(batch, ppr)
        self.qo_indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
        self.kv_lens = torch.full((batch,), kv_len, device="cuda", dtype=torch.int32)
        self.k8, self.k_scale = per_tensor_fp8(self.k)
        self.v8, self.v_scale = per_tensor_fp8(self.v)
        self.k_index8, self.k_index_scale = per_token_fp8(self.k_index)
        torch.cuda.synchronize()
        print(f"# {shape} B={batch} kv_len={kv_len}: K/V pools {2 * self.k.numel() * 2 / 2**30:.1f} GiB bf16, "
              f"k_scale {self.k_scale:.5f}, v_scale {self.v_scale:.5f}", flush=True)


class Step:
    """One kind's (bf16 or fp8) layer step on a Problem: the chain and its three stages as argument-free calls
    that write preallocated outputs (capturable)."""

    def __init__(self, p: Problem, plan, fp8: bool):
        self.p, self.plan, self.fp8 = p, plan, fp8
        self.k, self.v = (p.k8, p.v8) if fp8 else (p.k, p.v)
        self.k_index, self.k_index_scale = (p.k_index8, p.k_index_scale) if fp8 else (p.k_index, None)
        self.scales = dict(k_scale=p.k_scale, v_scale=p.v_scale) if fp8 else {}
        nb = math.ceil(p.kv_len / BLOCK)
        self.scores = torch.empty((p.batch, p.hkv, nb), device="cuda", dtype=torch.float32)
        self.block_idx = torch.empty((p.batch, p.hkv, TOPK), device="cuda", dtype=torch.int32)
        self.out = torch.empty((p.batch, p.hq, D), device="cuda", dtype=torch.bfloat16)

    def chain(self):
        p = self.p
        msa.sparse_attention_layer(self.plan, p.q, self.k, self.v, p.q_index, self.k_index, p.page_table,
                                   p.qo_indptr, p.kv_lens, k_index_scale=self.k_index_scale, force_begin=0,
                                   force_end=1, scores=self.scores, score_layout="THK", block_idx=self.block_idx,
                                   out=self.out, **self.scales)

    def scores_stage(self):
        p = self.p
        msa.block_scores(p.q_index, self.k_index, p.page_table, p.qo_indptr, p.kv_lens, k_scale=self.k_index_scale,
                         out=self.scores, layout="THK")

    def topk_stage(self):
        p = self.p
        msa.select_topk(self.scores, p.qo_indptr, p.kv_lens, TOPK, layout="THK", force_begin=0, force_end=1,
                        out=self.block_idx)

    def attention_stage(self):
        p = self.p
        msa.attention(self.plan, p.q, self.k, self.v, p.page_table, p.qo_indptr, p.kv_lens, block_idx=self.block_idx,
                      out=self.out, **self.scales)

    def bytes(self) -> dict:
        p = self.p
        return roofline_bytes(self.block_idx.cpu().numpy(), p.qo_indptr.cpu().numpy(), p.kv_lens.cpu().numpy(),
                              num_qo_heads=p.hq, kv_elem_bytes=1 if self.fp8 else 2,
                              index_elem_bytes=1 if self.fp8 else 2, index_scale_bytes=4 if self.fp8 else 0)

    def max_err(self, tokens) -> float:
        """Largest abs error of the tokens' outputs (all heads) against float64 over the chain's selection."""
        p = self.p
        G = p.hq // p.hkv
        err = 0.0
        bi = self.block_idx.cpu().numpy()
        for t in tokens:
            for g in range(p.hkv):
                blocks = sorted({int(e) for e in bi[t, g] if 0 <= e < math.ceil(p.kv_len / BLOCK)})
                pages = p.page_table[t, blocks].long()
                kk, vv = (rows_of(x, pages, g).reshape(-1, D) for x in (self.k, self.v))
                if self.fp8:
                    kk, vv = kk * p.k_scale, vv * p.v_scale
                qh = p.q[t, g * G:(g + 1) * G].double()
                ref = torch.softmax(qh @ kk.T * D ** -0.5, dim=-1) @ vv
                err = max(err, float((self.out[t, g * G:(g + 1) * G].double() - ref).abs().max()))
        return err

    def topk_bad_rows(self) -> int:
        """Rows of the selection that differ from the CPU backend's selection on the same scores."""
        p = self.p
        ref = msa.select_topk(self.scores.cpu().numpy(), p.qo_indptr.cpu().numpy(), p.kv_lens.cpu().numpy(), TOPK,
                              layout="THK", force_begin=0, force_end=1)
        return int((self.block_idx.cpu().numpy() != ref).any(-1).sum())


def rows_of(pool, pages, head):
    """pool[pages, head] in float64; fp8 pools are gathered as bytes (torch's indexing kernels may lack e4m3)."""
    if pool.dtype == torch.float8_e4m3fn:
        return pool.view(torch.uint8)[pages, head].view(torch.float8_e4m3fn).float().double()
    return pool[pages, head].double()


def timed(call, iters: int) -> float:
    return common.time_graph(None, iters=iters, rotate=[call] * CALLS_PER_GRAPH, back_to_back=True)


def error_row(workload, shape, pattern, exc) -> dict:
    r = common.row(workload, shape, pattern, "msa", 0.0)
    r["us"] = None
    r["error"] = f"{type(exc).__name__}: {exc}"
    return r


def measure_kind(p: Problem, plan, fp8: bool, workload: str, shape: str, ceil: dict, iters: int):
    """The rows of one kind (bf16 or fp8), the step (holding the outputs of one eager chain call) and whether
    the layer call ran (False: the build refused it; the step then holds the stages' selection only)."""
    name = workload + ("-fp8" if fp8 else "")
    st = Step(p, plan, fp8)
    rows = []
    st.scores_stage()
    st.topk_stage()
    torch.cuda.synchronize()
    try:
        st.chain()
        torch.cuda.synchronize()
        attention_error = None
    except (NotImplementedError, ValueError, TypeError, RuntimeError) as e:
        attention_error = e
        NOTES.append(f"{name} {shape}: the layer call is refused ({type(e).__name__}: {e})")
        print("# " + NOTES[-1], flush=True)
    nbytes = st.bytes()  # of the selection just made: the chain's, or the stages' when the chain is refused
    stages = {"scores": (st.scores_stage, nbytes["index_k"]), "topk": (st.topk_stage, None)}
    if attention_error is None:
        stages["attention"] = (st.attention_stage, nbytes["kv"] + 2 * p.batch * p.hq * D * 2)
    stage_us = {}
    for stage, (call, stage_bytes) in stages.items():
        us = timed(call, iters)
        stage_us[stage] = us
        rows.append(common.row(name, shape, stage, "msa", us, ceil=ceil,
                               gbps=None if stage_bytes is None else stage_bytes / (us * 1e-6) / 1e9))
    if attention_error is not None:
        rows.insert(0, error_row(name, shape, "chain", attention_error))
        rows.append(error_row(name, shape, "attention", attention_error))
        return rows, st, False
    us = timed(st.chain, iters)
    st.chain()  # the outputs of one call, for the checks and the accuracy line
    torch.cuda.synchronize()
    roof_us = nbytes["total"] / (ceil["copy_gbps"] * 1e3)
    bar = BARS.get((name, shape))
    extra = dict(roofline_us=round(roof_us, 2), index_k_bytes=nbytes["index_k"], kv_bytes=nbytes["kv"],
                 qo_bytes=nbytes["qo"], sum_of_stages_us=round(sum(stage_us.values()), 2),
                 topk_bad_rows=st.topk_bad_rows(), calls_per_graph=CALLS_PER_GRAPH, plan=plan.describe())
    if fp8:
        no_scales = nbytes["total"] - p.batch * p.kv_len * 4
        extra["ratio_excl_scales"] = round(no_scales / (ceil["copy_gbps"] * 1e3) / us, 4)
    if bar is not None:
        extra.update(bar=f"ratio>={bar}", meets_bar=roof_us / us >= bar)
    chain_row = common.row(name, shape, "chain", "msa", us, ceil=ceil, gbps=nbytes["total"] / (us * 1e-6) / 1e9,
                           max_err=round(st.max_err([0, p.batch - 1]), 5), **extra)
    total = sum(stage_us.values())
    rows.insert(0, chain_row)
    rows.append(common.row(name, shape, "sum-of-stages", "msa", total, ceil=ceil,
                           gbps=nbytes["total"] / (total * 1e-6) / 1e9))
    return rows, st, True


def accuracy(bf16: Step, fp8: Step, fp8_ok: bool) -> dict:
    """The fp8 layer against the bf16 one on the same data: selection recall and the output's distance."""
    acc = {"recall": round(selection_recall(bf16.block_idx.cpu().numpy(), fp8.block_idx.cpu().numpy()), 4)}
    if fp8_ok:
        a, b = fp8.out.float(), bf16.out.float()
        acc["out_max_abs"] = round(float((a - b).abs().max()), 5)
        acc["out_rel_fro"] = round(float((a - b).norm() / b.norm()), 5)
    return acc


def print_row(r: dict):
    cli.print_row(r, [("workload", 20), ("shape", 7), ("pattern", 14), ("impl", 18)],
                  ("sum_of_stages_us", "max_err", "topk_bad_rows", "recall", "out_max_abs", "out_rel_fro", "meets_bar"))


def bench_workload(workload: str, shape: str, batch: int, kv_len: int, ceil: dict, iters: int) -> list:
    p = Problem(shape, batch, kv_len)
    plan = msa.plan_decode(batch, 1, kv_len, num_qo_heads=p.hq, num_kv_heads=p.hkv, head_dim=D, page_size=BLOCK,
                           topk=TOPK, device="cuda")
    rows_bf16, st16, ok16 = measure_kind(p, plan, False, workload, shape, ceil, iters)
    rows_fp8, st8, ok8 = measure_kind(p, plan, True, workload, shape, ceil, iters)
    if ok16:
        acc = accuracy(st16, st8, ok8)
        rows_fp8[0].update(acc)
        line = f"recall {acc['recall']:.4f} of the bf16 selection's blocks"
        if "out_max_abs" in acc:
            line += f"; output vs bf16: max abs {acc['out_max_abs']}, rel Frobenius {acc['out_rel_fro']}"
        line = f"accuracy {workload}-fp8 {shape} (unit-variance data): {line}"
        NOTES.append(line)
        print("# " + line, flush=True)
    rows = rows_bf16 + rows_fp8
    if workload == "L-step-D-B64" and shape == "M3-TP1":
        fi = FLASHINFER_FP8_STEP_B64
        rows.append(common.row(f"{workload}-fp8", shape, "chain", "flashinfer-quoted", fi["us"], ratio=fi["ratio"],
                               quoted="shared/spec/benchmarks.md (not run here)"))
        if ok8:
            rows_fp8[0]["vs_flashinfer"] = round(fi["us"] / rows_fp8[0]["us"], 3)
    for r in rows:
        print_row(r)
    del p, plan, st16, st8
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the two M3-TP1 B=64 rows (bf16 and fp8)")
    ap.add_argument("--iters", type=int, default=30, help="graph replays timed per figure")
    cli.add_output_options(ap, "layer")
    args = ap.parse_args()
    load_gpu_modules()
    common.check_record(ap, args)
    torch.manual_seed(0)
    ceil = common.ceilings()
    rows = []
    for workload, shape, batch, kv_len in WORKLOADS[:1] if args.quick else WORKLOADS:
        rows += bench_workload(workload, shape, batch, kv_len, ceil, args.iters)
    note = ("flashinfer-quoted: FlashInfer's whole fp8 layer step at B=64 from the benchmark spec (not run here); "
            "its ratio counts no index-K scales (compare ratio_excl_scales). The fp8 chain rows carry the "
            "accuracy against the bf16 layer: recall of the bf16 selection's blocks, out_max_abs, out_rel_fro.\n\n"
            + "".join(f"- {line}\n" for line in NOTES))
    common.write_results("layer", ceil, rows, args.out_dir, record=args.record, note=note)


if __name__ == "__main__":
    main()
