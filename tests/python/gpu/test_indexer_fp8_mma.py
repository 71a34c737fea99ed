"""Prefill block scores with fp8 index keys on fp8 MMAs (sm_90a: wgmma e4m3 x e4m3, queries quantized to e4m3
per row with amax -> 448): against a float64 model of that quantization, the error budget against the exact
float64 scores on unit-variance data, and the top-k recall against the exact path (MSA_INDEXER_PREFILL=portable:
keys converted to fp16, no query rounding). Other GPUs run the exact path for fp8 keys: these tests then skip.

Run on a GPU machine: PYTHONPATH=build/python python3 -m pytest tests/python/gpu/test_indexer_fp8_mma.py -q -s
(-s prints the measured error and recall).
"""
import math

import numpy as np
import pytest

import msa
import msa_testing as mt

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

D = 128
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def _needs_sm90():
    if not torch.cuda.is_available() or mt.kernel_capability() != (9, 0):
        pytest.skip("fp8 wgmma scores run on sm_90 only (other GPUs take the exact path)")


def index_problem(rng, qo_lens, kv_lens, *, heads=4, k_heads=1, page_size=128, dtype="bf16", **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=heads, num_kv_heads=k_heads,
                           head_dim=D, page_size=page_size, pattern=None, dtype=dtype, **kw)


def quantize_fp8(k):
    """Per-token e4m3 quantization of a [pages, Hk, P, D] cache (strides kept): (k8, k_scale fp32)."""
    scale = k.float().abs().amax(-1).clamp_min(1e-12) / 448.0
    return (k.float() / scale[..., None]).to(torch.float8_e4m3fn), scale.contiguous()


def quantized_queries(q):
    """The kernel's query rounding (mt.fp8_mma_queries: per (token, head) row, amax -> 448 in the device's fp32
    arithmetic, rounded to e4m3, times the row's inverse scale), float64 on the GPU."""
    return torch.from_numpy(mt.fp8_mma_queries(q.float().cpu().numpy())).cuda()


def run_scores(prob, t, k8, scale, *, layout="THK", causal=True, max_blocks=None):
    T, H = prob.q.shape[:2]
    nb = max_blocks or max(1, math.ceil(int(prob.kv_lens.max()) / 128))
    shape = (H, nb, T) if layout == "HKT" else (T, H, nb)
    out = torch.full(shape, float("nan"), dtype=torch.float32, device="cuda")
    msa.block_scores(t["q"], k8, t["page_table"], t["qo_indptr"], t["kv_lens"], qo_offset=t["qo_offset"],
                     page_indptr=t["page_indptr"], k_scale=scale, layout=layout, causal=causal, out=out)
    torch.cuda.synchronize()
    s = out.cpu().numpy()
    return (s if layout == "THK" else np.transpose(s, (2, 0, 1))).astype(np.float64), nb


