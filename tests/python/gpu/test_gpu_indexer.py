"""The CUDA indexer (block_scores, select_topk) against the float64 references of msa_testing and the CPU
backend: every kernel family (decode: sm_90a TMA ring and streaming; prefill: sm_90a wgmma with a TMA or
cp.async producer, portable mma.sync with fp8 keys), both score layouts, both index layouts, paged and
strided caches, page ids outside the pool, NaN-poisoned outputs, the decode and prefill forms of the
top-k and its options (finite_only, block_map, out_scores), and CUDA graph replay with lengths rewritten in
place. Scores with fp8 keys are exact except on the sm_90 fp8-MMA prefill kernel (the default there), whose
e4m3-rounded queries mt.fp8_mma_queries models (fp8_expectation); MSA_INDEXER_PREFILL=portable checks the
exact path of the same shapes.

Run on a GPU machine: PYTHONPATH=build/python python3 -m pytest tests/python/gpu/test_gpu_indexer.py -q -s
(-s shows the printed fp8-vs-bf16 selection agreement).
"""
import math
import os

import numpy as np
import pytest

import msa
import msa_testing as mt

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
D = 128  # the CUDA indexer's head dim


# ---------------------------------------------------------------------------------------------
# inputs

def index_problem(rng, qo_lens, kv_lens, *, heads=4, k_heads=1, page_size=128, dtype="bf16", **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=heads, num_kv_heads=k_heads,
                           head_dim=D, page_size=page_size, pattern=None, dtype=dtype, **kw)


def gpu_inputs(prob):
    """torch CUDA tensors of the problem (strided views kept), in the problem's dtype."""
    return mt.to_torch(prob, device="cuda", dtype=TORCH_DTYPE[prob.dtype])


def quantize_fp8(k, pow2_scale=False):
    """Per-token e4m3 quantization of a [pages, Hk, P, D] cache (strides kept): (k8, k_scale fp32)."""
    amax = k.float().abs().amax(-1).clamp_min(1e-12)
    scale = amax / 448.0
    if pow2_scale:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    k8 = (k.float() / scale[..., None]).to(torch.float8_e4m3fn)
    return k8, scale.contiguous()


def nan_out(shape):
    return torch.full(shape, float("nan"), dtype=torch.float32, device="cuda")


def scores_shape(T, H, nb, layout):
    return (H, nb, T) if layout == "HKT" else (T, H, nb)


def to_thk(s, layout):
    s = s.cpu().numpy() if isinstance(s, torch.Tensor) else s
    return s if layout == "THK" else np.transpose(s, (2, 0, 1))


def run_scores(prob, t, *, layout="THK", causal=True, max_blocks=None, k=None, k_scale=None):
    T, H = prob.q.shape[:2]
    nb = max_blocks or max(1, math.ceil(int(prob.kv_lens.max()) / 128))
    out = nan_out(scores_shape(T, H, nb, layout))
    got = msa.block_scores(t["q"], t["k_cache"] if k is None else k, t["page_table"], t["qo_indptr"], t["kv_lens"],
                           qo_offset=t["qo_offset"], page_indptr=t["page_indptr"], k_scale=k_scale, layout=layout,
                           causal=causal, out=out)
    assert got is out
    torch.cuda.synchronize()
    return to_thk(out, layout), nb


def ref_scores(prob, nb, *, causal=True, k_values=None, k_scale=None, q=None):
    return mt.ref_block_scores(prob.q if q is None else q, prob.k_cache if k_values is None else k_values,
                               prob.page_table, prob.page_indptr, prob.qo_indptr, prob.kv_lens,
                               qo_offset=prob.qo_offset, causal=causal, max_blocks=nb, k_scale=k_scale)


def fp8_mma(prob):
    """Whether block_scores with fp8 keys runs prob on the fp8-MMA kernel here (mt.fp8_mma_scores)."""
    return mt.fp8_mma_scores(prob.q.shape[0], len(prob.kv_lens), prob.num_qo_heads, prob.num_kv_heads,
                             mt.kernel_capability(), os.environ)


def fp8_expectation(prob):
    """(queries, assert_scores_equal tolerance) of the reference for scores with fp8 keys: on the fp8-MMA
    kernel the e4m3-rounded queries at mt.FP8_MMA_TOL, elsewhere the exact queries at the exact tolerance."""
    return (mt.fp8_mma_queries(prob.q), mt.FP8_MMA_TOL) if fp8_mma(prob) else (prob.q, {})


def assert_scores_equal(got_thk, ref, rtol=1e-4, atol=1e-3):
    got = np.asarray(got_thk, np.float64)
    assert not np.isnan(got).any(), "NaN left in the output (an element was not written)"
    assert (np.isneginf(got) == np.isneginf(ref)).all(), "-inf pattern (blocks without visible keys) differs"
    fin = ~np.isneginf(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=rtol, atol=atol)


