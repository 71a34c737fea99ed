"""A seeded random-configuration sweep ("fuzz") of the sglang drop-in (msa.sglang) and of fmha_sm100's
page-table forms (msa.fmha_sm100), as test_gpu_fuzz.py is of msa.attention: every result against the float64
reference of msa_testing (ref_attention of sglang_testing's state.problem(batch), or of the drawn Problem).
Each seed draws one valid configuration (draw_<family>(seed, backend)) from np.random.default_rng([seed,
family number]) alone, the data from case["data_seed"]; the lengths (and the batch) are shrunk until the
estimated CPU cost of building the data and running the reference (<family>_cost, a conservative estimate)
fits the family's budget. A failure prints the drawn case (and the step), which its seed rebuilds exactly.

- decode: sglang's CUDA-graph decode sequence. Heads Hkv 1/2/4 x group 4/8/16 (mostly 16), head dim
  64/128/256 (mostly 128; the drop-in takes head_dim=), top-k 4/8/16/32 (mostly 16; a third of the cases
  take MiniMax-M3's TP1 / TP4 shapes), bf16 / fp16; a batch of 1-9 requests over a req_to_token pool
  (max_context up to ~4500, rows in any order, spare rows, one unused row that graph padding points at:
  seq_len 0 requests at the tail or anywhere, rarely a batch of padding only). 2-5 steps with one
  persistent plan (build_msa_decode_cg_plan, max_kv_len default / exactly the buffer's rows / more) and
  one page-table buffer (sglang's ceil(max_context / 128) pages per request, more, or just the pages
  used; sometimes a remainder of entries past B rows; poisoned before the first step); before each step
  the requests grow by one token (written into the pool on both sides: state.write_token), lengths cross
  page boundaries (1, 127 / 128 / 129 and 128k edges), requests leave (their row becomes padding), join
  on a free row or replace another; update_msa_decode_cg_meta rewrites plan and buffer; fresh q and
  topk_idx [Hkv, B, topk] (unsorted rows, -1 slots, empty rows, rows without the own block; sometimes
  entries past the request's blocks, and garbage rows for the padding, both read as empty slots by the
  contract) in persistent buffers; q contiguous, a slice of a fused qkv row or with padded heads; topk_idx
  contiguous or a slice of a larger buffer (more tokens, or rows of topk + 3 slots whose tail holds block
  0), int32 or int64; seq_lens int64 (sglang's) or int32, slot ids int64 or int32; sm_scale, q_scale,
  k_scale, v_scale. Each step: msa_sparse_decode_main with kv_indices and plan (the dense [B, max_pages]
  rows of _dense_page_rows) against the reference; padded requests return o = 0; bitwise the same as
  (a) msa_sparse_decode_main without them (build_msa_decode_meta) and (b) fmha_sm100 with the flat
  kv_indices + kv_page_indptr and a NaN-poisoned out. On the GPU, (a) is compared bitwise only where
  both plans bound the block list alike (meta_plan_agrees: the split count of a decode plan depends on
  min(topk, max_kv_len / 128), and the meta plan's max_kv_len is the pool's context), else both against
  the reference; half the GPU cases also capture the decode in a CUDA graph at the first step and replay
  it at every step (bitwise the same as eager), the update, replay and eager decode under
  torch.cuda.set_sync_debug_mode("error"); the kernel-choice environment knobs.
- prefill: msa_sparse_prefill_main on a batch of 1-6 requests on permuted pool rows: fresh prompts (up
  to ~600 tokens), chunks of up to 300 after prefixes up to ~3000, 1-token chunks, chunks starting or
  ending at 128k edges, rarely an empty chunk; selections as above plus blocks past the token's causal
  frontier (masked); the q / topk_idx layouts and index dtypes above; seq_lens / prefix_lens int64 or
  int32, cu_seqlens int32 or int64; the scales; on the GPU the MSA_SM90_PREFILL knob.
- table: fmha_sm100_plan + fmha_sm100 on an msa_testing problem (page size 16-256, group 1-16, dense or
  sparse, causal or not, decode-shaped (1-8 tokens, a decode plan, max_kv_len, num_kv_splits) or prefill
  plans, the slot-major pool, [Hkv, T, topk] or [T, Hkv, topk] indexes), run with q_offset_override (a
  tensor or an int, or none: the plan's own offsets, default or given at plan time) once through the flat
  kv_indices (with garbage past its last row) and once through page_table= (dense rows padded with -1,
  garbage pages or ids past the pool), both into NaN-poisoned outputs: bitwise equal, and against the
  reference; check_input_valid sometimes.

Tests: test_draws_are_valid_and_deterministic (CPU, no torch: every draw of both sweeps twice, its
invariants and budget, the CPU plans accepting its lengths and limits), test_cpu_decode_steps_numpy (CPU,
no torch: the decode sequences of the CPU sweep through the calls the drop-in makes, in msa's numpy API:
build_page_table into the buffer, msa.attention on the dense rows and on the flat table), test_cpu_<family>
(the drop-in on CPU torch tensors, the CPU backend: skipped without torch) and test_gpu_<family> (marked gpu).

    PYTHONPATH=build/python python3 -m pytest -q tests/python/dropin/test_gpu_fuzz_dropin.py
    PYTHONPATH=build/python python3 -m pytest -q "tests/python/dropin/test_gpu_fuzz_dropin.py::test_gpu_decode[seed17]"
    MSA_FUZZ_FIRST_SEED=1000 MSA_FUZZ_SEEDS=500 PYTHONPATH=build/python python3 -m pytest -q -m gpu \
        tests/python/dropin/test_gpu_fuzz_dropin.py                  # a longer soak over other seeds
"""
import contextlib
import math

import numpy as np
import pytest

import msa
import msa_testing as mt
import sglang_testing as st
from fuzz_testing import describe as fuzz_describe, gpu_seeds, pick, shrinking

FAMILIES = ("decode", "prefill", "table")
SEEDS = {"decode": gpu_seeds(50), "prefill": gpu_seeds(50), "table": gpu_seeds(40)}
CPU_SEEDS = {"decode": range(15), "prefill": range(15), "table": range(15)}

P = st.BLOCK            # sglang's page size = the sparse block
DECODE_MAX_KV_LEN = 1 << 20  # msa.fmha_sm100.DECODE_MAX_KV_LEN (that module imports torch)
POISON_PAGE = 1 << 30   # page-table entries the drop-in must never read

# Estimated CPU seconds of building a case's data and running its reference, per case: GPU sweep / CPU
# sweep (where the CPU backend runs too). Measured on one core of the development machine, one BLAS
# thread as conftest sets: the GPU sweep's data + references take ~11 s over the 50 + 50 + 40 default
# seeds (decode ~3 s, prefill ~5.6 s, table ~2.3 s; 0.3-0.7x the estimates), the CPU tests of this file
# ~5 s with torch (~1.3 s without: the draws and the numpy mirror).
BUDGET = {"decode": (1.0, 0.6), "prefill": (0.8, 0.4), "table": (0.4, 0.2)}

# Cost constants (rather high than low), as in test_gpu_fuzz.py: ref_attention loops over (token, KV head)
# and gathers the visible keys as float64 rows for two G x keys x D products.
C_PAIR_REF = 20e-6      # s per (token, KV head) in ref_attention
C_GATHER = 1.5e-9       # s per visible key x (D + Dv) gathered and converted
C_MAC = 0.1e-9          # s per visible key x G x (D + Dv) multiply-add
C_POOL = 20e-9          # s per K / V pool element of the sglang state (drawn, truncated to bf16, to torch)
C_GEN = 50e-9           # s per element drawn and rounded by msa_testing.make_problem / round_to
C_ROW_SEL = 40e-6       # s per (token, KV head) row of _selection
C_MP_SEL = 40e-6        # s per (token, KV head) of make_problem's selection loop
C_STEP = 3e-3           # s per decode step / call: batches, problem, torch conversions, the calls themselves
C_CPU_KEY = 0.25e-9     # s per visible key x (D + Dv) x G of one CPU-backend run (CPU sweep only)


