"""A seeded random-configuration sweep ("fuzz") of msa.attention against the float64 reference of
msa_testing, for the combinations that the hand-picked cases of test_gpu_attention.py, test_gpu_prefill.py
and test_gpu_token_decode.py do not name. Each seed draws (draw_case) one valid configuration: phase
(decode 60% / prefill 40%), bf16 / fp16, KV heads 1-4, group 1-32 (mostly 16), head dim 64/128/256, page
size (16-256, 7, 192), sparse top-k 1-64 with the random / clustered / shared selections or dense (a
quarter of the cases take MiniMax-M3's G=16, D=128, top-k 16/32, which the token decode kernel and the
sm90 prefill serve); a ragged batch of 1-9 requests (qo_len 0, empty requests, lengths around multiples of
128, decode contexts up to ~5000 with 1-8 tokens, prefill chunks up to 300 after prefixes, explicit
qo_offset with keys after the chunk, non-causal rows that see no key); causal or not; unsorted rows with
-1 slots and empty rows; the flat or dense page table, the slot-major pool, the [Hkv, T, topk] index
layout; decode plans with limits above the batch's and q / block_idx rows past qo_indptr; max_splits /
fixed_split_blocks; the kernel-choice environment knobs; sm_scale, lse optional, validate; fp8 e4m3 K/V
(separate or interleaved pools, against the reference over the dequantized cache). The lengths
are shrunk until the case's make_problem + ref_attention cost (ref_cost, a conservative estimate) fits
COST_BUDGET. Outputs are poisoned (NaN) before every run; a failure prints the drawn case, which
draw_case(seed) rebuilds exactly.

test_draw_case_is_valid_and_deterministic (CPU) checks every draw; test_cpu_fuzz runs the CPU backend on
draws of its own (fp32 and head_dim_v != head_dim too); test_gpu_fuzz (marked gpu) is the GPU sweep.

    PYTHONPATH=build/python python3 -m pytest -q tests/python/fuzz/test_gpu_fuzz.py
    PYTHONPATH=build/python python3 -m pytest -q "tests/python/fuzz/test_gpu_fuzz.py::test_gpu_fuzz[seed17]"
    MSA_FUZZ_FIRST_SEED=1000 MSA_FUZZ_SEEDS=2000 PYTHONPATH=build/python python3 -m pytest -q -m gpu \
        tests/python/fuzz/test_gpu_fuzz.py                           # a longer soak over other seeds
"""
import dataclasses
import math

import numpy as np
import pytest

import msa
import msa_testing as mt
from fuzz_testing import (decode_lengths, describe as fuzz_describe, gpu_seeds, pick,
                          prefill_lengths, shrinking)

SEEDS = gpu_seeds(120)
CPU_SEEDS = range(30)

COST_BUDGET = 1.0       # estimated CPU seconds of make_problem + ref_attention per GPU case (measured: ~0.3x)
CPU_COST_BUDGET = 0.3   # the same for the CPU-backend sweep (which also runs the C++ reference)

# Estimated CPU costs (one core of the development machine, one BLAS thread as conftest sets; rather high
# than low): make_problem draws and rounds every K / V / q element and loops in Python over (token, KV head)
# to build sparse selections; ref_attention loops over (token, KV head), builds the visible keys block by
# block, gathers them from the pages and runs two small matmuls of G x keys x D.
C_PAIR_REF = 20e-6      # s per (token, KV head) in ref_attention
C_BLOCK_REF = 4e-6      # s per visible 128-key block of a sparse row in ref_attention
C_PAIR_SEL = 20e-6      # s per (token, KV head) in make_problem's selection loop (sparse only)
C_GEN = 50e-9           # s per random element drawn and rounded (K, V pool and q)
C_GATHER = 1.5e-9       # s per visible key x (D + Dv) gathered and converted
C_MAC = 0.1e-9          # s per visible key x G x (D + Dv) multiply-add