def ref_scores(prob, nb, q64, k8, scale, causal=True):
    """float64 [T, H, nb] on the GPU (the msa_testing reference, per request instead of per row): max over
    visible keys of q64 . (k8 x scale) per 128-key block, -inf where none."""
    T, H, _ = q64.shape
    Hk = k8.shape[1]
    G, P = H // Hk, k8.shape[2]
    out = torch.full((T, H, nb), float("-inf"), dtype=torch.float64, device="cuda")
    k8f = k8.float()
    qo_lens = np.diff(prob.qo_indptr)
    offs = (prob.kv_lens - qo_lens) if prob.qo_offset is None else prob.qo_offset
    for b in range(len(prob.kv_lens)):
        kl, n, t0 = int(prob.kv_lens[b]), int(qo_lens[b]), int(prob.qo_indptr[b])
        if kl <= 0 or n == 0:
            continue
        row = (prob.page_table[prob.page_indptr[b]:prob.page_indptr[b + 1]] if prob.page_indptr is not None
               else prob.page_table[b])
        keys = np.arange(kl)
        pages = torch.from_numpy(row[keys // P].astype(np.int64)).cuda()
        slots = torch.from_numpy(keys % P).cuda()
        k = k8f[pages, :, slots].double() * scale[pages, :, slots][..., None].double()  # [kl, Hk, D]
        pos = int(offs[b]) + torch.arange(n, device="cuda")
        hi = torch.clamp(pos + 1, max=kl) if causal else torch.full_like(pos, kl)
        visible = torch.arange(nb * 128, device="cuda")[None, :] < hi[:, None]  # [n, nb * 128]
        for kh in range(Hk):
            s = torch.einsum("ngd,jd->ngj", q64[t0:t0 + n, kh * G:(kh + 1) * G], k[:, kh])
            s = torch.nn.functional.pad(s, (0, nb * 128 - kl), value=float("-inf"))
            s = s.masked_fill(~visible[:, None, :], float("-inf"))
            out[t0:t0 + n, kh * G:(kh + 1) * G] = s.view(n, G, nb, 128).amax(-1)
    return out.cpu().numpy()


def finite_error(got, ref):
    assert not np.isnan(got).any(), "NaN left in the output (an element was not written)"
    assert (np.isneginf(got) == np.isneginf(ref)).all(), "-inf pattern (blocks without visible keys) differs"
    fin = ~np.isneginf(ref)
    return np.abs(got[fin] - ref[fin]), np.abs(ref[fin])


# Prefill shapes (total_q > 4 x batch): one request with a prefix, a ragged batch; pages of 128 and 64 (TMA
# boxes), 48 (the cp.async producer); head groups of 4, 1 and 16.
CASES = {
    "prefix_p128": dict(qo=[200], kv=[900]),
    "batch_p64": dict(qo=[70, 150, 1], kv=[70, 1000, 400], page_size=64),
    "batch_p48_cpasync": dict(qo=[70, 150, 1], kv=[70, 1000, 400], page_size=48),
    "one_head": dict(qo=[300], kv=[700], heads=1),
    "heads_16_two_k_heads": dict(qo=[90, 40], kv=[600, 300], heads=32, k_heads=2),
    "slot_major_p64": dict(qo=[130], kv=[500], page_size=64, slot_major=True, k_heads=2, heads=8),
    "two_ranges": dict(qo=[300], kv=[17000]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", ["HKT", "THK"])
@pytest.mark.parametrize("qdtype", ["bf16", "fp16"])
def test_fp8_mma_matches_model(rng, case, layout, qdtype):
    """The kernel computes the float64 scores of the e4m3-rounded queries (up to the tensor core's fp32
    accumulation): every kernel path (TMA / cp.async producer, masked diagonal blocks, -inf tails)."""
    kw = dict(CASES[case])
    qo, kv = kw.pop("qo"), kw.pop("kv")
    prob = index_problem(rng, qo, kv, dtype=qdtype, **kw)
    t = mt.to_torch(prob, device="cuda", dtype=TORCH_DTYPE[qdtype])
    k8, scale = quantize_fp8(t["k_cache"])
    got, nb = run_scores(prob, t, k8, scale, layout=layout)
    err, mag = finite_error(got, ref_scores(prob, nb, quantized_queries(t["q"]), k8, scale))
    tol = mt.FP8_MMA_TOL
    assert (err <= tol["atol"] + tol["rtol"] * mag).all(), f"max error {err.max():.4g} against the e4m3-query model"


def test_fp8_mma_non_causal_and_zero_rows(rng):
    """Non-causal scores, and query rows of zeros (amax 0: scores 0, not NaN)."""
    prob = index_problem(rng, [150], [600])
    t = mt.to_torch(prob, device="cuda", dtype=torch.bfloat16)
    t["q"][::7] = 0
    k8, scale = quantize_fp8(t["k_cache"])
    got, nb = run_scores(prob, t, k8, scale, causal=False)
    err, mag = finite_error(got, ref_scores(prob, nb, quantized_queries(t["q"]), k8, scale, causal=False))
    tol = mt.FP8_MMA_TOL
    assert (err <= tol["atol"] + tol["rtol"] * mag).all(), f"max error {err.max():.4g} against the e4m3-query model"
    assert (got[::7][np.isfinite(got[::7])] == 0).all()


def test_fp8_mma_error_budget_and_recall(rng, monkeypatch):
    """Unit-variance q and k, 2048 tokens over 16384 keys: the score error against the exact float64 scores
    (e4m3 rounding of q moves a product by <= 2^-4 relative: ~0.3 rms of a block score) and the top-16 of
    the fp8-MMA scores against the exact path's (MSA_INDEXER_PREFILL=portable)."""
    prob = index_problem(rng, [2048], [16384])
    t = mt.to_torch(prob, device="cuda", dtype=torch.bfloat16)
    k8, scale = quantize_fp8(t["k_cache"])
    got, nb = run_scores(prob, t, k8, scale)
    exact = ref_scores(prob, nb, t["q"].double(), k8, scale)
    err, _ = finite_error(got, exact)
    monkeypatch.setenv("MSA_INDEXER_PREFILL", "portable")
    ref_path, _ = run_scores(prob, t, k8, scale)
    monkeypatch.delenv("MSA_INDEXER_PREFILL")
    err_exact, _ = finite_error(ref_path, exact)

    def topk(s):
        dev = torch.from_numpy(s.astype(np.float32)).cuda()
        qi = torch.from_numpy(prob.qo_indptr).cuda()
        kl = torch.from_numpy(prob.kv_lens).cuda()
        return msa.select_topk(dev, qi, kl, 16, layout="THK").cpu().numpy()

    a, b = topk(got), topk(ref_path)
    rows = (a == b).all(-1).mean()
    shared = np.mean([len(set(x) & set(y)) / max(1, (y >= 0).sum())
                      for x, y in zip(a.reshape(-1, 16), b.reshape(-1, 16))])
    print(f"\nfp8 MMA scores vs float64 (unit variance, {err.size} scores): max |err| {err.max():.4f}, "
          f"rms {np.sqrt(np.mean(err ** 2)):.4f}; exact path max |err| {err_exact.max():.2e}; top-16 against the "
          f"exact path: {rows:.1%} of rows identical, {shared:.1%} of entries shared")
    assert err_exact.max() < 1e-2, "MSA_INDEXER_PREFILL=portable is the exact path"
    assert np.sqrt(np.mean(err ** 2)) < 0.5 and err.max() < 3.0, "beyond the e4m3 query budget"
    assert shared > 0.85