def describe(case) -> str:
    return fuzz_describe(case, f"draw_{case['family']}({case['seed']}, {case['backend']!r})")


@contextlib.contextmanager
def reported(case, where=""):
    """Any error inside carries the drawn case (and where in the case it happened)."""
    try:
        yield
    except Exception as e:
        raise AssertionError(f"{where}{type(e).__name__}: {e}\n{describe(case)}") from e


# ---- draws ------------------------------------------------------------------------------------------------

def _heads(r, groups=(4, 8, 16), group_p=(0.2, 0.2, 0.6)):
    """Hkv, G, D, topk, dtype; a third of the draws take MiniMax-M3's TP1 (64 / 4) or TP4 (16 / 1) heads."""
    hkv = pick(r, [1, 2, 4], [0.3, 0.2, 0.5])
    group = pick(r, list(groups), list(group_p))
    head_dim = pick(r, [64, 128, 256], [0.2, 0.7, 0.1])
    topk = pick(r, [4, 8, 16, 32], [0.15, 0.15, 0.5, 0.2])
    if r.random() < 0.33:
        hkv, group, head_dim, topk = pick(r, [4, 1]), 16, 128, pick(r, [16, 32], [0.8, 0.2])
    dtype = pick(r, ["bf16", "fp16"], [0.85, 0.15])
    return dict(num_qo_heads=hkv * group, num_kv_heads=hkv, head_dim=head_dim, topk=topk, dtype=dtype)


def _scales(r):
    """sm_scale (None: D ** -0.5) and the fp8-style q / k / v scales the drop-in multiplies in."""
    return dict(sm_scale=None if r.random() < 0.75 else round(float(r.uniform(0.03, 0.2)), 4),
                q_scale=None if r.random() < 0.8 else pick(r, [0.5, 1.0, 2.0, 0.75]),
                k_scale=None if r.random() < 0.8 else pick(r, [0.5, 1.0, 2.0, 1.25]),
                v_scale=None if r.random() < 0.8 else pick(r, [0.5, 1.0, 2.0, 0.75]))


def _selection_knobs(r, prefill: bool):
    return dict(full_prob=pick(r, [0.2, 0.5, 0.9]), own_prob=pick(r, [1.0, 0.9], [0.7, 0.3]),
                empty_row_prob=pick(r, [0.0, 0.05, 0.3], [0.6, 0.3, 0.1]),
                stale_prob=0.0 if r.random() < 0.8 else pick(r, [0.1, 0.5]),
                future_prob=(0.0 if r.random() < 0.4 else pick(r, [0.2, 0.6])) if prefill else 0.0,
                garbage_pad_rows=(r.random() < 0.5) if not prefill else False)


def _view_knobs(r):
    """How q and topk_idx are laid out: q contiguous, a slice of a fused qkv projection row ([T, (Hq + 2 Hkv) D],
    as a model's q often is) or with padded heads; topk_idx contiguous or a slice of a buffer with more
    tokens or with more slots (holding garbage blocks that must not be read)."""
    return dict(q_view=pick(r, ["contiguous", "qkv", "padded"], [0.6, 0.25, 0.15]),
                index_view=pick(r, ["contiguous", "tokens", "slots"], [0.6, 0.2, 0.2]))


def _decode_len(r, steps, scale) -> int:
    """A request's length at its first step: 1-2, short, mid, long, or a 128k edge that the coming steps
    cross (127 / 128 / 129 for k = 1)."""
    kind = pick(r, ["one", "short", "mid", "long", "edge"], [0.12, 0.25, 0.3, 0.13, 0.2])
    if kind == "one":
        return int(r.integers(1, 3))
    if kind == "edge":
        k = 1 if r.random() < 0.4 else max(int(int(r.integers(2, 33)) * scale), 1)
        return max(P * k + int(r.integers(-(steps - 1), 2)), 1)
    lo, hi = {"short": (3, 300), "mid": (300, 2000), "long": (2000, 4500)}[kind]
    return max(int(int(r.integers(lo, hi)) * scale), 1)


