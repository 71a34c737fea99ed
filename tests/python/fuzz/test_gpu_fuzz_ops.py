"""A seeded random-configuration sweep ("fuzz") of msa's other operations, as test_gpu_fuzz.py is of
msa.attention: block_scores and select_topk (the indexer's two steps), merge_states and build_page_table,
each against its float64 / numpy reference of msa_testing (ref_block_scores, ref_select_topk,
ref_merge_states) or a plain numpy construction (the page table). Each seed draws one valid configuration
(draw_<op>(seed, backend)) from np.random.default_rng([seed, op number]) alone, the data from
case["data_seed"]; the lengths are shrunk until the estimated CPU cost of building the data and running
the reference (<op>_cost, a conservative estimate) fits the op's budget. Every input and output is a view
over a poisoned storage (permuted memory orders, padded axes): unwritten output elements show as NaN /
-77, and the padding of the outputs must keep its poison. A failure prints the drawn case.

- block_scores: bf16 / fp16 queries (fp32 too on the CPU, head dim 16-128 there, 128 on the GPU) with keys
  of the same dtype or fp8 e4m3 with per-token scales (amax / 448, powers of two, or arbitrary; laid out
  like the cache or contiguous); 1-4 index-K heads x group 1-32 (M3: 4 heads over one K head, or one
  head per K head); page size 16-256, 7, 48, 192; the dense or flat page table, the slot-major pool,
  spare pages; decode batches (1-4 tokens per request, contexts up to ~6000, lengths around multiples of
  128, empty requests) and prefill chunks (up to 300 tokens after prefixes); causal or not, explicit
  qo_offset with keys after the chunk, non-causal rows that see no key; HKT / THK scores in any memory
  order, wider max_blocks, q rows past qo_indptr, strided q; the kernel-choice environment knobs. fp8 keys
  on sm_90's fp8-MMA prefill kernel (mt.fp8_mma_scores) are compared with the reference over its
  e4m3-rounded queries (mt.fp8_mma_queries) at mt.FP8_MMA_TOL, every other path exactly.
- select_topk: 1-16 heads, topk 1-64 (up to 100 on the CPU), forced blocks (M3's own block, force_begin,
  both, all slots forced); rows of 1 to ~2600 valid blocks (every keys-per-lane capacity and the
  shared-memory path past 2048), the decode form (uniform or ragged batches of 1-4 tokens, empty
  requests) and prefill chunks; scores distinct (normal, permutations, monotone), tied (few integers,
  bf16-rounded, constant), spanning every magnitude (denormals), with NaN / +-inf / -0 sprinkled and
  +inf past each row's valid blocks; HKT / THK scores in any memory order; the block_idx output as
  [T, H, topk], sglang's [H, T, topk] view or any order. Ties are compared exactly: the contract breaks
  them to the lower block (as test_indexer.py and test_gpu_indexer.py compare).
- merge_states: 1-33 parts, 0-300 tokens, 1-32 heads, head dim 0-512, fp32 / bf16 / fp16 parts and outputs
  (independently), lse spread from 0.01 to 8 around offsets up to +-100, empty parts (-inf, NaN values
  behind them), rows no part saw, lse returned / written in place / not asked for, any strides.
- build_page_table: pools of 1-12 rows x 1-4000 tokens, page size 1-256 (7, 48, 100 too); sglang's
  page-aligned slots, arbitrary slot ids, unassigned (-1) slots; int32 / int64 indices and lengths;
  repeated pool rows, lengths 0 / 1 / full / around page multiples; req_to_token strided or transposed;
  default, explicit or out-given widths with padded rows.

Tests: test_draws_are_valid_and_deterministic (CPU: every draw of both sweeps twice, its invariants, and
the CPU backend's validation accepting it on cheap data), test_cpu_fuzz_ops (the CPU backend on numpy
inputs, draws of its own: 20 seeds per op) and test_gpu_op (marked gpu: torch CUDA tensors, per op and seed).

    PYTHONPATH=build/python python3 -m pytest -q tests/python/fuzz/test_gpu_fuzz_ops.py
    PYTHONPATH=build/python python3 -m pytest -q "tests/python/fuzz/test_gpu_fuzz_ops.py::test_gpu_op[select_topk-seed17]"
    MSA_FUZZ_FIRST_SEED=1000 MSA_FUZZ_SEEDS=2000 PYTHONPATH=build/python python3 -m pytest -q -m gpu \
        tests/python/fuzz/test_gpu_fuzz_ops.py                       # a longer soak over other seeds
"""
import math
import os

import numpy as np
import pytest

import msa
import msa_testing as mt
from fuzz_testing import (decode_lengths, describe as fuzz_describe, gpu_seeds, offset_of, pick,
                          prefill_lengths, shrinking)

SEEDS = gpu_seeds(100)
CPU_SEEDS = range(20)
OPS = ("block_scores", "select_topk", "merge_states", "build_page_table")

# Estimated CPU seconds of building a case's data and running its reference, per case: GPU sweep / CPU
# sweep (where the C++ reference runs too). Measured (one core of the development machine, one BLAS
# thread as conftest sets): the GPU sweep's data + references take ~15 s over the 4 x 100 default seeds
# (block_scores ~9 s, select_topk ~6 s), the CPU tests of this file ~4 s in all.
BUDGET = {"block_scores": (1.0, 0.2), "select_topk": (0.6, 0.1), "merge_states": (0.15, 0.03),
          "build_page_table": (0.02, 0.01)}

# Cost constants (rather high than low). block_scores: ref_block_scores loops in Python over (token,
# head), gathers the visible keys of the head's K head as float64 rows and loops over their blocks;
# make_problem draws and rounds every q / K element (V is drawn with head dim 1), fp8 then quantizes K.
C_BS_ROW = 20e-6     # s per (token, head)
C_BS_KEY = 0.6e-9    # s per visible (token, head, key) x head dim: gather + dot (+ the C++ reference on the CPU)
C_BS_BLOCK = 1.5e-6  # s per visible (token, head, block)
C_GEN = 40e-9        # s per random element drawn and rounded
C_QUANT = 60e-9      # s per K element quantized to e4m3
# select_topk: ref_select_topk sorts each row's candidates with a Python key.
C_TK_ROW = 6e-6      # s per (token, head)
C_TK_BLOCK = 2e-6    # s per valid (token, head, block)
# merge_states: ref_merge_states is vectorized numpy; build_page_table's reference loops over requests.
C_MS_ELEM = 60e-9    # s per element of v_parts (draw, round, reference)
C_PT_ELEM = 30e-9    # s per req_to_token element drawn
C_PT_REQ = 20e-6     # s per request of the reference


def _order(r, n, p_natural, fixed_last=False):
    """A memory order of n logical axes (outermost first): the natural one, or a random permutation
    (keeping the last axis innermost when fixed_last)."""
    if r.random() < p_natural:
        return list(range(n))
    if fixed_last:
        return [int(a) for a in r.permutation(n - 1)] + [n - 1]
    return [int(a) for a in r.permutation(n)]