def visible_bound(qo_lens, kv_lens, qo_offset, causal, topk):
    """Upper bounds of the keys and of the 128-key blocks visible to one KV head, summed over tokens: the
    causal range, and for sparse problems at most topk blocks of it."""
    keys = blocks = 0
    for ql, kl, o in zip(qo_lens, kv_lens, qo_offset):
        if ql == 0 or kl <= 0:
            continue
        hi = np.minimum(kl, o + np.arange(ql) + 1) if causal else np.full(ql, kl)
        nb = -(-np.maximum(hi, 0) // mt.BLOCK)
        if topk:
            hi, nb = np.minimum(hi, topk * mt.BLOCK), np.minimum(nb, topk)
        keys += int(np.maximum(hi, 0).sum())
        blocks += int(nb.sum())
    return keys, blocks


def ref_cost(case) -> float:
    """Estimated CPU seconds of make_problem + ref_attention for the case (see the C_* constants)."""
    p = case["problem"]
    Hkv, Hq = p["num_kv_heads"], p["num_qo_heads"]
    G, D = Hq // Hkv, p["head_dim"]
    Dv = p["head_dim_v"] or D
    P = p["page_size"]
    T = sum(p["qo_lens"])
    off = p["qo_offset"] if p["qo_offset"] is not None else [k - q for q, k in zip(p["qo_lens"], p["kv_lens"])]
    keys, blocks = visible_bound(p["qo_lens"], p["kv_lens"], off, p["causal"], p["topk"] if p["pattern"] else 0)
    keys, blocks = keys * Hkv, blocks * Hkv if p["pattern"] else 0
    pages = sum(math.ceil(k / P) for k in p["kv_lens"]) + p["spare_pages"]
    gen = pages * P * Hkv * (D + Dv) + T * Hq * D
    pairs = T * Hkv
    return (pairs * (C_PAIR_REF + (C_PAIR_SEL if p["pattern"] else 0.0)) + blocks * C_BLOCK_REF + gen * C_GEN
            + keys * (D + Dv) * (C_GATHER + G * C_MAC))


def draw_case(seed: int, backend: str = "gpu") -> dict:
    """One valid configuration, drawn from np.random.default_rng(seed) alone (the problem's data come from
    the seed too: case["data_seed"]). backend "gpu" draws what the CUDA kernels serve (D = Dv in 64/128/256,
    bf16 / fp16); "cpu" also draws fp32 and Dv != D, with a smaller cost budget."""
    assert backend in ("gpu", "cpu")
    r = np.random.default_rng(seed)
    decode = r.random() < 0.6
    if backend == "cpu":
        dtype = pick(r, ["bf16", "fp16", "fp32"], [0.6, 0.2, 0.2])
    else:
        dtype = pick(r, ["bf16", "fp16"], [0.8, 0.2])
    num_kv_heads = pick(r, [1, 2, 3, 4], [0.4, 0.25, 0.1, 0.25])
    group = pick(r, [1, 2, 4, 8, 12, 16, 32], [0.06, 0.06, 0.12, 0.1, 0.1, 0.44, 0.12])
    head_dim = pick(r, [64, 128, 256], [0.2, 0.6, 0.2])
    head_dim_v = None
    if backend == "cpu" and r.random() < 0.2:
        head_dim_v = pick(r, [32, 64, 128])
    page_size = pick(r, [16, 32, 64, 128, 256, 7, 192], [0.12, 0.1, 0.16, 0.32, 0.14, 0.08, 0.08])
    sparse = r.random() < 0.7
    topk = pick(r, [1, 4, 8, 16, 32, 64], [0.03, 0.14, 0.18, 0.4, 0.2, 0.05]) if sparse else 0
    if r.random() < 0.25:  # MiniMax-M3's shape: what the token decode kernel and the sm90 prefill serve
        num_kv_heads, group, head_dim, sparse = pick(r, [1, 4]), 16, 128, True
        topk = pick(r, [16, 32], [0.8, 0.2])
        page_size = pick(r, [64, 128, 256, 192] if decode else [128, 256], None)
    pattern = pick(r, ["random", "clustered", "shared"], [0.5, 0.25, 0.25]) if sparse else None
    causal = r.random() < 0.85
    explicit_offset = r.random() < 0.25
    zero_q = r.random() < 0.25
    B0 = int(r.integers(1, 10))
    if decode:
        qmax = pick(r, [1, 2, 3, 4, 5, 8], [0.45, 0.15, 0.1, 0.15, 0.05, 0.1])
        ragged = qmax > 1 and r.random() < 0.5
    problem = dict(
        num_qo_heads=group * num_kv_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_v=head_dim_v,
        page_size=page_size, topk=topk, pattern=pattern, causal=causal,
        neg_slot_prob=pick(r, [0.0, 0.2, 0.6]), shuffle_rows=r.random() < 0.85,
        flat_pages=r.random() < 0.3, slot_major=r.random() < 0.25,
        index_layout="HTK" if sparse and r.random() < 0.25 else "THK",
        dtype=dtype, spare_pages=pick(r, [0, 1, 3], [0.2, 0.4, 0.4]),
        sm_scale=None if r.random() < 0.8 else round(float(r.uniform(0.02, 0.3)), 4),
        empty_row_prob=pick(r, [0.0, 0.05, 0.2, 0.5], [0.6, 0.2, 0.15, 0.05]) if sparse else 0.0,
    )
    budget = COST_BUDGET if backend == "gpu" else CPU_COST_BUDGET
    for attempt, scale, B in shrinking(f"draw_case({seed})", B0):  # until the reference fits the budget
        if decode:
            qo, kv, off = decode_lengths(r, B, qmax, ragged, zero_q, causal, explicit_offset, scale, long_max=5001,
                                         edge_blocks=24)
        else:
            qo, kv, off = prefill_lengths(r, B, zero_q, causal, explicit_offset, scale, prefix_max=1500,
                                          edge_blocks=12)
        if attempt == 10:
            problem["spare_pages"] = 0
        if sum(kv) == 0:
            problem["spare_pages"] = max(problem["spare_pages"], 1)  # a pool of at least one page
        problem.update(qo_lens=qo, kv_lens=kv, qo_offset=off if explicit_offset else None)
        case = dict(seed=seed, backend=backend, phase="decode" if decode else "prefill", problem=problem)
        if ref_cost(case) <= budget:
            break

    split = {}
    if decode:
        max_q, max_kv = max(max(qo), 1), max(max(kv), 1)
        plan_max_qo_len = max_q if r.random() < 0.7 else int(r.integers(max_q, 9))
        plan_max_kv_len = max_kv if r.random() < 0.6 else max_kv + int(r.integers(0, 3 * max_kv + 4096))
        room = B * plan_max_qo_len - sum(qo)
        extra_q_rows = int(r.integers(1, room + 1)) if room > 0 and r.random() < 0.3 else 0
        kind = pick(r, ["auto", "max", "fixed", "both"], [0.5, 0.2, 0.2, 0.1])
        env = pick(r, [{}, {"MSA_PAGED_TOKEN_KERNEL": "0"}], [0.85, 0.15])
    else:
        plan_max_qo_len = plan_max_kv_len = None
        extra_q_rows = 0
        kind = pick(r, ["auto", "max", "fixed"], [0.75, 0.15, 0.1])
        env = pick(r, [{}, {"MSA_SM90_PREFILL": "qmajor"}, {"MSA_SM90_PREFILL": "kvmajor"}], [0.7, 0.15, 0.15])
    if kind in ("max", "both"):
        split["max_splits"] = pick(r, [1, 2, 3, 4, 16])
    if kind in ("fixed", "both"):
        split["fixed_split_blocks"] = pick(r, [1, 2, 3, 5, 8])
    case.update(
        data_seed=[seed, 1], plan_max_qo_len=plan_max_qo_len, plan_max_kv_len=plan_max_kv_len,
        extra_q_rows=extra_q_rows, split=split, env=env if backend == "gpu" else {},
        with_lse=r.random() < 0.85, validate=r.random() < 0.1, est_cost=round(ref_cost(case), 4))
    # Drawn last, so that the draws above stay what they were: fp8 e4m3 K/V (separate pools in the problem's
    # layout, or the halves of one interleaved pool) for a third of the GPU cases.
    if backend == "gpu":
        same_dims = case["problem"]["head_dim_v"] is None
        case["kv_fp8"] = pick(r, [None, "separate", "interleaved" if same_dims else "separate"], [0.7, 0.15, 0.15])
        # The Hopper prefill's query-major tiles on fp8 K/V: the plan's 16-bit copy of the blocks, or the
        # in-kernel widening (drawn after the cache, so that the draws above stay what they were).
        if case["kv_fp8"] and not decode and r.random() < 0.3:
            case["env"] = {**case["env"], "MSA_SM90_FP8_QMAJOR": "tiles"}
    return case


def describe(case) -> str:
    return fuzz_describe(case, f"draw_case({case['seed']}, {case['backend']!r})")


def build_problem(case, **override) -> mt.Problem:
    kw = dict(case["problem"], **override)
    return mt.make_problem(np.random.default_rng(case["data_seed"]), **kw)


def make_plan(case, prob, device):
    kw = dict(num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=prob.head_dim,
              head_dim_v=prob.head_dim_v, page_size=prob.page_size, topk=prob.topk, causal=prob.causal,
              device=device, **case["split"])
    if case["phase"] == "decode":
        return msa.plan_decode(prob.batch_size, case["plan_max_qo_len"], case["plan_max_kv_len"], **kw)
    return msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset, **kw)