def _pages(n) -> int:
    return -(-int(n) // P)


def _decode_schedule(r, B, steps, pad_kind, turnover, extra_rows, scale):
    """slot ids and seq_lens of every step; the pool rows (one unused row, `rows`, for the padding)."""
    npad = {"none": 0, "all": B}.get(pad_kind, int(r.integers(1, B)) if B > 1 else 0)
    pad = set(range(B - npad, B)) if pad_kind in ("tail", "all") else \
        {int(x) for x in r.choice(B, npad, replace=False)}
    real = [b for b in range(B) if b not in pad]
    rows = len(real) + (max(extra_rows, 1) if turnover else extra_rows)
    unused = rows
    perm = r.permutation(rows)
    slots, lens = [unused] * B, [0] * B
    for i, b in enumerate(real):
        slots[b], lens[b] = int(perm[i]), _decode_len(r, steps, scale)
    schedule = [dict(slot_ids=list(slots), seq_lens=list(lens))]
    for _ in range(1, steps):
        lens = [n + 1 if n else 0 for n in lens]
        if turnover and r.random() < 0.5:
            free = [x for x in range(rows) if x not in slots]
            live = [b for b in range(B) if lens[b]]
            idle = [b for b in range(B) if not lens[b]]
            event = pick(r, ["leave", "join", "replace"])
            if event == "leave" and live:
                b = pick(r, live)
                slots[b], lens[b] = unused, 0
            elif event in ("join", "replace") and free and (idle if event == "join" else live):
                b = pick(r, idle if event == "join" else live)
                slots[b], lens[b] = pick(r, free), _decode_len(r, steps, scale)
        schedule.append(dict(slot_ids=list(slots), seq_lens=list(lens)))
    return schedule, rows


def _row_pages(schedule, rows):
    """Pages each pool row needs: those of its longest request over the steps."""
    need = [0] * rows
    for step in schedule:
        for row, n in zip(step["slot_ids"], step["seq_lens"]):
            if row < rows:
                need[row] = max(need[row], _pages(n))
    return need


def decode_cost(case) -> float:
    Hkv, Hq, D, topk = case["num_kv_heads"], case["num_qo_heads"], case["head_dim"], case["topk"]
    G = Hq // Hkv
    cpu = case["backend"] == "cpu"
    cost = (sum(case["row_pages"]) + case["spare_pages"]) * P * Hkv * 2 * D * C_POOL
    for step in case["steps"]:
        lens = step["seq_lens"]
        real = sum(1 for n in lens if n)
        keys = Hkv * sum(min(n, topk * P) for n in lens)
        cost += C_STEP + len(lens) * Hq * D * C_GEN + real * Hkv * C_ROW_SEL + len(lens) * Hkv * C_PAIR_REF
        cost += keys * 2 * D * (C_GATHER + G * C_MAC)
        if cpu:  # the decode three times (plan, meta, flat) and the numpy mirror once
            cost += 4 * (keys * 2 * D * G * C_CPU_KEY + C_STEP)
    return cost


def meta_plan_agrees(case) -> bool:
    """Whether build_msa_decode_meta's plan (max_kv_len = ceil(max_context / 128) * 128) bounds a block list
    as the persistent plan does: min(topk, max_kv_len / 128), on which a GPU decode plan's split count
    depends (src/cuda/decode/plan.cu). Where they differ the two may round differently on the GPU."""
    persistent = case["plan_max_kv_len"] or DECODE_MAX_KV_LEN
    return min(case["topk"], _pages(persistent)) == min(case["topk"], max(_pages(case["max_context"]), 1))


def draw_decode(seed: int, backend: str = "gpu") -> dict:
    """One decode sequence (see the module docstring), drawn from np.random.default_rng([seed, 1]) alone."""
    assert backend in ("gpu", "cpu")
    r = np.random.default_rng([seed, 1])
    case = dict(seed=seed, backend=backend, family="decode", **_heads(r), **_scales(r))
    B0 = int(r.integers(1, 10))
    steps = int(r.integers(2, 6))
    pad_kind = pick(r, ["none", "tail", "anywhere", "all"], [0.5, 0.3, 0.17, 0.03])
    turnover = pad_kind != "all" and r.random() < 0.3
    extra_rows = pick(r, [0, 1, 2], [0.5, 0.3, 0.2])
    slack_kind = pick(r, ["none", "small", "large"], [0.35, 0.35, 0.3])
    slack = {"none": 0, "small": int(r.integers(1, P)), "large": int(r.integers(P, 800))}[slack_kind]
    buf_kind = pick(r, ["context", "larger", "tight"], [0.5, 0.3, 0.2])
    more_pages = int(r.integers(1, 9))
    plan_kind = pick(r, ["default", "exact", "more"], [0.5, 0.25, 0.25])
    more_keys = int(r.integers(1, 5000))
    remainder = r.random() < 0.25
    budget = BUDGET["decode"][backend == "cpu"]
    for _, scale, B in shrinking(f"draw_decode({seed})", B0):  # until the reference fits the budget
        schedule, rows = _decode_schedule(r, B, steps, pad_kind, turnover, extra_rows, scale)
        longest = max(max(s["seq_lens"]) for s in schedule)
        max_context = max(longest + slack, 1)
        need = max(_pages(longest), 1)
        ctx_pages = max(_pages(max_context), 1)
        buf_pages = {"context": ctx_pages, "larger": ctx_pages + more_pages, "tight": need}[buf_kind]
        case.update(batch_size=B, steps=schedule, pool_rows=rows, row_pages=_row_pages(schedule, rows),
                    max_context=max_context, spare_pages=1 if pad_kind == "all" else pick(r, [0, 1, 3]),
                    buf_pages=buf_pages, buf_extra=int(r.integers(1, B)) if remainder and B > 1 else 0,
                    plan_max_kv_len={"default": None, "exact": buf_pages * P,
                                     "more": buf_pages * P + more_keys}[plan_kind])
        if decode_cost(case) <= budget:
            break
    case.update(
        seq_dtype=pick(r, ["int64", "int32"], [0.6, 0.4]), slot_dtype=pick(r, ["int64", "int32"], [0.6, 0.4]),
        index_dtype=pick(r, ["int32", "int64"], [0.8, 0.2]), **_view_knobs(r),
        selection=_selection_knobs(r, prefill=False),
        graph=backend == "gpu" and r.random() < 0.5,
        env=pick(r, [{}, {"MSA_PAGED_TOKEN_KERNEL": "0"}], [0.85, 0.15]) if backend == "gpu" else {},
        data_seed=[seed, 1, 1], est_cost=round(decode_cost(case), 4))
    return case


def _prefill_request(r, scale):
    """(prefix_len, chunk_len) of one request."""
    kind = pick(r, ["fresh", "chunk", "one", "edge", "zero"], [0.3, 0.3, 0.15, 0.21, 0.04])
    if kind == "fresh":
        return 0, max(int(int(r.integers(2, 600)) * scale), 1)
    if kind == "chunk":
        return max(int(int(r.integers(1, 3000)) * scale), 1), max(int(int(r.integers(2, 300)) * scale), 1)
    if kind == "one":
        return (0 if r.random() < 0.3 else max(int(int(r.integers(1, 3000)) * scale), 1)), 1
    if kind == "zero":
        return max(int(int(r.integers(1, 2000)) * scale), 1), 0
    k = 1 if r.random() < 0.4 else max(int(int(r.integers(2, 24)) * scale), 1)
    prefix = 0 if r.random() < 0.25 else P * k + int(r.integers(-1, 2))
    to_edge = -prefix % P
    return prefix, pick(r, [1, 127, 128, 129, to_edge or P, to_edge + 1, to_edge + P])


def prefill_visible_keys(prefix_lens, chunk_lens, topk) -> int:
    """Upper bound of the keys one KV head's rows see over the batch: min(p + 1, topk * 128) per token."""
    total = 0
    for pre, n in zip(prefix_lens, chunk_lens):
        hi = np.minimum(pre + np.arange(n) + 1, topk * P)
        total += int(hi.sum())
    return total


def prefill_cost(case) -> float:
    Hkv, Hq, D, topk = case["num_kv_heads"], case["num_qo_heads"], case["head_dim"], case["topk"]
    G = Hq // Hkv
    pre = [q["prefix_len"] for q in case["requests"]]
    chunk = [q["seq_len"] - q["prefix_len"] for q in case["requests"]]
    T = sum(chunk)
    keys = Hkv * prefill_visible_keys(pre, chunk, topk)
    cost = (sum(case["row_pages"]) + case["spare_pages"]) * P * Hkv * 2 * D * C_POOL
    cost += C_STEP + T * Hq * D * C_GEN + T * Hkv * (C_ROW_SEL + C_PAIR_REF) + keys * 2 * D * (C_GATHER + G * C_MAC)
    if case["backend"] == "cpu":
        cost += keys * 2 * D * G * C_CPU_KEY + C_STEP
    return cost


def draw_prefill(seed: int, backend: str = "gpu") -> dict:
    """One prefill (extend) batch, drawn from np.random.default_rng([seed, 2]) alone."""
    assert backend in ("gpu", "cpu")
    r = np.random.default_rng([seed, 2])
    case = dict(seed=seed, backend=backend, family="prefill", **_heads(r), **_scales(r))
    B0 = pick(r, [1, 2, 3, 4, 5, 6], [0.25, 0.25, 0.2, 0.15, 0.1, 0.05])
    extra_rows = pick(r, [0, 1, 2], [0.5, 0.3, 0.2])
    slack = pick(r, [0, int(r.integers(1, P)), int(r.integers(P, 800))], [0.35, 0.35, 0.3])
    budget = BUDGET["prefill"][backend == "cpu"]
    for _, scale, B in shrinking(f"draw_prefill({seed})", B0):
        rows = B + extra_rows
        perm = r.permutation(rows)
        requests = []
        for b in range(B):
            prefix, chunk = _prefill_request(r, scale)
            requests.append(dict(slot_id=int(perm[b]), prefix_len=prefix, seq_len=prefix + chunk))
        row_pages = [0] * rows
        for q in requests:
            row_pages[q["slot_id"]] = _pages(q["seq_len"])
        longest = max(q["seq_len"] for q in requests)
        case.update(requests=requests, pool_rows=rows, row_pages=row_pages, max_context=max(longest + slack, 1),
                    spare_pages=pick(r, [0, 1, 3]))
        if prefill_cost(case) <= budget:
            break
    case.update(
        seq_dtype=pick(r, ["int64", "int32"], [0.6, 0.4]), slot_dtype=pick(r, ["int64", "int32"], [0.6, 0.4]),
        cu_dtype=pick(r, ["int32", "int64"], [0.8, 0.2]), index_dtype=pick(r, ["int32", "int64"], [0.8, 0.2]),
        **_view_knobs(r), selection=_selection_knobs(r, prefill=True),
        env=pick(r, [{}, {"MSA_SM90_PREFILL": "qmajor"}, {"MSA_SM90_PREFILL": "kvmajor"}], [0.7, 0.15, 0.15])
        if backend == "gpu" else {},
        data_seed=[seed, 2, 1], est_cost=round(prefill_cost(case), 4))
    return case


def _table_lengths(r, decode, B, causal, scale):
    qo, kv, off = [], [], []
    qmax = pick(r, [1, 2, 4, 8], [0.4, 0.2, 0.2, 0.2])
    for b in range(B):
        if decode:
            ql = int(r.integers(1, qmax + 1))
            kind = pick(r, ["short", "mid", "long", "edge"], [0.3, 0.35, 0.15, 0.2])
            if kind == "edge":
                kl = P * max(int(int(r.integers(1, 24)) * scale), 1) + int(r.integers(-1, 2))
            else:
                lo, hi = {"short": (1, 300), "mid": (300, 2000), "long": (2000, 4500)}[kind]
                kl = int(int(r.integers(lo, hi)) * scale)
            kl = max(kl, ql)
        else:
            ql = max(int(int(r.integers(9, 300)) * scale), 9) if b == 0 or r.random() < 0.6 else \
                int(r.integers(0, 9))
            prefix = 0 if r.random() < 0.35 else int(int(r.integers(1, 1500)) * scale)
            tail = int(int(r.integers(1, 400)) * scale) if r.random() < 0.3 else 0
            kl = prefix + ql + tail
        qo.append(ql)
        kv.append(kl)
        # the offset the run uses (q_offset_override, or the plan's): keys after the chunk where below kl - ql
        off.append(int(r.integers(0, kl - ql + 1)) if causal else int(r.integers(0, kl + 200)))
    return qo, kv, off


def table_cost(case) -> float:
    p = case["problem"]
    Hkv, Hq, D = case["num_kv_heads"], case["num_qo_heads"], case["head_dim"]
    G = Hq // Hkv
    T = sum(p["qo_lens"])
    keys = 0
    for ql, kl, o in zip(p["qo_lens"], p["kv_lens"], p["qo_offset"]):
        hi = np.minimum(kl, o + np.arange(ql) + 1) if case["causal"] else np.full(ql, kl)
        if case["topk"]:
            hi = np.minimum(hi, case["topk"] * P)
        keys += int(np.maximum(hi, 0).sum())
    keys *= Hkv
    pages = sum(-(-k // case["page_size"]) for k in p["kv_lens"]) + case["spare_pages"]
    cost = 3 * C_STEP + (pages * case["page_size"] * Hkv * 2 * D + T * Hq * D) * C_GEN
    cost += T * Hkv * (C_PAIR_REF + (C_MP_SEL if case["topk"] else 0.0)) + keys * 2 * D * (C_GATHER + G * C_MAC)
    if case["backend"] == "cpu":
        cost += 2 * (keys * 2 * D * G * C_CPU_KEY + C_STEP)
    return cost


def draw_table(seed: int, backend: str = "gpu") -> dict:
    """One fmha_sm100 problem run through both page-table forms, from np.random.default_rng([seed, 3])."""
    assert backend in ("gpu", "cpu")
    r = np.random.default_rng([seed, 3])
    case = dict(seed=seed, backend=backend, family="table",
                **_heads(r, groups=(1, 2, 4, 8, 16), group_p=(0.1, 0.1, 0.2, 0.2, 0.4)), **_scales(r))
    sparse = r.random() < 0.75
    if not sparse:
        case["topk"] = 0
    decode = r.random() < 0.55
    causal = r.random() < 0.85
    page_size = pick(r, [128, 64, 256, 32, 16], [0.4, 0.2, 0.2, 0.1, 0.1])
    override = pick(r, ["tensor", "int", "none"], [0.55, 0.25, 0.2])
    plan_offsets = pick(r, ["default", "list", "int"], [0.5, 0.3, 0.2])
    B0 = int(r.integers(1, 7))
    case.update(causal=causal, page_size=page_size, phase="decode" if decode else "prefill",
                pattern=pick(r, ["random", "clustered", "shared"], [0.6, 0.2, 0.2]) if sparse else None,
                override=override)
    budget = BUDGET["table"][backend == "cpu"]
    for _, scale, B in shrinking(f"draw_table({seed})", B0):
        qo, kv, off = _table_lengths(r, decode, B, causal, scale)
        plan_off = None
        if override == "int" or plan_offsets == "int":  # one offset valid for every request
            top = min(k - q for q, k in zip(qo, kv)) if causal else 300
            x = int(r.integers(0, top + 1))
            if override == "int":
                off = [x] * B
            if plan_offsets == "int":
                plan_off = x if override != "int" else int(r.integers(0, top + 1))
        if plan_offsets == "list":
            plan_off = [int(r.integers(0, k - q + 1)) if causal else int(r.integers(0, k + 200))
                        for q, k in zip(qo, kv)]
        if override == "none":  # the run uses the plan's offsets
            off = [k - q for q, k in zip(qo, kv)] if plan_off is None else \
                [plan_off] * B if isinstance(plan_off, int) else list(plan_off)
        case.update(plan_qo_offset=plan_off, spare_pages=pick(r, [0, 1, 3]),
                    problem=dict(qo_lens=qo, kv_lens=kv, qo_offset=off))
        if table_cost(case) <= budget:
            break
    case.update(
        slot_major=r.random() < 0.6, index_layout="HTK" if r.random() < 0.6 else "THK",
        neg_slot_prob=pick(r, [0.0, 0.2, 0.6]), empty_row_prob=pick(r, [0.0, 0.05, 0.3], [0.6, 0.3, 0.1]),
        max_kv_len=None if not decode or r.random() < 0.6 else max(kv) + int(r.integers(0, 5000)),
        num_kv_splits=-1 if r.random() < 0.8 else pick(r, [1, 2, 4]),
        dense_extra=pick(r, [0, 1, 4], [0.5, 0.3, 0.2]), dense_fill=pick(r, ["-1", "pages", "past"], [0.5, 0.3, 0.2]),
        flat_tail=pick(r, [0, 1, 5]),
        check_input_valid=r.random() < 0.15,
        env=pick(r, [{}, {"MSA_PAGED_TOKEN_KERNEL": "0"}] if decode else
                 [{}, {"MSA_SM90_PREFILL": "qmajor"}, {"MSA_SM90_PREFILL": "kvmajor"}], None)
        if backend == "gpu" and r.random() < 0.3 else {},
        data_seed=[seed, 3, 1], est_cost=round(table_cost(case), 4))
    return case


DRAW = {"decode": draw_decode, "prefill": draw_prefill, "table": draw_table}


# ---- data ---------------------------------------------------------------------------------------------------

def _bf16_normal(rng, shape) -> np.ndarray:
    """float32 standard normals truncated to bf16 precision (exact in bf16 and fp16; cheaper than round_to)."""
    x = rng.standard_normal(shape, dtype=np.float32)
    x.view(np.uint32)[...] &= np.uint32(0xFFFF0000)
    return x


class PoolState(st.SglangState):
    """sglang_testing's state with pages only for what each pool row's requests use (row_pages[row] pages,
    scattered over the pool); req_to_token's other positions hold stale slots of other pages, which no
    length reaches. The last row stays unused (zeros): graph padding points at it."""

    def __init__(self, rng, case):
        self.num_qo_heads, self.num_kv_heads = case["num_qo_heads"], case["num_kv_heads"]
        self.head_dim, self.topk = case["head_dim"], case["topk"]
        self.page_size, self.max_context = P, case["max_context"]
        row_pages = case["row_pages"]
        num_pages = sum(row_pages) + case["spare_pages"]
        shape = (num_pages * P, self.num_kv_heads, self.head_dim)
        self.k_pool, self.v_pool = _bf16_normal(rng, shape), _bf16_normal(rng, shape)
        perm = rng.permutation(num_pages)
        self.req_to_token = np.zeros((len(row_pages) + 1, self.max_context), np.int32)
        start = 0
        for row, n in enumerate(row_pages):
            width = min(n * P, self.max_context)
            pos = np.arange(width)
            self.req_to_token[row, :width] = perm[start:start + n][pos // P] * P + pos % P
            if width < self.max_context:
                self.req_to_token[row, width:] = rng.integers(0, max(num_pages, 1) * P, self.max_context - width)
            start += n


def _selection(r, positions, kv_lens, num_kv_heads, topk, knobs) -> np.ndarray:
    """int32 [Hkv, T, topk] in sglang's layout: per (token, KV head) its own block (knobs["own_prob"]) and
    earlier ones (all that fit with knobs["full_prob"], else a random number), blocks past its causal
    frontier (future_prob) and entries past the request's blocks (stale_prob, contract: empty slots), at
    random slots, -1 elsewhere; empty rows (empty_row_prob). Tokens with no key: -1, or garbage
    (garbage_pad_rows: every entry is past the request's 0 blocks)."""
    T = len(positions)
    idx = np.full((num_kv_heads, T, topk), -1, np.int32)
    for t in range(T):
        nvalid = _pages(kv_lens[t])
        if nvalid == 0:
            if knobs["garbage_pad_rows"]:
                idx[:, t] = r.integers(-1, 48, (num_kv_heads, topk))
            continue
        own = min(int(positions[t]) // P, nvalid - 1)
        for g in range(num_kv_heads):
            if r.random() < knobs["empty_row_prob"]:
                continue
            most = min(topk - 1, own)
            take = most if r.random() < knobs["full_prob"] else int(r.integers(0, most + 1))
            entries = list(r.permutation(own)[:take]) if take else []
            if r.random() < knobs["own_prob"]:
                entries.append(own)
            if knobs["future_prob"] and own + 1 < nvalid and r.random() < knobs["future_prob"]:
                entries += list(own + 1 + r.permutation(nvalid - own - 1)[:2])
            if knobs["stale_prob"] and r.random() < knobs["stale_prob"]:
                entries += list(nvalid + r.permutation(40)[:2])
            entries = entries[-topk:]  # too many: drop earlier blocks first (own, future, stale stay)
            row = np.full(topk, -1, np.int32)
            row[r.permutation(topk)[:len(entries)]] = entries
            idx[g, t] = row
    return idx


def _eff_sm_scale(case) -> float:
    base = case["head_dim"] ** -0.5 if case["sm_scale"] is None else case["sm_scale"]
    return base * (case["q_scale"] or 1.0) * (case["k_scale"] or 1.0)


def _check_o(case, o, ref, what):
    """o (torch, q's dtype) against the reference: o / v_scale (the drop-in multiplies v_scale in)."""
    got = o.float().cpu().numpy() / (case["v_scale"] or 1.0)
    mt.assert_close(got, ref, what=what)


def _scale_kw(case):
    return dict(sm_scale=case["sm_scale"], q_scale=case["q_scale"], k_scale=case["k_scale"], v_scale=case["v_scale"])


def _torch_dtype(torch, name):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "int32": torch.int32, "int64": torch.int64}[name]


def q_storage(torch, case, T, dt, dev):
    """A zeroed q [T, Hq, D] laid out per case["q_view"] (innermost contiguous, outer strides of 16 bytes)."""
    Hq, Hkv, D = case["num_qo_heads"], case["num_kv_heads"], case["head_dim"]
    if case["q_view"] == "qkv":
        return torch.zeros(T, (Hq + 2 * Hkv) * D, dtype=dt, device=dev)[:, :Hq * D].view(T, Hq, D)
    if case["q_view"] == "padded":
        return torch.zeros(T, Hq, D + 8, dtype=dt, device=dev)[:, :, :D]
    return torch.zeros(T, Hq, D, dtype=dt, device=dev)


def index_storage(torch, case, T, dev):
    """A topk_idx [Hkv, T, topk] of -1 laid out per case["index_view"]; "slots": rows of topk + 3 entries (not
    16-byte aligned), those past topk holding block 0, which every request with a key has."""
    Hkv, topk, dt = case["num_kv_heads"], case["topk"], _torch_dtype(torch, case["index_dtype"])
    if case["index_view"] == "tokens":
        return torch.full((Hkv, T + 3, topk), -1, dtype=dt, device=dev)[:, :T]
    if case["index_view"] == "slots":
        big = torch.full((Hkv, T, topk + 3), 0, dtype=dt, device=dev)
        big[:, :, :topk] = -1
        return big[:, :, :topk]
    return torch.full((Hkv, T, topk), -1, dtype=dt, device=dev)


# ---- decode ---------------------------------------------------------------------------------------------------


def decode_batch(rng, case, step):
    """The step's batch for state.problem, with a fresh q and topk_idx."""
    lens = np.asarray(step["seq_lens"], np.int32)
    B = len(lens)
    return {"q": _bf16_normal(rng, (B, case["num_qo_heads"], case["head_dim"])),
            "topk_idx": _selection(rng, lens - 1, lens, case["num_kv_heads"], case["topk"], case["selection"]),
            "slot_ids": np.asarray(step["slot_ids"], np.int64), "cu_seqlens": np.arange(B + 1, dtype=np.int32),
            "seq_lens": lens, "prefix_lens": np.maximum(lens - 1, 0)}


def run_decode(torch, case, dev):
    """The case's decode steps with one persistent plan and page-table buffer (see the module docstring)."""
    from msa import sglang as msg
    from msa.fmha_sm100 import fmha_sm100

    rng = np.random.default_rng(case["data_seed"])
    state = PoolState(rng, case)
    dt = _torch_dtype(torch, case["dtype"])
    Hq, Hkv, D, topk, B = (case["num_qo_heads"], case["num_kv_heads"], case["head_dim"], case["topk"],
                           case["batch_size"])
    k_pool = torch.from_numpy(state.k_pool).to(dev, dt)
    v_pool = torch.from_numpy(state.v_pool).to(dev, dt)
    r2t = torch.from_numpy(state.req_to_token).to(dev)
    k_paged, v_paged = msg._paged("test", k_pool, P), msg._paged("test", v_pool, P)
    kw = {} if case["plan_max_kv_len"] is None else {"max_kv_len": case["plan_max_kv_len"]}
    with reported(case, "build_msa_decode_cg_plan: "):
        plan = msg.build_msa_decode_cg_plan(Hq, Hkv, P, topk, B, device=dev, head_dim=D, **kw)
    kv_buf = torch.full((B * case["buf_pages"] + case["buf_extra"],), POISON_PAGE, dtype=torch.int32, device=dev)
    q_buf = q_storage(torch, case, B, dt, dev)
    topk_buf = index_storage(torch, case, B, dev)
    seq_buf = torch.zeros(B, dtype=_torch_dtype(torch, case["seq_dtype"]), device=dev)
    slot_buf = torch.zeros(B, dtype=_torch_dtype(torch, case["slot_dtype"]), device=dev)
    scales = _scale_kw(case)
    bitwise_meta = dev == "cpu" or meta_plan_agrees(case)
    gpu = dev != "cpu"

    def update():
        msg.update_msa_decode_cg_meta(plan, kv_buf, r2t, slot_buf, seq_buf, P, topk, Hq, Hkv)

    def decode():
        return msg.msa_sparse_decode_main(q_buf, k_pool, v_pool, topk_buf, r2t, slot_buf, seq_buf, P,
                                          kv_indices=kv_buf, plan=plan, **scales)

    graph = None
    for s, step in enumerate(case["steps"]):
        where = f"step {s}: "
        lens = np.asarray(step["seq_lens"])
        for b in np.flatnonzero(lens):  # the new token of every live request, written before attention
            slot, k_row, v_row = state.write_token(rng, step["slot_ids"][b], int(lens[b]) - 1)
            k_pool[slot] = torch.from_numpy(k_row).to(dev, dt)
            v_pool[slot] = torch.from_numpy(v_row).to(dev, dt)
        batch = decode_batch(rng, case, step)
        q_buf.copy_(torch.from_numpy(batch["q"]))
        topk_buf.copy_(torch.from_numpy(batch["topk_idx"]))
        seq_buf.copy_(torch.from_numpy(lens))
        slot_buf.copy_(torch.from_numpy(np.asarray(step["slot_ids"])))
        with reported(case, where):
            if gpu and case["graph"]:
                if graph is None:
                    update()
                    graph, o_graph = mt.capture_graph(decode)
                with mt.no_host_sync():
                    update()
                    graph.replay()
                    o = decode()
            else:
                update()
                o = decode()
            o_meta = msg.msa_sparse_decode_main(q_buf, k_pool, v_pool, topk_buf, r2t, slot_buf, seq_buf, P, **scales)
            flat = torch.full_like(o, float("nan"))
            fmha_sm100(q_buf, k_paged, v_paged, plan, kv_indices=kv_buf,
                       kv_block_indexes=topk_buf.permute(1, 0, 2).to(torch.int32), out=flat, **scales)
            if gpu:
                torch.cuda.synchronize()
            assert o.shape == (B, Hq, D) and o.dtype == dt, f"o: {o.shape} {o.dtype}"
            ref, _ = mt.ref_attention(state.problem(batch, sm_scale=_eff_sm_scale(case)))
            _check_o(case, o, ref, "o")
            pad = torch.from_numpy(lens == 0).to(dev)
            assert not o[pad].any(), "a padded request (seq_len 0) returns o = 0"
            if graph is not None:
                assert torch.equal(o_graph, o), "the CUDA graph's replay differs from eager"
            assert torch.equal(o, flat), "the dense page rows and the flat kv_indices differ"
            if bitwise_meta:
                assert torch.equal(o, o_meta), "without kv_indices / plan (build_msa_decode_meta) the bits differ"
            else:
                _check_o(case, o_meta, ref, "o of build_msa_decode_meta's plan")


# ---- prefill --------------------------------------------------------------------------------------------------

def prefill_batch(rng, case):
    seq = np.array([q["seq_len"] for q in case["requests"]], np.int32)
    pre = np.array([q["prefix_len"] for q in case["requests"]], np.int32)
    chunk = seq - pre
    cu = np.concatenate([[0], np.cumsum(chunk)]).astype(np.int32)
    positions = np.concatenate([p + np.arange(n) for p, n in zip(pre, chunk)]) if cu[-1] else np.zeros(0, np.int64)
    T = int(cu[-1])
    return {"q": _bf16_normal(rng, (T, case["num_qo_heads"], case["head_dim"])),
            "topk_idx": _selection(rng, positions, np.repeat(seq, chunk), case["num_kv_heads"], case["topk"],
                                   case["selection"]),
            "slot_ids": np.array([q["slot_id"] for q in case["requests"]], np.int64),
            "cu_seqlens": cu, "seq_lens": seq, "prefix_lens": pre}


def run_prefill(torch, case, dev):
    from msa import sglang as msg

    rng = np.random.default_rng(case["data_seed"])
    state = PoolState(rng, case)
    dt = _torch_dtype(torch, case["dtype"])
    batch = prefill_batch(rng, case)
    k_pool = torch.from_numpy(state.k_pool).to(dev, dt)
    v_pool = torch.from_numpy(state.v_pool).to(dev, dt)
    r2t = torch.from_numpy(state.req_to_token).to(dev)
    ints = lambda a, name: torch.from_numpy(a).to(dev, _torch_dtype(torch, case[name]))  # noqa: E731
    T = batch["q"].shape[0]
    q = q_storage(torch, case, T, dt, dev)
    q.copy_(torch.from_numpy(batch["q"]))
    topk_idx = index_storage(torch, case, T, dev)
    topk_idx.copy_(torch.from_numpy(batch["topk_idx"]))
    with reported(case):
        o = msg.msa_sparse_prefill_main(
            q, k_pool, v_pool, topk_idx, r2t,
            ints(batch["slot_ids"], "slot_dtype"), ints(batch["cu_seqlens"], "cu_dtype"),
            ints(batch["seq_lens"], "seq_dtype"), ints(batch["prefix_lens"], "seq_dtype"), P, **_scale_kw(case))
        assert o.shape == batch["q"].shape and o.dtype == dt, f"o: {o.shape} {o.dtype}"
        ref, _ = mt.ref_attention(state.problem(batch, sm_scale=_eff_sm_scale(case)))
        _check_o(case, o, ref, "o")


# ---- fmha_sm100: flat kv_indices and dense page_table ---------------------------------------------------------

def build_table_problem(case, **override) -> mt.Problem:
    p = case["problem"]
    kw = dict(qo_lens=p["qo_lens"], kv_lens=p["kv_lens"], qo_offset=p["qo_offset"],
              num_qo_heads=case["num_qo_heads"], num_kv_heads=case["num_kv_heads"], head_dim=case["head_dim"],
              page_size=case["page_size"], topk=case["topk"] or 16, causal=case["causal"], pattern=case["pattern"],
              neg_slot_prob=case["neg_slot_prob"], flat_pages=True, slot_major=case["slot_major"],
              index_layout=case["index_layout"], dtype=case["dtype"], spare_pages=case["spare_pages"],
              sm_scale=_eff_sm_scale(case), empty_row_prob=case["empty_row_prob"] if case["topk"] else 0.0)
    kw.update(override)
    return mt.make_problem(np.random.default_rng(case["data_seed"]), **kw)


def table_forms(case, prob):
    """(flat kv_indices with garbage past its last row, dense [B, width] rows padded per dense_fill)."""
    r = np.random.default_rng(case["data_seed"] + [2])
    num_pages = prob.k_cache.shape[0]
    ind = prob.page_indptr
    B = len(prob.kv_lens)
    width = max(int(np.diff(ind).max(initial=0)), 1) + case["dense_extra"]
    fill = {"-1": lambda n: np.full(n, -1), "pages": lambda n: r.integers(0, max(num_pages, 1), n),
            "past": lambda n: num_pages + r.integers(0, 1000, n)}[case["dense_fill"]]
    dense = np.zeros((B, width), np.int32)
    for b in range(B):
        row = prob.page_table[ind[b]:ind[b + 1]]
        dense[b, :len(row)] = row
        dense[b, len(row):] = fill(width - len(row))
    flat = np.concatenate([prob.page_table, r.integers(0, max(num_pages, 1), case["flat_tail"])]).astype(np.int32)
    return flat, dense


def run_table(torch, case, dev):
    from msa.fmha_sm100 import fmha_sm100, fmha_sm100_plan

    prob = build_table_problem(case)
    t = mt.to_torch(prob, dev)
    p = case["problem"]
    B = len(p["qo_lens"])
    plan_off = case["plan_qo_offset"]
    with reported(case, "fmha_sm100_plan: "):
        plan = fmha_sm100_plan(
            torch.tensor(p["qo_lens"], dtype=torch.int32), torch.tensor(p["kv_lens"], dtype=torch.int32),
            case["num_qo_heads"], num_kv_heads=case["num_kv_heads"],
            qo_offset=plan_off if plan_off is None or isinstance(plan_off, int) else torch.tensor(plan_off),
            page_size=case["page_size"], kv_block_num=case["topk"] or -1, causal=case["causal"],
            head_dim=case["head_dim"], device=dev, max_kv_len=case["max_kv_len"], num_kv_splits=case["num_kv_splits"])
        assert plan[3]["msa_plan"].plan.phase == case["phase"]
    if case["override"] == "tensor":
        override = torch.tensor(p["qo_offset"], dtype=torch.int32, device=dev)
    elif case["override"] == "int":
        override = int(p["qo_offset"][0]) if B else 0
    else:
        override = None
    flat, dense = table_forms(case, prob)
    bi = t["block_idx"] if case["topk"] else None
    scales = dict(sm_scale=case["head_dim"] ** -0.5 if case["sm_scale"] is None else case["sm_scale"],
                  q_scale=case["q_scale"], k_scale=case["k_scale"], v_scale=case["v_scale"])
    outs = []
    with reported(case):
        for form in ("flat", "dense"):
            out = torch.full((prob.q.shape[0], case["num_qo_heads"], case["head_dim"]), float("nan"),
                             dtype=t["q"].dtype, device=dev)
            table = torch.from_numpy(flat if form == "flat" else dense).to(dev)
            o, _ = fmha_sm100(t["q"], t["k_cache"], t["v_cache"], plan, out=out, kv_block_indexes=bi,
                              q_offset_override=override, check_input_valid=case["check_input_valid"],
                              **({"kv_indices": table} if form == "flat" else {"page_table": table}), **scales)
            assert o is out, f"{form}: fmha_sm100 returned another tensor than out"
            outs.append(out)
        if dev != "cpu":
            torch.cuda.synchronize()
        ref, _ = mt.ref_attention(prob)
        _check_o(case, outs[0], ref, "o (flat kv_indices)")
        assert torch.equal(outs[0], outs[1]), "the dense page_table and the flat kv_indices differ"


RUN = {"decode": run_decode, "prefill": run_prefill, "table": run_table}


# ---- the GPU sweep --------------------------------------------------------------------------------------------

def _gpu_case(family, seed, monkeypatch):
    torch = pytest.importorskip("torch")
    case = DRAW[family](seed)
    print(describe(case))  # shown with any failure (-s shows it before a crash too)
    for name, value in case["env"].items():  # read at plan time
        monkeypatch.setenv(name, value)
    RUN[family](torch, case, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS["decode"], ids=lambda s: f"seed{s}")
def test_gpu_decode(seed, monkeypatch):
    _gpu_case("decode", seed, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS["prefill"], ids=lambda s: f"seed{s}")
def test_gpu_prefill(seed, monkeypatch):
    _gpu_case("prefill", seed, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS["table"], ids=lambda s: f"seed{s}")
def test_gpu_table(seed, monkeypatch):
    _gpu_case("table", seed, monkeypatch)


# ---- CPU: the draws themselves, the numpy mirror, and the drop-in on CPU tensors -----------------------------

def _check_invariants(case):
    fam, budget = case["family"], BUDGET[case["family"]][case["backend"] == "cpu"]
    assert case["est_cost"] <= budget + 1e-4
    Hq, Hkv = case["num_qo_heads"], case["num_kv_heads"]
    assert Hq % Hkv == 0 and case["head_dim"] in (64, 128, 256) and case["dtype"] in ("bf16", "fp16")
    if fam == "decode":
        B, steps = case["batch_size"], case["steps"]
        assert 1 <= B <= 9 and 2 <= len(steps) <= 5 and case["topk"] in (4, 8, 16, 32)
        unused = case["pool_rows"]
        assert len(case["row_pages"]) == unused
        for prev, step in zip([None] + steps[:-1], steps):
            slots, lens = step["slot_ids"], step["seq_lens"]
            assert len(slots) == len(lens) == B
            live = [s for s, n in zip(slots, lens) if n]
            assert len(set(live)) == len(live) and all(0 <= s < unused for s in live)  # distinct rows
            assert all(s == unused for s, n in zip(slots, lens) if not n)  # padding: the unused row
            assert all(_pages(n) <= case["row_pages"][s] for s, n in zip(slots, lens) if n)
            assert max(lens) <= case["max_context"] and _pages(max(lens)) <= case["buf_pages"]
            if prev is not None:  # a request that stays on its row grows by one token
                for s0, n0, s1, n1 in zip(prev["slot_ids"], prev["seq_lens"], slots, lens):
                    assert not (n0 and n1 and s0 == s1) or n1 == n0 + 1
        plan_kv = case["plan_max_kv_len"] or DECODE_MAX_KV_LEN
        assert case["buf_pages"] * P <= plan_kv  # update_msa_decode_cg_meta's bound
        assert 0 <= case["buf_extra"] < max(B, 1)
    elif fam == "prefill":
        reqs = case["requests"]
        assert 1 <= len(reqs) <= 6
        assert len({q["slot_id"] for q in reqs}) == len(reqs)
        for q in reqs:
            assert 0 <= q["prefix_len"] <= q["seq_len"] <= case["max_context"]
            assert _pages(q["seq_len"]) <= case["row_pages"][q["slot_id"]]
    else:
        p = case["problem"]
        qo, kv, off = (np.array(p[k]) for k in ("qo_lens", "kv_lens", "qo_offset"))
        assert (qo >= 0).all() and (kv >= qo).all() and (off >= 0).all()
        if case["causal"]:
            assert (off + qo <= kv).all()
        assert (qo.max() <= 8) == (case["phase"] == "decode")
        if case["override"] == "int":
            assert (off == off[0]).all()
        po = case["plan_qo_offset"]
        if case["causal"] and po is not None:
            assert (np.asarray(po) + qo <= kv).all() and (np.asarray(po) >= 0).all()


def _cpu_plan(case):
    """The CPU plan msa builds for the case (its lengths and limits accepted)."""
    Hq, Hkv, D, topk = case["num_qo_heads"], case["num_kv_heads"], case["head_dim"], case["topk"]
    if case["family"] == "decode":
        return msa.plan_decode(case["batch_size"], 1, case["plan_max_kv_len"] or DECODE_MAX_KV_LEN, num_qo_heads=Hq,
                               num_kv_heads=Hkv, head_dim=D, page_size=P, topk=topk, causal=False)
    if case["family"] == "prefill":
        reqs = case["requests"]
        return msa.plan_prefill([q["seq_len"] - q["prefix_len"] for q in reqs], [q["seq_len"] for q in reqs],
                                qo_offset=[q["prefix_len"] for q in reqs], num_qo_heads=Hq, num_kv_heads=Hkv,
                                head_dim=D, page_size=P, topk=topk, causal=True)
    p = case["problem"]
    if case["phase"] == "decode":
        return msa.plan_decode(len(p["qo_lens"]), max(p["qo_lens"]), max(max(p["kv_lens"]), 1), num_qo_heads=Hq,
                               num_kv_heads=Hkv, head_dim=D, page_size=case["page_size"], topk=topk,
                               causal=case["causal"])
    return msa.plan_prefill(p["qo_lens"], p["kv_lens"], qo_offset=p["qo_offset"], num_qo_heads=Hq,
                            num_kv_heads=Hkv, head_dim=D, page_size=case["page_size"], topk=topk,
                            causal=case["causal"])


def test_draws_are_valid_and_deterministic():
    """Every seed of the GPU sweep (and of the CPU one) draws the same case twice, a valid one within its
    budget whose lengths and limits the CPU plans accept; both sweeps reach the shapes and edges they
    are meant to (padding, turnover, page edges crossed, M3's shape, both page-table buffer sizes, ...)."""
    seen = set()
    for backend, seeds in (("gpu", SEEDS), ("cpu", CPU_SEEDS)):
        for fam in FAMILIES:
            for seed in seeds[fam]:
                case = DRAW[fam](seed, backend)
                assert case == DRAW[fam](seed, backend), (fam, seed)
                try:
                    _check_invariants(case)
                    _cpu_plan(case)
                except Exception as e:
                    raise AssertionError(f"{type(e).__name__}: {e}\n{describe(case)}") from e
                if backend == "gpu":
                    seen |= _features(case)
    full = all(len(SEEDS[f]) >= 40 for f in FAMILIES)
    wanted = {"decode:padding", "decode:turnover", "decode:page crossed", "decode:len 1", "decode:meta agrees",
              "decode:meta differs", "decode:M3", "decode:group 4", "decode:head_dim 64", "decode:fp16",
              "decode:int32 seq_lens", "decode:buf tight", "decode:buf larger", "decode:graph",
              "prefill:fresh", "prefill:prefix", "prefill:1-token chunk", "prefill:M3",
              "table:decode", "table:prefill", "table:dense attention", "table:non-causal"}
    assert not full or wanted <= seen, sorted(wanted - seen)


def _features(case) -> set:
    """Names of what a GPU draw covers (test_draws_are_valid_and_deterministic checks the sweep reaches them)."""
    fam = case["family"]
    f = set()
    m3 = case["num_qo_heads"] // case["num_kv_heads"] == 16 and case["head_dim"] == 128
    if m3:
        f.add("M3")
    f.add(f"group {case['num_qo_heads'] // case['num_kv_heads']}")
    f.add(f"head_dim {case['head_dim']}")
    f.add(case["dtype"])
    if fam == "decode":
        lens = [s["seq_lens"] for s in case["steps"]]
        if any(0 in x for x in lens):
            f.add("padding")
        if any(s0["slot_ids"] != s1["slot_ids"] for s0, s1 in zip(case["steps"], case["steps"][1:])):
            f.add("turnover")
        if any(a and b == a + 1 and a % P == 0 for x, y in zip(lens, lens[1:]) for a, b in zip(x, y)):
            f.add("page crossed")
        if any(1 in x for x in lens):
            f.add("len 1")
        f.add("meta agrees" if meta_plan_agrees(case) else "meta differs")
        f.add(f"{case['seq_dtype']} seq_lens")
        ctx = max(_pages(case["max_context"]), 1)
        f.add("buf tight" if case["buf_pages"] < ctx else "buf larger" if case["buf_pages"] > ctx else "buf context")
        if case["graph"]:
            f.add("graph")
    elif fam == "prefill":
        for q in case["requests"]:
            f.add("fresh" if q["prefix_len"] == 0 else "prefix")
            if q["seq_len"] - q["prefix_len"] == 1:
                f.add("1-token chunk")
    else:
        f.add(case["phase"])
        f.add("dense attention" if not case["topk"] else "sparse attention")
        f.add("causal" if case["causal"] else "non-causal")
    return {f"{fam}:{x}" for x in f}


@pytest.mark.parametrize("seed", CPU_SEEDS["decode"], ids=lambda s: f"seed{s}")
def test_cpu_decode_steps_numpy(seed):
    """The decode sequences of the CPU sweep through the calls the drop-in makes, in msa's numpy API (CI has
    no torch): one decode plan (causal=False, the query at seq_len - 1 sees every key), build_page_table
    into the [B, max_pages] rows of one poisoned buffer before each step, msa.attention on those dense rows
    and on the flat buffer with page_indptr = b * max_pages (the same bits), fp32 data (bf16 values)."""
    case = draw_decode(seed, "cpu")
    rng = np.random.default_rng(case["data_seed"])
    state = PoolState(rng, case)
    Hq, Hkv, D, topk, B = (case["num_qo_heads"], case["num_kv_heads"], case["head_dim"], case["topk"],
                           case["batch_size"])
    view = (-1, P, Hkv, D)
    k_paged = state.k_pool.reshape(view).transpose(0, 2, 1, 3)  # views: write_token's rows show through
    v_paged = state.v_pool.reshape(view).transpose(0, 2, 1, 3)
    plan = msa.plan_decode(B, 1, case["plan_max_kv_len"] or DECODE_MAX_KV_LEN, num_qo_heads=Hq, num_kv_heads=Hkv,
                           head_dim=D, page_size=P, topk=topk, causal=False)
    mp = case["buf_pages"]
    buf = np.full(B * mp + case["buf_extra"], POISON_PAGE, np.int32)
    rows = buf[:B * mp].reshape(B, mp)
    indptr = np.arange(0, (B + 1) * mp, mp, dtype=np.int32)
    for s, step in enumerate(case["steps"]):
        lens = np.asarray(step["seq_lens"])
        for b in np.flatnonzero(lens):
            state.write_token(rng, step["slot_ids"][b], int(lens[b]) - 1)
        batch = decode_batch(rng, case, step)
        with reported(case, f"step {s}: "):
            msa.build_page_table(state.req_to_token, np.asarray(step["slot_ids"], case["slot_dtype"]),
                                 lens.astype(case["seq_dtype"]), P, out=rows)
            args = (plan, batch["q"], k_paged, v_paged)
            # The drop-in on CPU tensors clears the entries past a request's blocks (the garbage of padded
            # requests), which msa's CPU backend refuses and its GPU kernels read as empty slots.
            blocks = np.append(-(-batch["seq_lens"].astype(np.int64) // P), 0)
            bi = batch["topk_idx"].transpose(1, 0, 2)
            bi = np.where(bi >= blocks[np.searchsorted(batch["cu_seqlens"][1:], np.arange(len(bi)), "right")]
                          [:, None, None], -1, bi)
            seqs = dict(block_idx=bi, qo_offset=batch["prefix_lens"],
                        sm_scale=_eff_sm_scale(case))  # the drop-in's max(seq_len - 1, 0)
            o = msa.attention(*args, rows, batch["cu_seqlens"], batch["seq_lens"], **seqs)
            o_flat = msa.attention(*args, buf, batch["cu_seqlens"], batch["seq_lens"], page_indptr=indptr, **seqs)
            ref, _ = mt.ref_attention(state.problem(batch, sm_scale=_eff_sm_scale(case)))
            mt.assert_close(o, ref)
            assert not o[lens == 0].any(), "a padded request (seq_len 0) returns o = 0"
            np.testing.assert_array_equal(o, o_flat)
            assert (buf[B * mp:] == POISON_PAGE).all(), "build_page_table wrote past the B rows"


@pytest.mark.parametrize("seed", CPU_SEEDS["decode"], ids=lambda s: f"seed{s}")
def test_cpu_decode(seed):
    """The decode sequences of the CPU sweep through msa.sglang on CPU tensors (the CPU backend)."""
    torch = pytest.importorskip("torch")
    run_decode(torch, draw_decode(seed, "cpu"), "cpu")


@pytest.mark.parametrize("seed", CPU_SEEDS["prefill"], ids=lambda s: f"seed{s}")
def test_cpu_prefill(seed):
    torch = pytest.importorskip("torch")
    run_prefill(torch, draw_prefill(seed, "cpu"), "cpu")


@pytest.mark.parametrize("seed", CPU_SEEDS["table"], ids=lambda s: f"seed{s}")
def test_cpu_table(seed):
    torch = pytest.importorskip("torch")
    run_table(torch, draw_table(seed, "cpu"), "cpu")