# Shapes that reach each kernel family: total_q <= 4 * batch takes the decode (streaming) kernel,
# larger batches the prefill kernels (wgmma on sm_90a, mma.sync elsewhere and for fp8 keys).
SHAPES = {
    "decode_ragged": ([1] * 6, [1, 127, 128, 129, 700, 1500]),
    "mtp": ([3, 4, 2], [300, 900, 129]),
    "prefill_prefix": ([200], [900]),
    "prefill_batch": ([70, 150, 1], [70, 1000, 400]),
}


# ---------------------------------------------------------------------------------------------
# block_scores

@pytest.mark.parametrize("page_size", [64, 128])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("layout", ["HKT", "THK"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_block_scores(rng, dtype, layout, shape, page_size):
    qo, kv = SHAPES[shape]
    prob = index_problem(rng, qo, kv, page_size=page_size, dtype=dtype)
    got, nb = run_scores(prob, gpu_inputs(prob), layout=layout)
    assert_scores_equal(got, ref_scores(prob, nb))


@pytest.mark.parametrize("shape", ["decode_ragged", "prefill_batch"])
@pytest.mark.parametrize("case", ["non_causal", "offset_flat_table", "gqa_2_k_heads", "one_head", "heads_16",
                                  "slot_major", "page_32", "page_48", "page_256", "wide_max_blocks"])
def test_block_scores_variants(rng, case, shape):
    qo, kv = SHAPES[shape]
    kw, causal, nb = {}, True, None
    if case == "non_causal":
        causal = False
        kw["causal"] = False
    elif case == "offset_flat_table":
        kw.update(flat_pages=True, qo_offset=[max(0, n - len_q - 5) for n, len_q in zip(kv, qo)])
    elif case == "gqa_2_k_heads":
        kw.update(heads=8, k_heads=2)
    elif case == "one_head":
        kw.update(heads=1, k_heads=1)
    elif case == "heads_16":
        kw.update(heads=16, k_heads=1)
    elif case == "slot_major":
        kw.update(slot_major=True, page_size=64, k_heads=2, heads=8)
    elif case.startswith("page_"):
        kw["page_size"] = int(case.split("_")[1])
    elif case == "wide_max_blocks":
        nb = math.ceil(max(kv) / 128) + 3
    prob = index_problem(rng, qo, kv, **kw)
    got, nb = run_scores(prob, gpu_inputs(prob), causal=causal, max_blocks=nb, layout="HKT")
    assert_scores_equal(got, ref_scores(prob, nb, causal=causal))


@pytest.mark.parametrize("path", ["exact", "default"])
@pytest.mark.parametrize("shape", ["decode_ragged", "mtp", "prefill_prefix", "prefill_batch"])
@pytest.mark.parametrize("qdtype", ["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["HKT", "THK"])
def test_block_scores_fp8_keys(rng, monkeypatch, layout, qdtype, shape, path):
    """fp8 keys with per-token scales. exact: MSA_INDEXER_PREFILL=portable, every kernel exact (rtol 1e-4);
    default: the prefill shapes take the fp8-MMA kernel on sm_90 (fp8_expectation)."""
    if path == "exact":
        monkeypatch.setenv("MSA_INDEXER_PREFILL", "portable")
    qo, kv = SHAPES[shape]
    prob = index_problem(rng, qo, kv, page_size=64, dtype=qdtype, slot_major=(shape == "mtp"))
    t = gpu_inputs(prob)
    k8, scale = quantize_fp8(t["k_cache"])
    got, nb = run_scores(prob, t, layout=layout, k=k8, k_scale=scale)
    k_values = k8.float().cpu().numpy()
    q, tol = fp8_expectation(prob)
    assert_scores_equal(got, ref_scores(prob, nb, q=q, k_values=k_values, k_scale=scale.cpu().numpy()), **tol)


# How the same shapes reach the other kernel of each family (the defaults are the TMA ring for decode and
# the TMA producer for prefill): an environment switch (docs/knobs.md), or for the cp.async producer of the
# sm_90a prefill kernel an index-K cache TMA cannot read (pages of 48 keys: neither a multiple of 128 nor a
# divisor of it). (environment, page size or None)
KERNEL_SWITCHES = {
    "default": ({}, None),
    "decode_stream": ({"MSA_INDEXER_DECODE": "stream"}, None),
    "prefill_cpasync": ({}, 48),
}


@pytest.mark.parametrize("switch", list(KERNEL_SWITCHES))
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kdtype", ["bf16", "fp8"])
def test_block_scores_kernel_switches(rng, monkeypatch, switch, shape, kdtype):
    env, page_size = KERNEL_SWITCHES[switch]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    qo, kv = SHAPES[shape]
    prob = index_problem(rng, qo, kv, page_size=page_size or (64 if shape == "mtp" else 128))
    t = gpu_inputs(prob)
    tol = {}
    if kdtype == "fp8":
        k8, scale = quantize_fp8(t["k_cache"])
        got, nb = run_scores(prob, t, layout="HKT", k=k8, k_scale=scale)
        q, tol = fp8_expectation(prob)
        want = ref_scores(prob, nb, q=q, k_values=k8.float().cpu().numpy(), k_scale=scale.cpu().numpy())
    else:
        got, nb = run_scores(prob, t, layout="HKT")
        want = ref_scores(prob, nb)
    assert_scores_equal(got, want, **tol)


@pytest.mark.parametrize("page_size", [32, 48, 64, 128, 256])
@pytest.mark.parametrize("shape", ["decode_ragged", "mtp", "prefill_batch"])
@pytest.mark.parametrize("kdtype", ["bf16", "fp8"])
@pytest.mark.parametrize("switch", ["default", "decode_stream"])
def test_block_scores_pages_outside_pool(rng, monkeypatch, switch, kdtype, shape, page_size):
    """Page-table entries outside [0, num_pages) inside the visible range read as zero keys (score 0); pages
    of 48 keys take the cp.async producer of the sm_90a prefill kernel."""
    for k, v in KERNEL_SWITCHES[switch][0].items():
        monkeypatch.setenv(k, v)
    qo, kv = SHAPES[shape]
    prob = index_problem(rng, qo, kv, page_size=page_size)
    num_pages = prob.k_cache.shape[0]
    table = prob.page_table.copy()
    for b, n in enumerate(kv):  # poison one visible page per request (every other request: -1 / past the pool)
        used = math.ceil(n / page_size)
        if used > 1:
            table[b, rng.integers(0, used - 1)] = -1 if b % 2 else num_pages + 3
    prob.page_table = table
    t = gpu_inputs(prob)
    # Reference: the pool plus one zero page that every outside entry points to.
    zero = np.zeros((1,) + prob.k_cache.shape[1:], prob.k_cache.dtype)
    k_ref = np.concatenate([np.asarray(prob.k_cache, np.float64), zero])
    ref_table = np.where((table < 0) | (table >= num_pages), num_pages, table).astype(np.int32)
    k_scale, q, tol = None, prob.q, {}
    if kdtype == "fp8":
        k8, scale = quantize_fp8(t["k_cache"])
        k_ref = np.concatenate([k8.float().cpu().numpy(), zero])
        k_scale = np.concatenate([scale.cpu().numpy(), np.ones((1,) + tuple(scale.shape[1:]), np.float32)])
        got, nb = run_scores(prob, t, layout="THK", k=k8, k_scale=scale)
        q, tol = fp8_expectation(prob)
    else:
        got, nb = run_scores(prob, t, layout="THK")
    want = mt.ref_block_scores(q, k_ref, ref_table, prob.page_indptr, prob.qo_indptr, prob.kv_lens,
                               qo_offset=prob.qo_offset, max_blocks=nb, k_scale=k_scale)
    assert_scores_equal(got, want, **tol)


def test_block_scores_portable_prefill_bf16(rng, monkeypatch):
    """The sm_80 (mma.sync) prefill kernel with bf16 keys, forced on sm_90 through MSA_INDEXER_PREFILL."""
    monkeypatch.setenv("MSA_INDEXER_PREFILL", "portable")
    for qo, kv in (SHAPES["prefill_prefix"], SHAPES["prefill_batch"]):
        prob = index_problem(rng, qo, kv, page_size=64)
        got, nb = run_scores(prob, gpu_inputs(prob), layout="THK")
        assert_scores_equal(got, ref_scores(prob, nb))


def cpu_scores(prob, t, nb, layout, k=None, k_scale=None, q=None):
    """The CPU backend on the same values: fp32 copies of the device tensors (strides kept) or of q; fp8 keys
    dequantized (k * scale in fp32)."""
    kk = (t["k_cache"] if k is None else k).float()
    if k_scale is not None:
        kk = kk * k_scale[..., None]
    qq = t["q"].float().cpu().numpy() if q is None else np.asarray(q, np.float32)
    s = msa.block_scores(qq, kk.cpu().numpy(), prob.page_table, prob.qo_indptr,
                         prob.kv_lens, qo_offset=prob.qo_offset, page_indptr=prob.page_indptr, max_blocks=nb,
                         layout=layout)
    return to_thk(s, layout).astype(np.float64)


@pytest.mark.parametrize("layout", ["HKT", "THK"])
@pytest.mark.parametrize("case", ["prefill_two_ranges", "prefill_batch_long", "decode_long", "fp8_prefill_long"])
def test_block_scores_long_vs_cpu(rng, monkeypatch, case, layout):
    """Multiple block ranges per token tile, tails of -inf, long decode rows: against the CPU backend (fp8 keys
    on the fp8-MMA kernel: the CPU backend on its e4m3-rounded queries, then the exact path exactly)."""
    if case == "prefill_two_ranges":
        qo, kv = [300], [17000]
    elif case == "prefill_batch_long":
        qo, kv = [520, 40, 700], [8800, 40, 12000]
    elif case == "decode_long":
        qo, kv = [1, 1, 1], [20000, 65536, 3]
    else:
        qo, kv = [260], [10000]
    prob = index_problem(rng, qo, kv)
    t = gpu_inputs(prob)
    nb = math.ceil(max(kv) / 128) + 1
    k, ks = quantize_fp8(t["k_cache"]) if case.startswith("fp8") else (None, None)
    got, _ = run_scores(prob, t, layout=layout, max_blocks=nb, k=k, k_scale=ks)
    if k is not None and fp8_mma(prob):
        q, tol = fp8_expectation(prob)
        assert_scores_equal(got, cpu_scores(prob, t, nb, "THK", k=k, k_scale=ks, q=q), **tol)
        monkeypatch.setenv("MSA_INDEXER_PREFILL", "portable")
        got, _ = run_scores(prob, t, layout=layout, max_blocks=nb, k=k, k_scale=ks)
    assert_scores_equal(got, cpu_scores(prob, t, nb, "THK", k=k, k_scale=ks))


# ---------------------------------------------------------------------------------------------
# select_topk

def random_scores(rng, T, H, nb, *, ties=True, nan_frac=0.05, ninf_frac=0.05):
    s = rng.integers(0, 6, (T, H, nb)).astype(np.float32) if ties else \
        rng.standard_normal((T, H, nb)).astype(np.float32)
    s[rng.random(s.shape) < 0.02] = -0.0
    s[rng.random(s.shape) < nan_frac] = np.nan
    s[rng.random(s.shape) < ninf_frac] = -np.inf
    return s


def gpu_topk(s_thk, qo_indptr, kv_lens, topk, *, score_layout, index_layout, qo_offset=None, force=(0, 1),
             causal=True):
    T, H, nb = s_thk.shape
    s = torch.from_numpy(s_thk if score_layout == "THK" else np.ascontiguousarray(s_thk.transpose(1, 2, 0))).cuda()
    if index_layout == "HTK":  # sglang's [H, T, topk] buffer passed as its [T, H, topk] view
        store = torch.full((H, T, topk), 77, dtype=torch.int32, device="cuda")
        out = store.permute(1, 0, 2)
    else:
        out = torch.full((T, H, topk), 77, dtype=torch.int32, device="cuda")
    dev = lambda a: None if a is None else torch.from_numpy(np.asarray(a, np.int32)).cuda()  # noqa: E731
    got = msa.select_topk(s, dev(qo_indptr), dev(kv_lens), topk, qo_offset=dev(qo_offset), layout=score_layout,
                          force_begin=force[0], force_end=force[1], causal=causal, out=out)
    assert got is out
    return out.cpu().numpy()


def cpu_topk(s_thk, qo_indptr, kv_lens, topk, *, qo_offset=None, force=(0, 1), causal=True):
    return msa.select_topk(s_thk, np.asarray(qo_indptr, np.int32), np.asarray(kv_lens, np.int32), topk,
                           qo_offset=None if qo_offset is None else np.asarray(qo_offset, np.int32), layout="THK",
                           force_begin=force[0], force_end=force[1], causal=causal)


@pytest.mark.parametrize("index_layout", ["THK", "HTK"])
@pytest.mark.parametrize("score_layout", ["HKT", "THK"])
@pytest.mark.parametrize("force", [(0, 1), (1, 1), (2, 3), (0, 0)])
@pytest.mark.parametrize("topk", [16, 32, 64])
def test_select_topk(rng, topk, force, score_layout, index_layout):
    qo_lens, kv_lens = [1, 7, 300, 1], [130, 4100, 9000, 65536]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    nb = math.ceil(max(kv_lens) / 128)
    s = random_scores(rng, int(qo_indptr[-1]), 4, nb)
    got = gpu_topk(s, qo_indptr, kv_lens, topk, score_layout=score_layout, index_layout=index_layout, force=force)
    want = cpu_topk(s, qo_indptr, kv_lens, topk, force=force)
    np.testing.assert_array_equal(got, want)
    # and the float64 reference of msa_testing on the short requests
    ref = mt.ref_select_topk(s[:8].astype(np.float64), qo_indptr[:3], kv_lens[:2], topk, force_begin=force[0],
                             force_end=force[1])
    np.testing.assert_array_equal(got[:8], ref)


@pytest.mark.parametrize("nb", [1, 40, 100, 600, 1500, 2500, 8192, 20000])
def test_select_topk_row_lengths(rng, nb):
    """Every register capacity of a warp per row (1..64 keys per lane) and of a CTA per row (> 2048 blocks)."""
    kv_lens = [nb * 128, nb * 128 - 5, 77, 0]
    qo_lens = [3, 1, 1, 0]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    s = random_scores(rng, int(qo_indptr[-1]), 2, nb, ties=False)
    for score_layout in ("HKT", "THK"):
        got = gpu_topk(s, qo_indptr, kv_lens, 16, score_layout=score_layout, index_layout="THK")
        np.testing.assert_array_equal(got, cpu_topk(s, qo_indptr, kv_lens, 16))


@pytest.mark.parametrize("nb", [2049, 9000, 32768])
@pytest.mark.parametrize("topk,force", [(64, (2, 3)), (16, (0, 1)), (5, (0, 0))])
@pytest.mark.parametrize("score_layout", ["HKT", "THK"])
def test_select_topk_long_rows_ties(rng, nb, topk, force, score_layout):
    """A CTA per row (> 2048 blocks): ties at the threshold spread over the row's warps (the lowest-index equal
    keys are taken across warps), forced blocks in the first and last warps, short and empty rows beside long; and
    with prefixes (qo_offset): rows that end before kv_len, one of them mid-row (a CTA per row from 9000 blocks)."""
    kv_lens = [nb * 128, nb * 128 - 200, 3000, 300, 0]
    qo_lens = [2, 1, 1, 1, 0]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    offsets = [nb * 128 - 200, (nb * 128 - 200) // 2 + 7, 1000, 0, 0]
    for ties, qo_offset in ((True, None), (False, None), (True, offsets)):
        s = random_scores(rng, int(qo_indptr[-1]), 2, nb, ties=ties)
        got = gpu_topk(s, qo_indptr, kv_lens, topk, score_layout=score_layout, index_layout="THK", force=force,
                       qo_offset=qo_offset)
        np.testing.assert_array_equal(got, cpu_topk(s, qo_indptr, kv_lens, topk, force=force, qo_offset=qo_offset))


# (qo_lens, kv_lens) of select_topk's forms: decode (<= 4 tokens per request), MTP, ragged with empty requests, prefill.
TOPK_FORM_LENGTHS = {
    "decode": ([1] * 9, [130, 4100, 9000, 65536, 1, 128, 129, 20000, 2048]),
    "mtp_uniform": ([3] * 5, [400, 4100, 9000, 65536, 3]),
    "ragged_few_tokens": ([0, 4, 1, 0, 3, 2, 1], [10, 900, 5000, 7, 30000, 65536, 300]),
    "prefill_causal": ([5000, 40], [9000, 40]),
    # Token counts that are multiples of 8 (a CTA's warps all take rows of one head), rows of 1 to 1024 blocks.
    "decode_x8": ([1] * 16, [130, 4100, 9000, 65536, 1, 128, 129, 20000, 2048, 131072, 77, 300, 5000, 65535, 16384, 12]),
    "decode_short_x8": ([1] * 8, [100, 4096, 3000, 1, 129, 2048, 4000, 512]),
    "mtp_x8": ([2] * 8, [400, 4100, 9000, 65536, 3, 2, 129, 2048]),
    "ragged_x8": ([0, 4, 1, 0, 3, 2, 1, 5], [10, 900, 5000, 7, 30000, 65536, 300, 4000]),
}


@pytest.mark.parametrize("case", list(TOPK_FORM_LENGTHS))
@pytest.mark.parametrize("score_layout", ["HKT", "THK"])
@pytest.mark.parametrize("ties", [False, True])
def test_select_topk_forms(rng, case, score_layout, ties):
    """The decode form (<= 4 tokens per request: request guessed from the token, row loaded before the
    lengths arrive; a wrong guess falls back to the search) and the prefill form (keys per lane sized
    to each row's valid blocks), against the CPU backend."""
    qo_lens, kv_lens = TOPK_FORM_LENGTHS[case]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    nb = math.ceil(max(kv_lens) / 128)
    s = random_scores(rng, int(qo_indptr[-1]), 4, nb, ties=ties)
    got = gpu_topk(s, qo_indptr, kv_lens, 16, score_layout=score_layout, index_layout="THK")
    np.testing.assert_array_equal(got, cpu_topk(s, qo_indptr, kv_lens, 16))


@pytest.mark.parametrize("causal", [True, False])
def test_select_topk_offsets_and_empty_rows(rng, causal):
    # non-causal rows of a request with kv_len = 0 are all -1; causal rows before their first block
    qo_lens, kv_lens = [4, 2, 9], [0, 300, 2000]
    qo_offset = [0, 10, 1500] if not causal else None
    if causal:
        kv_lens[0] = 4
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    s = random_scores(rng, int(qo_indptr[-1]), 3, math.ceil(max(kv_lens) / 128))
    for index_layout in ("THK", "HTK"):
        got = gpu_topk(s, qo_indptr, kv_lens, 16, score_layout="THK", index_layout=index_layout,
                       qo_offset=qo_offset, causal=causal)
        np.testing.assert_array_equal(got, cpu_topk(s, qo_indptr, kv_lens, 16, qo_offset=qo_offset, causal=causal))
    if not causal:
        assert (got[:4] == -1).all()


# ---------------------------------------------------------------------------------------------
# select_topk's options: finite_only, block_map, out_scores (the CUDA kernel against the CPU backend)

def spiky_scores(rng, T, H, nb, *, ties=True):
    """Scores where each row keeps a random share of finite values (none, a few, about half, nearly all); the
    rest NaN, -inf or +inf."""
    return mt.non_finite_rows(rng, random_scores(rng, T, H, nb, ties=ties, nan_frac=0.0, ninf_frac=0.0),
                              (0.0, 0.02, 0.5, 0.95))


def topk_options(s_thk, qo_indptr, kv_lens, topk, *, device, score_layout="THK", qo_offset=None, force=(0, 1),
                 causal=True, finite_only=True, block_map=None):
    """msa.select_topk with the options on numpy (CPU backend) or torch CUDA tensors: (ids, scores) as numpy.
    block_map is passed with row stride max_blocks + 3, out_scores as a head-major view with slot stride 2."""
    T, H, nb = s_thk.shape
    cuda = device == "cuda"

    def put(a):
        a = np.ascontiguousarray(a)
        return torch.from_numpy(a).cuda() if cuda else a

    s = s_thk if score_layout == "THK" else s_thk.transpose(1, 2, 0)
    bm = None
    if block_map is not None:
        store = np.full((block_map.shape[0], nb + 3), -9, np.int32)
        store[:, :nb] = block_map
        bm = put(store)[:, :nb]
    os_store = put(np.full((H, T, 2 * topk), 5.0, np.float32))
    out_scores = (os_store.permute(1, 0, 2) if cuda else os_store.transpose(1, 0, 2))[:, :, ::2]
    ids, _ = msa.select_topk(put(s), put(np.asarray(qo_indptr, np.int32)), put(np.asarray(kv_lens, np.int32)), topk,
                             qo_offset=None if qo_offset is None else put(np.asarray(qo_offset, np.int32)),
                             layout=score_layout, force_begin=force[0], force_end=force[1], causal=causal,
                             finite_only=finite_only, block_map=bm, out_scores=out_scores, return_scores=True)
    ids, os_host = (ids.cpu().numpy(), os_store.cpu().numpy()) if cuda else (np.array(ids), np.array(os_store))
    assert (os_host[:, :, 1::2] == 5.0).all(), "out_scores written outside its view"
    return ids, os_host[:, :, ::2].transpose(1, 0, 2)


def assert_options_match(s, qo_indptr, kv_lens, topk, **kw):
    got = topk_options(s, qo_indptr, kv_lens, topk, device="cuda", **kw)
    kw.pop("score_layout", None)
    want = topk_options(s, qo_indptr, kv_lens, topk, device="cpu", **kw)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])  # NaN where NaN


def owned_ids(rng, B, nb):
    """A block map: per request, nb distinct global ids in [0, 4 nb), ascending like a shard's owned blocks."""
    return np.sort(rng.random((B, 4 * nb)).argsort(axis=1)[:, :nb], axis=1).astype(np.int32)


@pytest.mark.parametrize("score_layout", ["HKT", "THK"])
@pytest.mark.parametrize("finite_only", [True, False])
@pytest.mark.parametrize("force", [(0, 1), (1, 1), (2, 3), (0, 0)])
@pytest.mark.parametrize("topk", [1, 16, 64])
def test_select_topk_options(rng, topk, force, finite_only, score_layout):
    if sum(force) > topk:
        force = (0, topk)
    qo_lens, kv_lens = [1, 7, 300, 1], [130, 4100, 9000, 65536]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    nb = math.ceil(max(kv_lens) / 128)
    s = spiky_scores(rng, int(qo_indptr[-1]), 4, nb)
    assert_options_match(s, qo_indptr, kv_lens, topk, score_layout=score_layout, force=force,
                         finite_only=finite_only, block_map=owned_ids(rng, len(kv_lens), nb))


@pytest.mark.parametrize("nb", [1, 40, 100, 600, 1500, 2500, 8192, 20000])
@pytest.mark.parametrize("ties", [False, True])
def test_select_topk_options_row_lengths(rng, nb, ties):
    """Every register capacity (1..64 keys per lane) and a CTA per row (> 2048 blocks), decode
    (one token per request) and prefill (many tokens per request) forms, rows with few or no finite scores."""
    for qo_lens in ([1, 1, 1, 0], [9, 3, 5, 0]):
        kv_lens = [nb * 128, nb * 128 - 5, 77, 0]
        qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
        s = spiky_scores(rng, int(qo_indptr[-1]), 2, nb, ties=ties)
        for score_layout in ("HKT", "THK"):
            assert_options_match(s, qo_indptr, kv_lens, 16, score_layout=score_layout, force=(1, 1),
                                 block_map=owned_ids(rng, 4, nb))


@pytest.mark.parametrize("case", [*TOPK_FORM_LENGTHS, "per_token"])
@pytest.mark.parametrize("score_layout", ["HKT", "THK"])
def test_select_topk_options_forms(rng, case, score_layout):
    """The decode form (request guessed from the token) and the prefill form, each option alone and all
    together; per_token: every token its own non-causal request (msa.flashinfer.msa_topk_select's call)."""
    offset, causal = None, True
    if case in TOPK_FORM_LENGTHS:
        qo_lens, kv_lens = TOPK_FORM_LENGTHS[case]
    else:
        qo_lens = [1] * 64
        kv_lens = list(rng.integers(0, 260, 64) * 128)
        offset, causal = [0] * 64, False
    B = len(qo_lens)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    nb = max(math.ceil(max(kv_lens) / 128), 1)
    s = spiky_scores(rng, int(qo_indptr[-1]), 4, nb)
    bm = owned_ids(rng, B, nb)
    for finite_only, block_map in ((True, None), (False, bm), (True, bm)):
        assert_options_match(s, qo_indptr, kv_lens, 16, score_layout=score_layout, qo_offset=offset, causal=causal,
                             force=(0, 1), finite_only=finite_only, block_map=block_map)


def test_select_topk_options_in_a_cuda_graph(rng):
    """finite_only + block_map + out_scores captured once, replayed with new scores and lengths."""
    B, nb, topk = 8, 300, 16
    qo_indptr = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    kv = torch.full((B,), nb * 128, dtype=torch.int32, device="cuda")
    s = torch.from_numpy(spiky_scores(rng, B, 4, nb)).cuda()
    bm = torch.from_numpy(owned_ids(rng, B, nb)).cuda()
    ids = torch.empty((B, 4, topk), dtype=torch.int32, device="cuda")
    sc = torch.empty((B, 4, topk), device="cuda")

    def step():
        msa.select_topk(s, qo_indptr, kv, topk, layout="THK", finite_only=True, block_map=bm, out=ids,
                        out_scores=sc)

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(3):
        new_s = spiky_scores(rng, B, 4, nb)
        new_kv = rng.integers(1, nb * 128 + 1, B).astype(np.int32)
        s.copy_(torch.from_numpy(new_s))
        kv.copy_(torch.from_numpy(new_kv))
        g.replay()
        torch.cuda.synchronize()
        want = topk_options(new_s, np.arange(B + 1), new_kv, topk, device="cpu", block_map=bm.cpu().numpy())
        np.testing.assert_array_equal(ids.cpu().numpy(), want[0])
        np.testing.assert_array_equal(sc.cpu().numpy(), want[1])


# ---------------------------------------------------------------------------------------------
# scores -> top-k, fp8 vs bf16, CUDA graphs

def decode_problem(rng, B, kv_len, heads=4):
    return index_problem(rng, [1] * B, [kv_len] * B, heads=heads, dtype="bf16")


def test_fp8_selection_matches_bf16(rng):
    """fp8 keys with power-of-two scales dequantize exactly to bf16 keys: the fp8 path must score them like the
    bf16 path (exact conversions, fp32 sums) and select the same blocks; then the agreement of the fp8 and
    bf16 selections on unit-variance keys with ordinary per-token scales is printed (a property of the data)."""
    prob = decode_problem(rng, 8, 16384)
    t = gpu_inputs(prob)
    k8, scale = quantize_fp8(t["k_cache"], pow2_scale=True)
    k_deq = (k8.float() * scale[..., None]).to(torch.bfloat16)
    nb = 128
    s8, _ = run_scores(prob, t, k=k8, k_scale=scale, max_blocks=nb)
    sb, _ = run_scores(prob, t, k=k_deq, max_blocks=nb)
    assert_scores_equal(s8, sb.astype(np.float64), rtol=1e-5, atol=1e-3)

    k8, scale = quantize_fp8(t["k_cache"])
    rows = {}
    for name, kw in (("bf16", {}), ("fp8", dict(k=k8, k_scale=scale))):
        s, _ = run_scores(prob, t, max_blocks=nb, **kw)
        rows[name] = gpu_topk(s.astype(np.float32), prob.qo_indptr, prob.kv_lens, 16, score_layout="THK",
                              index_layout="THK")
    same = (rows["fp8"] == rows["bf16"]).all(-1).mean()
    overlap = np.mean([len(set(a) & set(b)) / 16 for a, b in zip(rows["fp8"].reshape(-1, 16),
                                                                 rows["bf16"].reshape(-1, 16))])
    print(f"\nfp8 vs bf16 top-16 of {nb} blocks, random unit-variance q and k: {same:.1%} of rows identical, "
          f"{overlap:.1%} of entries shared")
    assert overlap > 0.8


def test_cuda_graph_scores_topk_with_changing_lengths(rng):
    """Capture block_scores + select_topk once; rewrite kv_lens and the page table in place; replays equal eager."""
    B, max_kv, topk = 6, 4096, 16
    prob = decode_problem(rng, B, max_kv)
    t = gpu_inputs(prob)
    nb = max_kv // 128
    kv_dev = t["kv_lens"]
    scores = torch.empty((4, nb, B), dtype=torch.float32, device="cuda")
    idx = torch.empty((B, 4, topk), dtype=torch.int32, device="cuda")

    def step(s_out, i_out):
        msa.block_scores(t["q"], t["k_cache"], t["page_table"], t["qo_indptr"], kv_dev, out=s_out, layout="HKT")
        msa.select_topk(s_out, t["qo_indptr"], kv_dev, topk, layout="HKT", out=i_out)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(scores, idx)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(scores, idx)

    page_table = t["page_table"]
    for trial in range(4):
        lens = rng.integers(1, max_kv + 1, B).astype(np.int32)
        kv_dev.copy_(torch.from_numpy(lens))
        width = max_kv // 128  # valid entries of each row (the last column is the -1 pad)
        perm = torch.from_numpy(rng.permutation(width)).cuda()
        page_table[:, :width] = page_table[:, perm].clone()  # pages move around within each row
        graph.replay()
        torch.cuda.synchronize()
        s_ref = torch.full_like(scores, float("nan"))
        i_ref = torch.full_like(idx, 77)
        step(s_ref, i_ref)
        torch.cuda.synchronize()
        assert torch.equal(scores, s_ref), f"trial {trial}: replayed scores differ from eager"
        assert torch.equal(idx, i_ref), f"trial {trial}: replayed top-k differs from eager"
        # and the eager result is right
        prob.kv_lens = lens
        prob.page_table = page_table.cpu().numpy()
        want = ref_scores(prob, nb)
        assert_scores_equal(to_thk(s_ref, "HKT"), want)


def test_selection_topk_limits_name_their_error_kind():
    """top-k past the CUDA kernels' 64 slots a row is valid input this backend cannot run (NotImplementedError, as the
    contract's error kinds say; the CPU backend takes it); outside 1..2^20 it is a bad value on both (ValueError)."""
    T, H, nb = 3, 2, 80
    qo_indptr = torch.tensor([0, T], dtype=torch.int32)
    kv_lens = torch.tensor([nb * 128], dtype=torch.int32)
    s = torch.randn(T, H, nb)
    cpu_ids = msa.select_topk(s.numpy(), qo_indptr.numpy(), kv_lens.numpy(), 65, layout="THK", causal=False)
    assert np.asarray(cpu_ids).shape == (T, H, 65)
    d = dict(qo_indptr=qo_indptr.cuda(), kv_lens=kv_lens.cuda())
    with pytest.raises(NotImplementedError, match="topk.*1..64.*got 65"):
        msa.select_topk(s.cuda(), d["qo_indptr"], d["kv_lens"], 65, layout="THK", causal=False)
    for bad in (0, (1 << 20) + 1):
        with pytest.raises(ValueError, match="argument 'topk'"):
            msa.select_topk(s.cuda(), d["qo_indptr"], d["kv_lens"], bad, layout="THK", causal=False)
    cand_s = torch.randn(2, T, H, 40).cuda()  # two ranks' candidates
    cand_i = torch.randint(0, nb, (2, T, H, 40), dtype=torch.int32).cuda()
    with pytest.raises(NotImplementedError, match="topk.*1..64.*got 65"):
        msa.merge_candidates(cand_s, cand_i, d["qo_indptr"], d["kv_lens"], 65, nb, causal=False)