def check_against_reference(case, prob, o, lse):
    """test_gpu_attention.check's comparison; the drawn case in the message of any failure."""
    o_ref, lse_ref = mt.ref_attention(prob)
    try:
        mt.assert_close(o, o_ref)
        if lse is not None:
            mt.assert_lse_close(lse, lse_ref)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{describe(case)}") from None


# ---- the GPU sweep --------------------------------------------------------------------------------------

FP8_K_SCALE, FP8_V_SCALE = 0.137, 0.29


def fp8_kv(torch, case, prob, dev):
    """(k, v, prob with their dequantized values) for a case with fp8 K/V: separate pools keep the problem's
    strides (the slot-major pool), or the two halves of one interleaved pool."""
    k8, v8, kd, vd = mt.fp8_kv(prob, FP8_K_SCALE, FP8_V_SCALE, interleaved=case["kv_fp8"] == "interleaved")

    def to_dev(a):
        return torch.from_numpy(a.view(np.uint8)).to(dev).view(torch.float8_e4m3fn)

    if case["kv_fp8"] == "interleaved":
        pool, D = to_dev(k8.base), prob.head_dim
        k, v = pool[..., :D], pool[..., D:]
    else:
        k, v = to_dev(k8), to_dev(v8)
    return k, v, dataclasses.replace(prob, k_cache=kd, v_cache=vd)