def _pad(r, n, p_none, hi=3, last=None):
    """Extra storage elements per logical axis (0 everywhere with probability p_none); `last` lists the
    paddings allowed for the last axis."""
    if r.random() < p_none:
        return [0] * n
    pad = [int(r.integers(0, hi)) for _ in range(n)]
    if last is not None:
        pad[-1] = pick(r, last)
    return pad


def _indptr(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _offsets(qo, kv, off):
    return np.asarray(off if off is not None else [k - q for q, k in zip(qo, kv)], np.int64)


def _visible_ends(qo, kv, off, causal):
    """Per query token of the batch: the end of its visible keys (causal: min(kv_len, pos + 1))."""
    ends = [np.minimum(k, o + np.arange(q) + 1) if causal else np.full(q, k)
            for q, k, o in zip(qo, kv, _offsets(qo, kv, off))]
    return np.maximum(np.concatenate(ends + [np.zeros(0, np.int64)]), 0).astype(np.int64)


def describe(case) -> str:
    return fuzz_describe(case, f"draw_{case['op']}({case['seed']}, {case['backend']!r})")


def _with_case(case, fn, *args, **kw):
    """fn(*args, **kw); any error carries the drawn case."""
    try:
        return fn(*args, **kw)
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n{describe(case)}") from e


def _checked(case, check, *args):
    try:
        check(*args)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{describe(case)}") from None


# ---- frameworks: numpy arrays for the CPU backend, torch tensors on "cuda" (or "cpu", a dry run) --------

class NumpyFW:
    """Arrays of the CPU sweep (bf16 / fp8 from ml_dtypes)."""

    def dtype(self, name):
        if name == "fp8":
            import ml_dtypes

            return np.dtype(ml_dtypes.float8_e4m3fn)
        if name in ("int32", "int64"):
            return np.dtype(name)
        return mt.numpy_dtype(name)

    def buffer(self, shape, order, pad, fill, dtype):
        """(storage, view): a view of logical `shape` over a storage whose axes run in `order` (outermost
        first), each longer by pad[axis], filled with `fill`."""
        storage = np.full([shape[a] + pad[a] for a in order], fill, self.dtype(dtype))
        view = storage[tuple(slice(0, shape[a]) for a in order)]
        return storage, view.transpose([order.index(i) for i in range(len(shape))])

    def tensor(self, a, dtype):
        """a (numpy, maybe a strided view) in `dtype`; astype keeps the memory order."""
        return None if a is None else a.astype(self.dtype(dtype))

    def assign(self, view, values):
        view[...] = values

    def fill(self, view, value):
        view[...] = value

    def numpy(self, t):
        a = np.asarray(t)
        return a.astype(np.int64) if a.dtype.kind in "iu" else a.astype(np.float64)

    def sync(self):
        pass


class TorchFW:
    """torch tensors on `device`; strided numpy views keep their strides (as mt.to_torch does)."""

    def __init__(self, torch, device):
        self.torch, self.device = torch, device

    def dtype(self, name):
        t = self.torch
        return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32, "fp8": t.float8_e4m3fn,
                "int32": t.int32, "int64": t.int64}[name]

    def buffer(self, shape, order, pad, fill, dtype):
        storage = self.torch.full([shape[a] + pad[a] for a in order], fill, dtype=self.dtype(dtype),
                                  device=self.device)
        view = storage[tuple(slice(0, shape[a]) for a in order)]
        return storage, view.permute(*[order.index(i) for i in range(len(shape))])

    def tensor(self, a, dtype):
        if a is None:
            return None
        t = self.torch
        if not a.flags["C_CONTIGUOUS"] and a.base is not None and a.size:
            owner, strides = mt._spanned_memory(a)
            return t.from_numpy(owner).to(device=self.device, dtype=self.dtype(dtype)).as_strided(a.shape, strides)
        return t.from_numpy(np.array(a, order="C")).to(device=self.device, dtype=self.dtype(dtype))

    def assign(self, view, values):
        view.copy_(self.torch.from_numpy(np.ascontiguousarray(values)).to(self.device))

    def fill(self, view, value):
        view.fill_(value)

    def numpy(self, t):
        t = t.detach().cpu()
        if t.is_floating_point():
            return t.double().numpy()
        return t.long().numpy()

    def sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()


def _untouched(fw, case, storage, view, poison, what):
    """After the view was read: re-poison it; the whole storage must then hold the poison (the op wrote
    nothing outside its output)."""
    if storage is None:
        return
    fw.fill(view, poison)
    s = fw.numpy(storage)
    ok = np.isnan(s).all() if isinstance(poison, float) and math.isnan(poison) else (s == poison).all()
    if not ok:
        raise AssertionError(f"{what}: elements outside the output view were written\n{describe(case)}")


# ======== block_scores ==================================================================================