def run_torch(torch, case, plan, prob, dev="cuda", kv=None):
    """o, lse (numpy; lse None when the case passes none) of msa.attention on torch tensors, outputs poisoned
    with NaN; q and block_idx hold case["extra_q_rows"] rows past qo_indptr (garbage that the kernels must not
    read for any query), block_idx keeping the problem's layout. kv: (k, v) fp8 tensors in place of prob's."""
    t = mt.to_torch(prob, dev, {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[prob.dtype])
    scales = {}
    if kv is not None:
        t["k_cache"], t["v_cache"] = kv
        scales = dict(k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE)
    q, bi = t["q"], t["block_idx"]
    extra = case["extra_q_rows"]
    if extra:
        g = torch.Generator(device=dev).manual_seed(case["seed"])
        q = torch.cat([q, torch.randn(extra, *q.shape[1:], device=dev, dtype=q.dtype, generator=g)])
        if bi is not None:
            pad = torch.randint(-1, 64, (extra, *bi.shape[1:]), device=dev, dtype=bi.dtype, generator=g)
            bi = torch.cat([bi, pad])
            if case["problem"]["index_layout"] == "HTK":
                bi = bi.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    T = q.shape[0]
    out = torch.full((T, prob.num_qo_heads, prob.head_dim_v), float("nan"), device=dev, dtype=q.dtype)
    lse = torch.full((T, prob.num_qo_heads), float("nan"), device=dev, dtype=torch.float32) \
        if case["with_lse"] else None
    call_attention(case, plan, q, t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                   block_idx=bi, qo_offset=t["qo_offset"], page_indptr=t["page_indptr"], out=out, lse=lse, **scales)
    if dev != "cpu":
        torch.cuda.synchronize()
    n = prob.q.shape[0]
    return out[:n].float().cpu().numpy(), None if lse is None else lse[:n].cpu().numpy()


def call_attention(case, plan, q, *args, **kw):
    """msa.attention with the case's sm_scale and validate; any error carries the drawn case. (A q of 0 rows
    comes with strides 0 from numpy 2, which torch.from_numpy keeps; msa takes an empty tensor's strides as
    row-major, so such a q is accepted.)"""
    try:
        return msa.attention(plan, q, *args, sm_scale=case["problem"]["sm_scale"], validate=case["validate"], **kw)
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n{describe(case)}") from e


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
def test_gpu_fuzz(seed, monkeypatch):
    torch = pytest.importorskip("torch")
    case = draw_case(seed)
    print(describe(case))  # shown with any failure (-s shows it before a crash too)
    for name, value in case["env"].items():  # read at plan time
        monkeypatch.setenv(name, value)
    prob = build_problem(case)
    try:
        plan = make_plan(case, prob, "cuda")
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n{describe(case)}") from e
    print("plan:", plan.describe())  # which kernel, rows, splits, merge
    kv = None
    if case.get("kv_fp8"):
        k8, v8, prob_ref = fp8_kv(torch, case, prob, "cuda")
        kv = (k8, v8)
    else:
        prob_ref = prob
    o, lse = run_torch(torch, case, plan, prob, kv=kv)
    check_against_reference(case, prob_ref, o, lse)


# ---- CPU: the draws themselves, and the CPU backend on a few ----------------------------------------------

def _check_case_invariants(case):
    p = case["problem"]
    qo, kv = np.array(p["qo_lens"]), np.array(p["kv_lens"])
    off = np.array(p["qo_offset"]) if p["qo_offset"] is not None else kv - qo
    assert 1 <= len(qo) <= 9 and len(kv) == len(qo) and (qo >= 0).all() and (kv >= 0).all()
    assert (off >= 0).all()
    if p["causal"]:
        assert (off + qo <= kv).all()
    if case["backend"] == "gpu":
        assert p["head_dim"] in (64, 128, 256) and p["head_dim_v"] is None and p["dtype"] in ("bf16", "fp16")
        assert p["num_qo_heads"] // p["num_kv_heads"] <= 128
    if p["pattern"]:
        assert 1 <= p["topk"] <= 64
    if case["phase"] == "decode":
        assert 1 <= case["plan_max_qo_len"] <= 8 and qo.max() <= case["plan_max_qo_len"]
        assert kv.max() <= case["plan_max_kv_len"]
        assert qo.sum() + case["extra_q_rows"] <= len(qo) * case["plan_max_qo_len"]
    assert case["est_cost"] <= (COST_BUDGET if case["backend"] == "gpu" else CPU_COST_BUDGET) + 1e-4


def test_draw_case_is_valid_and_deterministic():
    """Every seed of the GPU sweep (and of the CPU one) draws the same case twice, a valid one within the
    reference budget: make_problem builds it (with head dim 8, so the K / V draw is cheap; nothing else
    depends on the head dim), the CPU plan accepts its lengths and limits, and the built problem's visible
    keys stay under the bound that the cost estimate uses."""
    for backend, seeds in (("gpu", SEEDS), ("cpu", CPU_SEEDS)):
        for seed in seeds:
            case = draw_case(seed, backend)
            assert case == draw_case(seed, backend), seed
            _check_case_invariants(case)
            p = case["problem"]
            prob = build_problem(case, head_dim=8, head_dim_v=None)
            make_plan(case, prob, "cpu")
            assert prob.q.shape == (sum(p["qo_lens"]), p["num_qo_heads"], 8)
            if p["pattern"]:
                assert prob.block_idx.shape == (prob.q.shape[0], p["num_kv_heads"], p["topk"])
            pos, req = prob.positions(), prob.request_of_token()
            seen = sum(len(mt.visible_keys(prob, t, g, int(req[t]), int(pos[t])))
                       for t in range(prob.q.shape[0]) for g in range(prob.num_kv_heads))
            bound = visible_bound(p["qo_lens"], p["kv_lens"], prob.offsets(), p["causal"],
                                  p["topk"] if p["pattern"] else 0)[0] * p["num_kv_heads"]
            assert seen <= bound, (seed, seen, bound)
    phases = {draw_case(s)["phase"] for s in SEEDS}
    assert len(SEEDS) < 20 or phases == {"decode", "prefill"}


@pytest.mark.parametrize("seed", CPU_SEEDS, ids=lambda s: f"seed{s}")
def test_cpu_fuzz(seed):
    """The CPU backend (numpy inputs) on draws of the CPU sweep (fp32 and Dv != D included)."""
    pytest.importorskip("ml_dtypes")  # bf16 numpy arrays
    case = draw_case(seed, "cpu")
    prob = build_problem(case)
    a = mt.to_numpy(prob)
    q, bi = a["q"], a["block_idx"]
    if case["extra_q_rows"]:  # decode: q holds rows past qo_indptr
        q = np.concatenate([q, np.zeros((case["extra_q_rows"], *q.shape[1:]), q.dtype)])
        if bi is not None:
            bi = np.concatenate([bi, np.full((case["extra_q_rows"], *bi.shape[1:]), -1, bi.dtype)])
            if case["problem"]["index_layout"] == "HTK":
                bi = np.ascontiguousarray(bi.transpose(1, 0, 2)).transpose(1, 0, 2)
    try:
        plan = make_plan(case, prob, "cpu")
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n{describe(case)}") from e
    o, lse = call_attention(case, plan, q, a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"],
                            block_idx=bi, qo_offset=a["qo_offset"], page_indptr=a["page_indptr"], return_lse=True)
    n = prob.q.shape[0]
    check_against_reference(case, prob, o[:n].astype(np.float64), lse[:n])