def block_scores_cost(case) -> float:
    """Estimated CPU seconds of build_block_scores + ref_block_scores (and the C++ reference on the CPU)."""
    H, Hk, D, P = case["num_heads"], case["num_k_heads"], case["head_dim"], case["page_size"]
    ends = _visible_ends(case["qo_lens"], case["kv_lens"], case["qo_offset"], case["causal"])
    keys, blocks, rows = int(ends.sum()) * H, int(-(-ends // mt.BLOCK).sum()) * H, len(ends) * H
    k_elems = (sum(math.ceil(k / P) for k in case["kv_lens"]) + case["spare_pages"]) * P * Hk * D
    q_elems = (len(ends) + case["extra_q_rows"]) * H * D
    cpp = 2.0 if case["backend"] == "cpu" else 1.0
    return (rows * C_BS_ROW + keys * D * C_BS_KEY * cpp + blocks * C_BS_BLOCK
            + (k_elems * (1 + 1 / D) + q_elems) * C_GEN + (k_elems * C_QUANT if case["k_dtype"] == "fp8" else 0.0))


def draw_block_scores(seed: int, backend: str = "gpu") -> dict:
    """One valid block_scores configuration (see the module docstring); backend "gpu" draws what the CUDA
    indexer serves (head dim 128, bf16 / fp16 queries), "cpu" also fp32 and head dims 16-64, with a smaller
    budget and outputs msa allocates."""
    assert backend in ("gpu", "cpu")
    r = np.random.default_rng([seed, 1])
    decode = r.random() < 0.55
    if backend == "gpu":
        dtype, head_dim = pick(r, ["bf16", "fp16"], [0.75, 0.25]), 128
    else:
        dtype = pick(r, ["bf16", "fp16", "fp32"], [0.5, 0.2, 0.3])
        head_dim = pick(r, [16, 32, 64, 128], [0.3, 0.3, 0.2, 0.2])
    k_dtype = "fp8" if r.random() < 0.3 else dtype
    num_k_heads = pick(r, [1, 2, 4], [0.5, 0.3, 0.2])
    group = pick(r, [1, 2, 3, 4, 8, 12, 16, 32], [0.1, 0.08, 0.04, 0.4, 0.12, 0.04, 0.14, 0.08])
    if r.random() < 0.25:  # MiniMax-M3: 4 index heads over one K head, or one index head per KV head
        num_k_heads, group = (1, 4) if r.random() < 0.6 else (pick(r, [1, 4]), 1)
    case = dict(
        op="block_scores", seed=seed, backend=backend, phase="decode" if decode else "prefill",
        dtype=dtype, k_dtype=k_dtype, head_dim=head_dim, num_heads=group * num_k_heads, num_k_heads=num_k_heads,
        page_size=pick(r, [16, 32, 64, 128, 256, 48, 7, 192], [0.1, 0.1, 0.2, 0.3, 0.12, 0.06, 0.06, 0.06]),
        causal=r.random() < 0.85, flat_pages=r.random() < 0.3, slot_major=r.random() < 0.25,
        spare_pages=pick(r, [0, 1, 3], [0.2, 0.4, 0.4]),
        fp8_scale=pick(r, ["amax", "pow2", "uniform"], [0.5, 0.25, 0.25]) if k_dtype == "fp8" else None,
        scale_layout=pick(r, ["cache", "contiguous"]) if k_dtype == "fp8" else None,
        layout=pick(r, ["HKT", "THK"]),
        q_order=[0, 1, 2] if r.random() < 0.85 else [1, 0, 2],
        q_pad=_pad(r, 3, 0.8, last=[0, 8]),
        out_order=_order(r, 3, 0.7), out_pad=_pad(r, 3, 0.75),
        extra_blocks=0 if r.random() < 0.6 else int(r.integers(1, 6)),
        extra_q_rows=0 if r.random() < 0.85 else int(r.integers(1, 7)),
        out_mode="given" if backend == "gpu" or r.random() < 0.6 else "alloc",
        pass_max_blocks=r.random() < 0.5,
        validate=r.random() < 0.1,
        env=pick(r, [{}, {"MSA_INDEXER_DECODE": "stream"}, {"MSA_INDEXER_PREFILL": "portable"}],
                 [0.75, 0.15, 0.1]) if backend == "gpu" else {},
    )
    causal, explicit_offset, zero_q = case["causal"], r.random() < 0.25, r.random() < 0.2
    B = int(r.integers(1, 13)) if decode else int(r.integers(1, 5))
    qmax = pick(r, [1, 2, 3, 4], [0.5, 0.2, 0.1, 0.2])
    ragged = qmax > 1 and r.random() < 0.5
    budget = BUDGET["block_scores"][backend == "cpu"]
    for attempt, scale, B in shrinking(f"draw_block_scores({seed})", B):
        qo, kv, off = (decode_lengths(r, B, qmax, ragged, zero_q, causal, explicit_offset, scale, long_max=6001,
                                      edge_blocks=40) if decode else
                       prefill_lengths(r, B, zero_q, causal, explicit_offset, scale, prefix_max=2000, edge_blocks=16))
        if attempt == 10:
            case["spare_pages"] = 0
        if sum(kv) == 0:
            case["spare_pages"] = max(case["spare_pages"], 1)  # a pool of at least one page
        case.update(qo_lens=qo, kv_lens=kv, qo_offset=off if explicit_offset else None)
        if block_scores_cost(case) <= budget:
            break
    case.update(data_seed=[seed, 1, 1], est_cost=round(block_scores_cost(case), 4))
    return case


def _round_e4m3(x):
    """float32 values rounded to float8 e4m3 (nearest even; |x| <= 448), as float32."""
    x = np.asarray(x, np.float64)
    _, e = np.frexp(np.abs(x))
    quantum = np.ldexp(1.0, np.maximum(e - 1, -6) - 3)
    y = np.round(x / quantum) * quantum
    assert np.abs(y).max(initial=0.0) <= 448
    return y.astype(np.float32)


def _quantize_keys(k_cache, kind, scale_layout, r):
    """Per-token e4m3 quantization of a [pages, Hk, P, D] cache (maybe a strided view): e4m3 values as
    float32 in the cache's layout, and the fp32 scales [pages, Hk, P] (in the cache's layout, or
    contiguous)."""
    D = k_cache.shape[-1]
    flat, strides = mt._spanned_memory(k_cache)
    rows = flat.reshape(-1, D)  # the storage's token rows (both make_problem layouts have D innermost)
    amax = np.maximum(np.abs(rows).max(axis=1), np.float32(1e-12)).astype(np.float32)
    if kind == "amax":
        scale = (amax / np.float32(448)).astype(np.float32)
    elif kind == "pow2":
        scale = np.exp2(np.ceil(np.log2(amax / np.float32(448)))).astype(np.float32)
    else:
        scale = r.uniform(0.5, 2.0, len(amax)).astype(np.float32)
    k8 = _round_e4m3((rows / scale[:, None]).astype(np.float32)).reshape(-1)
    as_strided = np.lib.stride_tricks.as_strided
    values = as_strided(k8, shape=k_cache.shape, strides=[s * 4 for s in strides], writeable=False)
    scales = as_strided(scale, shape=k_cache.shape[:3], strides=[s // D * 4 for s in strides[:3]], writeable=False)
    return values, (np.ascontiguousarray(scales) if scale_layout == "contiguous" else scales)


def build_block_scores(case, **override) -> dict:
    """The case's data: prob (mt.Problem without selections; V of head dim 1), the key values the
    reference reads (e4m3 values for fp8) and their scales, the extra q rows, max_blocks."""
    c = dict(case, **override)
    r = np.random.default_rng(c["data_seed"])
    prob = mt.make_problem(r, qo_lens=c["qo_lens"], kv_lens=c["kv_lens"], qo_offset=c["qo_offset"],
                           num_qo_heads=c["num_heads"], num_kv_heads=c["num_k_heads"], head_dim=c["head_dim"],
                           head_dim_v=1, page_size=c["page_size"], causal=c["causal"], pattern=None,
                           flat_pages=c["flat_pages"], slot_major=c["slot_major"], dtype=c["dtype"],
                           spare_pages=c["spare_pages"])
    k_values, k_scale = prob.k_cache, None
    if c["k_dtype"] == "fp8":
        k_values, k_scale = _quantize_keys(prob.k_cache, c["fp8_scale"], c["scale_layout"], r)
    q_extra = mt.round_to(r.standard_normal((c["extra_q_rows"], c["num_heads"], c["head_dim"])), c["dtype"])
    nb = math.ceil(max(c["kv_lens"]) / mt.BLOCK) + c["extra_blocks"]
    return dict(prob=prob, k_values=k_values, k_scale=k_scale, q_extra=q_extra, nb=nb)


def run_block_scores(fw, case, data, dtype=None, k_dtype=None):
    """msa.block_scores on fw's tensors: scores [n, H, max_blocks] (THK, float64) of the batch's n tokens."""
    prob = data["prob"]
    n, H, D = prob.q.shape
    Tq, nb = n + case["extra_q_rows"], data["nb"]
    q_store, q = fw.buffer((Tq, H, D), case["q_order"], case["q_pad"], float("nan"), dtype or case["dtype"])
    fw.assign(q, np.concatenate([prob.q, data["q_extra"]]))
    k = fw.tensor(data["k_values"], k_dtype or case["k_dtype"])
    k_scale = fw.tensor(data["k_scale"], "fp32")
    ints = {name: fw.tensor(getattr(prob, name), "int32")
            for name in ("page_table", "page_indptr", "qo_indptr", "kv_lens", "qo_offset")}
    shape = (H, nb, Tq) if case["layout"] == "HKT" else (Tq, H, nb)
    store = out = None
    max_blocks = nb if case["pass_max_blocks"] or case["extra_blocks"] else None
    if case["out_mode"] == "given":
        store, out = fw.buffer(shape, case["out_order"], case["out_pad"], float("nan"), "fp32")
        max_blocks = nb if case["pass_max_blocks"] else None
    res = _with_case(case, msa.block_scores, q, k, ints["page_table"], ints["qo_indptr"], ints["kv_lens"],
                     qo_offset=ints["qo_offset"], page_indptr=ints["page_indptr"], k_scale=k_scale,
                     max_blocks=max_blocks, layout=case["layout"], causal=case["causal"], out=out,
                     validate=case["validate"])
    fw.sync()
    assert out is None or res is out
    assert tuple(res.shape) == shape, (tuple(res.shape), shape)
    got = fw.numpy(res)
    got = got if case["layout"] == "THK" else got.transpose(2, 0, 1)
    _untouched(fw, case, store, out, float("nan"), "scores")
    _untouched(fw, case, q_store, q, float("nan"), "q (an input)")
    return got[:n]


def _on_fp8_mma(case, prob):
    """Whether the CUDA call of the case (its environment set) runs the fp8-MMA kernel."""
    return case["k_dtype"] == "fp8" and mt.fp8_mma_scores(
        prob.q.shape[0] + case["extra_q_rows"], len(prob.kv_lens), case["num_heads"], case["num_k_heads"],
        mt.kernel_capability(), os.environ)


def check_block_scores(case, data, got, gpu=False):
    """test_gpu_indexer.assert_scores_equal against ref_block_scores: no NaN (unwritten), the same -inf
    pattern, rtol 1e-4 / atol 1e-3 elsewhere (on the fp8-MMA kernel: over its e4m3-rounded queries, at
    mt.FP8_MMA_TOL)."""
    prob = data["prob"]
    q, tol = prob.q, dict(rtol=1e-4, atol=1e-3)
    if gpu and _on_fp8_mma(case, prob):
        q, tol = mt.fp8_mma_queries(prob.q), mt.FP8_MMA_TOL
    ref = mt.ref_block_scores(q, data["k_values"], prob.page_table, prob.page_indptr, prob.qo_indptr,
                              prob.kv_lens, qo_offset=prob.qo_offset, causal=case["causal"], max_blocks=data["nb"],
                              k_scale=data["k_scale"])

    def compare():
        assert got.shape == ref.shape, (got.shape, ref.shape)
        nan = np.isnan(got)
        assert not nan.any(), f"NaN left in the scores (unwritten) at [t, h, block] {np.argwhere(nan)[:5].tolist()}"
        bad = np.isneginf(got) != np.isneginf(ref)
        assert not bad.any(), (f"-inf pattern (blocks without visible keys) differs at [t, h, block] "
                               f"{np.argwhere(bad)[:5].tolist()}")
        fin = ~np.isneginf(ref)
        np.testing.assert_allclose(got[fin], ref[fin], **tol)

    _checked(case, compare)


def _block_scores_valid(case):
    """The CPU backend's validation (validate=True) accepts the case, on cheap data (head dim 8, fp32)."""
    data = build_block_scores(case, head_dim=8, dtype="fp32", k_dtype="fp32")
    cheap = dict(case, validate=True, out_mode="given")
    run_block_scores(NumpyFW(), cheap, data, dtype="fp32", k_dtype="fp32")


def _block_scores_invariants(case):
    qo, kv = np.array(case["qo_lens"]), np.array(case["kv_lens"])
    off = _offsets(qo, kv, case["qo_offset"])
    assert 1 <= len(qo) <= 12 and (qo >= 0).all() and (kv >= 0).all() and (off >= 0).all()
    if case["causal"]:
        assert (off + qo <= kv).all()
    assert case["num_heads"] % case["num_k_heads"] == 0
    if case["backend"] == "gpu":
        assert case["head_dim"] == 128 and case["dtype"] in ("bf16", "fp16") and case["out_mode"] == "given"
        assert case["k_dtype"] in (case["dtype"], "fp8")
        assert case["q_pad"][2] * 2 % 16 == 0  # q strides stay multiples of 16 bytes


# ======== select_topk ===================================================================================

TK_EDGES = [1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025, 2047,
            2048]


def _tk_lengths(r, B, decode, qmax, ragged, zero_q, causal, explicit_offset, scale, topk, smem):
    qo, kv, off = [], [], []
    for _ in range(B):
        kind = pick(r, ["few", "mid", "long", "edge", "smem"],
                     [0.2, 0.35, 0.2, 0.2, 0.05 if smem else 0.0])
        if kind == "few":  # around topk: every valid block, or just past it
            nkv = int(r.integers(1, topk + 4))
        elif kind == "mid":
            nkv = int(r.integers(2, 300))
        elif kind == "long":
            nkv = int(r.integers(300, 2049))
        elif kind == "edge":  # the keys-per-lane capacities (32 blocks per power of two)
            nkv = pick(r, TK_EDGES)
        else:  # past 2048 blocks: the shared-memory kernel
            nkv = int(r.integers(2049, 2601))
        kl = max(int((nkv * mt.BLOCK - int(r.integers(0, mt.BLOCK))) * scale), 1)
        if decode:
            ql = int(r.integers(1, qmax + 1)) if ragged else qmax
        else:
            ql = max(int(pick(r, [1, int(r.integers(2, 41)), int(r.integers(41, 401))], [0.1, 0.4, 0.5]) * scale), 1)
        if zero_q and r.random() < 0.2:
            ql = 0
            if r.random() < 0.4:
                kl = 0  # an empty request
        kl = max(kl, ql)
        o, kl = offset_of(r, ql, kl, causal, explicit_offset)
        qo.append(ql)
        kv.append(kl)
        off.append(o)
    return qo, kv, off


def _valid_blocks(qo, kv, off, causal):
    """Per query token of the batch: its number of valid blocks (contract §4)."""
    out = []
    for q, k, o in zip(qo, kv, _offsets(qo, kv, off)):
        nkv = -(-k // mt.BLOCK)
        pos = o + np.arange(q)
        out.append(np.minimum(np.maximum(pos, -1) // mt.BLOCK + 1, nkv) if causal else np.full(q, nkv))
    return np.concatenate(out + [np.zeros(0, np.int64)]).astype(np.int64)


def select_topk_cost(case) -> float:
    n = _valid_blocks(case["qo_lens"], case["kv_lens"], case["qo_offset"], case["causal"])
    H, T = case["num_heads"], len(n) + case["extra_rows"]
    return len(n) * H * C_TK_ROW + int(n.sum()) * H * C_TK_BLOCK + T * H * case["max_blocks"] * C_GEN


def draw_select_topk(seed: int, backend: str = "gpu") -> dict:
    """One valid select_topk configuration (see the module docstring); "cpu" also draws topk past 64 and
    outputs msa allocates."""
    assert backend in ("gpu", "cpu")
    r = np.random.default_rng([seed, 2])
    decode = r.random() < 0.5
    topk = pick(r, [1, 2, 4, 8, 16, 32, 64, int(r.integers(1, 65))], [0.04, 0.04, 0.08, 0.12, 0.38, 0.14, 0.1, 0.1])
    if backend == "cpu" and r.random() < 0.15:
        topk = int(r.integers(65, 101))
    fkind = pick(r, ["m3", "none", "begin", "both", "random", "all"], [0.45, 0.15, 0.08, 0.1, 0.17, 0.05])
    if fkind == "m3":
        force = (0, 1)
    elif fkind == "none":
        force = (0, 0)
    elif fkind == "begin":
        force = (min(int(r.integers(1, 4)), topk), 0)
    elif fkind == "both":
        force = (1, 1) if topk >= 2 else (0, 1)
    else:  # random split, or every slot forced (no block chosen by score)
        fb = int(r.integers(0, topk + 1))
        fe = topk - fb if fkind == "all" else int(r.integers(0, topk - fb + 1))
        force = (fb, fe)
    skind = pick(r, ["normal", "perm", "monotone", "ties", "bf16", "constant", "wide"],
                  [0.3, 0.12, 0.08, 0.2, 0.12, 0.05, 0.13])
    case = dict(
        op="select_topk", seed=seed, backend=backend, phase="decode" if decode else "prefill",
        num_heads=pick(r, [1, 2, 4, 8, 16], [0.15, 0.2, 0.4, 0.15, 0.1]), topk=topk,
        force_begin=force[0], force_end=force[1], causal=r.random() < 0.85,
        scores=skind, ties=pick(r, [2, 3, 5, 9]) if skind == "ties" else None,
        nan_frac=pick(r, [0.0, 0.02, 0.2], [0.6, 0.25, 0.15]), ninf_frac=pick(r, [0.0, 0.05, 0.3], [0.6, 0.3, 0.1]),
        pinf_frac=pick(r, [0.0, 0.02], [0.8, 0.2]), zero_frac=pick(r, [0.0, 0.05], [0.75, 0.25]),
        poison_tail=r.random() < 0.4,
        layout=pick(r, ["HKT", "THK"]), scores_order=_order(r, 3, 0.7), scores_pad=_pad(r, 3, 0.75),
        out_layout=pick(r, ["THK", "HTK", "any"], [0.6, 0.3, 0.1]), out_pad=_pad(r, 3, 0.8),
        extra_rows=0 if r.random() < 0.85 else int(r.integers(1, 7)),
        out_mode="given" if backend == "gpu" or r.random() < 0.6 else "alloc",
        validate=r.random() < 0.1,
    )
    any_order = [int(a) for a in r.permutation(3)]
    case["out_order"] = {"THK": [0, 1, 2], "HTK": [1, 0, 2], "any": any_order}[case["out_layout"]]
    explicit_offset, zero_q = r.random() < 0.25, r.random() < 0.25
    B = int(r.integers(1, 17)) if decode else int(r.integers(1, 4))
    qmax = pick(r, [1, 2, 3, 4], [0.5, 0.2, 0.1, 0.2])
    ragged = qmax > 1 and r.random() < 0.5
    smem = decode and r.random() < 0.3
    extra_blocks = 0 if r.random() < 0.6 else int(r.integers(1, 41))
    budget = BUDGET["select_topk"][backend == "cpu"]
    for _, scale, B in shrinking(f"draw_select_topk({seed})", B):
        qo, kv, off = _tk_lengths(r, B, decode, qmax, ragged, zero_q, case["causal"], explicit_offset, scale,
                                  topk, smem)
        case.update(qo_lens=qo, kv_lens=kv, qo_offset=off if explicit_offset else None,
                    max_blocks=max(-(-max(kv) // mt.BLOCK) + extra_blocks, 1))
        if select_topk_cost(case) <= budget:
            break
    case.update(data_seed=[seed, 2, 1], est_cost=round(select_topk_cost(case), 4))
    return case


def build_select_topk(case) -> dict:
    """Scores [T, H, max_blocks] (THK, float32; T counts the rows past qo_indptr) of the case's kind, with
    +inf past each row's valid blocks when poison_tail (no kernel may take those), and the lengths."""
    r = np.random.default_rng(case["data_seed"])
    qo_indptr = _indptr(case["qo_lens"])
    T, H, NB = int(qo_indptr[-1]) + case["extra_rows"], case["num_heads"], case["max_blocks"]
    kind, shape = case["scores"], (T, H, NB)
    if kind == "normal":
        s = r.standard_normal(shape)
    elif kind == "perm":  # distinct values, a random order per row
        s = r.random(shape).argsort(axis=-1)
    elif kind == "monotone":
        s = np.broadcast_to(np.arange(NB) * pick(r, [1.0, -1.0]), shape)
    elif kind == "ties":
        s = r.integers(0, case["ties"], shape)
    elif kind == "bf16":
        s = mt.round_to(r.standard_normal(shape) * 4, "bf16")
    elif kind == "constant":
        s = np.full(shape, float(r.standard_normal()))
    else:  # every magnitude, denormals and zeros of both signs included
        s = np.where(r.random(shape) < 0.5, -1.0, 1.0) * 10.0 ** r.uniform(-46, 38.5, shape)
    s = np.array(s, np.float32)
    for frac, value in ((case["zero_frac"], -0.0), (case["zero_frac"], 0.0), (case["pinf_frac"], np.inf),
                        (case["ninf_frac"], -np.inf), (case["nan_frac"], np.nan)):
        if frac:
            s[r.random(shape) < frac] = value
    if case["poison_tail"]:
        n = _valid_blocks(case["qo_lens"], case["kv_lens"], case["qo_offset"], case["causal"])
        tail = np.arange(NB)[None, :] >= n[:, None]
        s[:len(n)][np.broadcast_to(tail[:, None, :], (len(n), H, NB))] = np.inf
    return dict(scores=s, qo_indptr=qo_indptr, kv_lens=np.asarray(case["kv_lens"], np.int32),
                qo_offset=None if case["qo_offset"] is None else np.asarray(case["qo_offset"], np.int32))


def run_select_topk(fw, case, data):
    """msa.select_topk on fw's tensors: block_idx [n, H, topk] (int64) of the batch's n tokens."""
    s = data["scores"]
    T, H, NB = s.shape
    shape = (H, NB, T) if case["layout"] == "HKT" else (T, H, NB)
    s_store, scores = fw.buffer(shape, case["scores_order"], case["scores_pad"], float("inf"), "fp32")
    fw.assign(scores, s.transpose(1, 2, 0) if case["layout"] == "HKT" else s)
    store = out = None
    if case["out_mode"] == "given":
        store, out = fw.buffer((T, H, case["topk"]), case["out_order"], case["out_pad"], -77, "int32")
    res = _with_case(case, msa.select_topk, scores, fw.tensor(data["qo_indptr"], "int32"),
                     fw.tensor(data["kv_lens"], "int32"), case["topk"], qo_offset=fw.tensor(data["qo_offset"], "int32"),
                     layout=case["layout"], force_begin=case["force_begin"], force_end=case["force_end"],
                     causal=case["causal"], out=out, validate=case["validate"])
    fw.sync()
    assert out is None or res is out
    assert tuple(res.shape) == (T, H, case["topk"])
    got = fw.numpy(res)
    _untouched(fw, case, store, out, -77, "block_idx")
    _untouched(fw, case, s_store, scores, float("inf"), "scores (an input)")
    return got[:int(data["qo_indptr"][-1])]


def check_select_topk(case, data, got):
    """Exactly ref_select_topk (ascending, -1 tail, NaN lowest, ties to the lower block)."""
    n = int(data["qo_indptr"][-1])
    ref = mt.ref_select_topk(data["scores"][:n], data["qo_indptr"], data["kv_lens"], case["topk"],
                             qo_offset=data["qo_offset"], force_begin=case["force_begin"],
                             force_end=case["force_end"], causal=case["causal"])

    def compare():
        assert got.shape == ref.shape, (got.shape, ref.shape)
        bad = np.argwhere((got != ref).any(axis=-1))
        if len(bad):
            t, h = (int(x) for x in bad[0])
            nv = _valid_blocks(case["qo_lens"], case["kv_lens"], case["qo_offset"], case["causal"])[t]
            raise AssertionError(f"{len(bad)} rows differ; first (token {t}, head {h}, {nv} valid blocks):\n"
                                 f"  got  {got[t, h].tolist()}\n  want {ref[t, h].tolist()}")

    _checked(case, compare)


def _select_topk_valid(case):
    data = build_select_topk(case)
    run_select_topk(NumpyFW(), dict(case, validate=True, out_mode="given"), data)


def _select_topk_invariants(case):
    qo, kv = np.array(case["qo_lens"]), np.array(case["kv_lens"])
    off = _offsets(qo, kv, case["qo_offset"])
    assert 1 <= len(qo) <= 16 and (qo >= 0).all() and (kv >= 0).all() and (off >= 0).all()
    if case["causal"]:
        assert (off + qo <= kv).all()
    assert case["max_blocks"] >= -(-kv.max() // mt.BLOCK)
    assert case["force_begin"] >= 0 and case["force_end"] >= 0
    assert case["force_begin"] + case["force_end"] <= case["topk"]
    if case["backend"] == "gpu":
        assert 1 <= case["topk"] <= 64 and case["out_mode"] == "given"


# ======== merge_states ==================================================================================

def merge_states_cost(case) -> float:
    S, T, H, D = case["shape"]
    return S * T * H * max(D, 1) * C_MS_ELEM + S * T * H * 10 * C_GEN


def draw_merge_states(seed: int, backend: str = "gpu") -> dict:
    """One valid merge_states configuration (see the module docstring)."""
    assert backend in ("gpu", "cpu")
    r = np.random.default_rng([seed, 3])
    S = pick(r, [1, 2, 3, 4, 5, 8, 16, 33], [0.12, 0.25, 0.12, 0.15, 0.06, 0.12, 0.12, 0.06])
    tkind = pick(r, ["zero", "small", "mid"], [0.04, 0.4, 0.56])
    T = 0 if tkind == "zero" else int(r.integers(1, 9)) if tkind == "small" else int(r.integers(9, 301))
    H = pick(r, [1, 2, 4, 6, 8, 16, 32], [0.1, 0.1, 0.2, 0.1, 0.2, 0.2, 0.1])
    D = pick(r, [0, 1, 8, 64, 72, 128, 256, 512], [0.02, 0.04, 0.08, 0.2, 0.1, 0.34, 0.14, 0.08])
    v_dtype = pick(r, ["fp32", "bf16", "fp16"], [0.35, 0.4, 0.25])
    out_dtype = v_dtype if r.random() < 0.5 else pick(r, ["fp32", "bf16", "fp16"])
    case = dict(
        op="merge_states", seed=seed, backend=backend, v_dtype=v_dtype, out_dtype=out_dtype,
        lse_mode=pick(r, ["given", "return", "none"], [0.5, 0.3, 0.2]),
        spread=pick(r, [0.01, 0.5, 2.0, 8.0]), shift=r.random() < 0.3,
        empty_frac=pick(r, [0.0, 0.1, 0.3, 0.7, 1.0], [0.2, 0.35, 0.25, 0.15, 0.05]),
        empty_rows=pick(r, [0.0, 0.05, 0.3], [0.6, 0.3, 0.1]), nan_behind_empty=r.random() < 0.5,
        v_order=_order(r, 4, 0.6, fixed_last=True), v_pad=_pad(r, 4, 0.7, last=[0, 1, 8]),
        lse_order=_order(r, 3, 0.7), lse_pad=_pad(r, 3, 0.75),
        out_mode="given" if backend == "gpu" or r.random() < 0.7 else "alloc",
        out_order=_order(r, 3, 0.7, fixed_last=True), out_pad=_pad(r, 3, 0.75, last=[0, 1, 8]),
        lse_out_order=_order(r, 2, 0.7), lse_out_pad=_pad(r, 2, 0.75),
    )
    if case["out_mode"] == "alloc":
        case["out_dtype"] = v_dtype  # msa allocates o in the parts' dtype
    budget = BUDGET["merge_states"][backend == "cpu"]
    while True:  # halve the tokens (down to 8), then the parts, then the heads
        case["shape"] = [S, T, H, D]
        if merge_states_cost(case) <= budget:
            break
        T, S, H = (T // 2, S, H) if T > 8 else (T, S // 2, H) if S > 1 else (T, S, max(1, H // 2))
    case.update(data_seed=[seed, 3, 1], est_cost=round(merge_states_cost(case), 4))
    return case


def build_merge_states(case) -> dict:
    """v [S, T, H, D] (float32 values of v_dtype's precision; NaN behind some empty parts) and lse [S, T, H]
    (float32: offsets, spread, -inf parts, rows with every part at -inf)."""
    r = np.random.default_rng(case["data_seed"])
    S, T, H, D = case["shape"]
    v = mt.round_to(r.standard_normal((S, T, H, D)), case["v_dtype"])
    lse = r.standard_normal((S, T, H)) * case["spread"]
    if case["shift"]:
        lse = lse + r.uniform(-100, 100, (1, T, H))
    lse = lse.astype(np.float32)
    lse[r.random((S, T, H)) < case["empty_frac"]] = -np.inf
    lse[:, r.random(T) < case["empty_rows"]] = -np.inf
    if case["nan_behind_empty"]:
        v[np.broadcast_to(np.isneginf(lse)[..., None], v.shape)] = np.nan  # never read
    return dict(v=v, lse=lse)


def run_merge_states(fw, case, data):
    """msa.merge_states on fw's tensors: (o, lse_out or None) as float64 numpy."""
    S, T, H, D = case["shape"]
    v_store, v = fw.buffer((S, T, H, D), case["v_order"], case["v_pad"], float("nan"), case["v_dtype"])
    fw.assign(v, data["v"])
    l_store, lse = fw.buffer((S, T, H), case["lse_order"], case["lse_pad"], float("nan"), "fp32")
    fw.assign(lse, data["lse"])
    o_store = out = lo_store = lse_out = None
    if case["out_mode"] == "given":
        o_store, out = fw.buffer((T, H, D), case["out_order"], case["out_pad"], float("nan"), case["out_dtype"])
    if case["lse_mode"] == "given":
        lo_store, lse_out = fw.buffer((T, H), case["lse_out_order"], case["lse_out_pad"], float("nan"), "fp32")
    res = _with_case(case, msa.merge_states, v, lse, out=out, lse_out=lse_out,
                     return_lse=case["lse_mode"] == "return")
    fw.sync()
    o, lse_res = res if case["lse_mode"] == "return" else (res, lse_out)
    assert out is None or o is out
    assert tuple(o.shape) == (T, H, D) and (lse_res is None or tuple(lse_res.shape) == (T, H))
    got = fw.numpy(o), None if lse_res is None else fw.numpy(lse_res)
    _untouched(fw, case, o_store, out, float("nan"), "out")
    _untouched(fw, case, lo_store, lse_out, float("nan"), "lse_out")
    return got


def check_merge_states(case, data, got, gpu):
    """ref_merge_states with the tolerances of test_gpu_attention.test_merge_states on the GPU (rel 1e-2,
    atol 2e-2, lse atol 1e-4) and of test_merge_states.py on the CPU (fp32 out: 1e-5; lse: 1e-5)."""
    o_ref, lse_ref = mt.ref_merge_states(data["v"], data["lse"])
    o, lse = got
    tol = dict(rel=1e-5, atol=1e-5) if not gpu and case["out_dtype"] == "fp32" else {}

    def compare():
        mt.assert_close(o, o_ref, **tol)
        if lse is not None:
            mt.assert_lse_close(lse, lse_ref, atol=1e-4 if gpu else 1e-5)
        empty = np.isneginf(lse_ref)
        assert (o[empty] == 0).all(), "rows no part saw must give o = 0"

    _checked(case, compare)


def _merge_states_invariants(case):
    S, T, H, D = case["shape"]
    assert S >= 1 and T >= 0 and H >= 1 and D >= 0
    assert case["v_order"][-1] == 3 and case["out_order"][-1] == 2  # innermost dims contiguous
    if case["backend"] == "gpu":
        assert case["out_mode"] == "given"


def _merge_states_valid(case):
    data = build_merge_states(case)
    run_merge_states(NumpyFW(), dict(case, v_dtype="fp32", out_dtype="fp32"), data)


# ======== build_page_table ==============================================================================

def build_page_table_cost(case) -> float:
    return case["pool"] * case["max_context"] * C_PT_ELEM + len(case["seq_lens"]) * C_PT_REQ


def draw_build_page_table(seed: int, backend: str = "gpu") -> dict:
    """One valid build_page_table configuration (see the module docstring)."""
    assert backend in ("gpu", "cpu")
    r = np.random.default_rng([seed, 4])
    P = pick(r, [1, 2, 7, 16, 32, 48, 64, 100, 128, 256], [0.06, 0.04, 0.05, 0.15, 0.1, 0.05, 0.2, 0.05, 0.2, 0.1])
    mkind = pick(r, ["small", "mid", "large"], [0.2, 0.5, 0.3])
    max_context = int(r.integers(1, 65)) if mkind == "small" else int(r.integers(65, 1001)) if mkind == "mid" \
        else int(r.integers(1001, 4001))
    pool = int(r.integers(1, 13))
    B = 0 if r.random() < 0.03 else int(r.integers(1, 11))
    lens = []
    for _ in range(B):
        kind = pick(r, ["zero", "one", "full", "edge", "any"], [0.1, 0.08, 0.12, 0.25, 0.45])
        n = {"zero": 0, "one": 1, "full": max_context, "any": int(r.integers(0, max_context + 1)),
             "edge": P * int(r.integers(0, max_context // P + 1)) + int(r.integers(-1, 2))}[kind]
        lens.append(int(min(max(n, 0), max_context)))
    need = max([-(-n // P) for n in lens], default=0)
    wkind = pick(r, ["default", "explicit", "out"], [0.4, 0.3, 0.3] if backend == "cpu" else [0.0, 0.0, 1.0])
    case = dict(
        op="build_page_table", seed=seed, backend=backend, page_size=P, pool=pool, max_context=max_context,
        slots=pick(r, ["aligned", "arbitrary"], [0.7, 0.3]),
        unassigned=pick(r, [0.0, 0.05, 0.5], [0.6, 0.25, 0.15]), unassigned_tails=r.random() < 0.2,
        rows=[int(x) for x in r.integers(0, pool, B)], seq_lens=lens,
        index_dtype=pick(r, ["int32", "int64"]), lens_dtype=pick(r, ["int32", "int64"]),
        r2t_order=[0, 1] if r.random() < 0.75 else [1, 0], r2t_pad=_pad(r, 2, 0.7, hi=5),
        width_mode=wkind,
        width=-(-max_context // P) if wkind == "default" else need + int(r.integers(0, 6)),
        out_pad=[0, 0] if r.random() < 0.7 else [0, int(r.integers(1, 9))],
    )
    assert build_page_table_cost(case) <= BUDGET["build_page_table"][backend == "cpu"]
    case.update(data_seed=[seed, 4, 1], est_cost=round(build_page_table_cost(case), 4))
    return case


def build_build_page_table(case) -> dict:
    """req_to_token [pool, max_context]: sglang's page-aligned slots (pages of the pool permuted) or arbitrary
    slot ids, -1 for unassigned slots (scattered, or each row's tail from a random token)."""
    r = np.random.default_rng(case["data_seed"])
    P, pool, mc = case["page_size"], case["pool"], case["max_context"]
    ppr = -(-mc // P)
    if case["slots"] == "aligned":
        perm = r.permutation(pool * ppr)
        i = np.arange(mc)
        r2t = perm[np.arange(pool)[:, None] * ppr + i[None, :] // P] * P + i[None, :] % P
    else:
        r2t = r.integers(0, 2**31 - 1, (pool, mc))
    r2t = r2t.astype(np.int32)
    r2t[r.random((pool, mc)) < case["unassigned"]] = -1
    if case["unassigned_tails"]:
        for row in range(pool):
            r2t[row, int(r.integers(0, mc + 1)):] = -1
    return dict(r2t=r2t, rows=np.asarray(case["rows"], np.int64), lens=np.asarray(case["seq_lens"], np.int64))


def ref_page_table(r2t, rows, lens, page_size, width):
    """out[b, p] = req_to_token[rows[b], p * page_size] // page_size for p < ceil(lens[b] / page_size), -1
    for unassigned slots and the rest of the row."""
    out = np.full((len(rows), width), -1, np.int64)
    for b, (row, n) in enumerate(zip(rows, lens)):
        pages = min(-(-int(n) // page_size), width)
        slots = r2t[row, np.arange(pages) * page_size].astype(np.int64)
        out[b, :pages] = np.where(slots >= 0, slots // page_size, -1)
    return out


def run_build_page_table(fw, case, data):
    """msa.build_page_table on fw's tensors: the page table (int64 numpy)."""
    B, W = len(case["seq_lens"]), case["width"]
    store, r2t = fw.buffer(data["r2t"].shape, case["r2t_order"], case["r2t_pad"], 0x3FFFFFFF, "int32")
    fw.assign(r2t, data["r2t"])
    rows = fw.tensor(data["rows"], case["index_dtype"])
    lens = fw.tensor(data["lens"], case["lens_dtype"])
    o_store = out = None
    kw = {}
    if case["width_mode"] == "out":
        o_store, out = fw.buffer((B, W), [0, 1], case["out_pad"], -77, "int32")
    elif case["width_mode"] == "explicit":
        kw["max_pages"] = W
    res = _with_case(case, msa.build_page_table, r2t, rows, lens, case["page_size"], out=out, **kw)
    fw.sync()
    assert out is None or res is out
    assert tuple(res.shape) == (B, W), (tuple(res.shape), (B, W))
    got = fw.numpy(res)
    _untouched(fw, case, o_store, out, -77, "page_table")
    return got


def check_build_page_table(case, data, got):
    ref = ref_page_table(data["r2t"], data["rows"], data["lens"], case["page_size"], case["width"])

    def compare():
        bad = np.argwhere(got != ref)
        assert not len(bad), (f"{len(bad)} entries differ; first [b, page] {bad[0].tolist()}: got "
                              f"{got[tuple(bad[0])]}, want {ref[tuple(bad[0])]}")

    _checked(case, compare)


def _build_page_table_invariants(case):
    lens, P = case["seq_lens"], case["page_size"]
    assert all(0 <= n <= case["max_context"] for n in lens)
    assert all(0 <= row < case["pool"] for row in case["rows"]) and len(case["rows"]) == len(lens)
    assert case["width"] >= max([-(-n // P) for n in lens], default=0)
    if case["backend"] == "gpu":
        assert case["width_mode"] == "out"


def _build_page_table_valid(case):
    run_build_page_table(NumpyFW(), case, build_build_page_table(case))


# ======== tests =========================================================================================

DRAW = {"block_scores": draw_block_scores, "select_topk": draw_select_topk, "merge_states": draw_merge_states,
        "build_page_table": draw_build_page_table}
BUILD = {"block_scores": build_block_scores, "select_topk": build_select_topk, "merge_states": build_merge_states,
         "build_page_table": build_build_page_table}
RUN = {"block_scores": run_block_scores, "select_topk": run_select_topk, "merge_states": run_merge_states,
       "build_page_table": run_build_page_table}
INVARIANTS = {"block_scores": _block_scores_invariants, "select_topk": _select_topk_invariants,
              "merge_states": _merge_states_invariants, "build_page_table": _build_page_table_invariants}
VALID = {"block_scores": _block_scores_valid, "select_topk": _select_topk_valid, "merge_states": _merge_states_valid,
         "build_page_table": _build_page_table_valid}


def check(case, data, got, gpu):
    op = case["op"]
    if op == "block_scores":
        check_block_scores(case, data, got, gpu)
    elif op == "select_topk":
        check_select_topk(case, data, got)
    elif op == "merge_states":
        check_merge_states(case, data, got, gpu)
    else:
        check_build_page_table(case, data, got)


def run_case(fw, case, gpu):
    """Builds the case's data, runs the op on fw's tensors and checks it against the reference."""
    data = BUILD[case["op"]](case)
    check(case, data, RUN[case["op"]](fw, case, data), gpu)


def _gpu_case(op, seed, monkeypatch, device="cuda"):
    torch = pytest.importorskip("torch")
    case = DRAW[op](seed)
    print(describe(case))  # shown with any failure (-s shows it before a crash too)
    for name, value in case.get("env", {}).items():  # read at launch time
        monkeypatch.setenv(name, value)
    run_case(TorchFW(torch, device), case, gpu=True)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("op", OPS)
def test_gpu_op(op, seed, monkeypatch):
    _gpu_case(op, seed, monkeypatch)


# ---- CPU: the draws themselves, and the CPU backend on draws of its own ---------------------------------

@pytest.mark.parametrize("op", OPS)
def test_draws_are_valid_and_deterministic(op):
    """Every seed of the GPU sweep (and of the CPU one) draws the same case twice, a valid one within the
    op's budget, that the CPU backend accepts (validate=True where the op has it) on cheap data: head dim 8
    and fp32 for block_scores, fp32 parts for merge_states."""
    for backend, seeds in (("gpu", SEEDS), ("cpu", CPU_SEEDS)):
        for seed in seeds:
            case = DRAW[op](seed, backend)
            assert case == DRAW[op](seed, backend), seed
            INVARIANTS[op](case)
            assert case["est_cost"] <= BUDGET[op][backend == "cpu"] + 1e-4, case["est_cost"]
            VALID[op](case)


@pytest.mark.parametrize("seed", CPU_SEEDS, ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("op", OPS)
def test_cpu_fuzz_ops(op, seed):
    """The CPU backend (numpy inputs) on draws of the CPU sweep."""
    pytest.importorskip("ml_dtypes")  # bf16 and fp8 numpy arrays
    run_case(NumpyFW(), DRAW[op](seed, "cpu"), gpu=False)
