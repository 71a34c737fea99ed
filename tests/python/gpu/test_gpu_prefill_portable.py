"""The portable prefill (sm_80+): its KV-major path (src/cuda/prefill_portable: mma.sync + cp.async, the key lists
and LSE merge of prefill_sm90) beside the paged kernel (src/cuda/decode) on the query-major tiles, against the
float64 reference of msa_testing: the selection patterns under each decomposition (MSA_PORTABLE_PREFILL =
auto, qmajor, kvmajor), a cached prefix + a chunk, ragged batches, explicit qo_offset, unsorted rows with -1
anywhere, empty rows (o = 0, lse = -inf), several KV-major windows, G = 8 .. 128, top-k 8 .. 64, page sizes
128 / 256 and the fallbacks (64, G = 4, dense), the slot-major pool, the flat page table, the [Hkv, T, topk]
index layout, fp16, fp8 e4m3 K/V (two pools and one interleaved pool), repeated runs bitwise equal, CUDA graph
replays. Outputs are NaN-poisoned before every run.

MSA_PORTABLE_PREFILL = qmajor / kvmajor route prefill plans to the portable family on every GPU, sm_90 included
(where a build with sm_90a code would otherwise take the Hopper kernels); `auto` routes as the build does: the
Hopper kernels where the binary holds sm_90a code and the device is sm_90, the portable family elsewhere (an
sm_80-only build on the H200, MSA_CUDA_ARCH=80-real, runs it). The tests hold either way.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_prefill_portable.py

A small case for compute-sanitizer (memcheck / racecheck / synccheck), outside pytest:

    PYTHONPATH=build/python compute-sanitizer --tool racecheck python3 tests/python/gpu/test_gpu_prefill_portable.py
"""
import os
import sys
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402
from test_gpu_prefill import problem, watchdog  # noqa: E402,F401  (watchdog: the autouse hang guard)

pytestmark = pytest.mark.gpu

DEV = "cuda"
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ["auto", "qmajor", "kvmajor"]
Q_SCALE, K_SCALE, V_SCALE = 1.7, 0.137, 0.29  # not powers of two: a scale applied twice or not at all shows


def set_env(mode, window_tiles=None, env=None):
    """MSA_PORTABLE_PREFILL (and the KV-major window cap) for the next plan; env: monkeypatch or os.environ."""
    setenv = env.setenv if env is not None else os.environ.__setitem__
    setenv("MSA_PORTABLE_PREFILL", mode)
    if window_tiles:
        setenv("MSA_SM90_KV_WINDOW_TILES", str(window_tiles))
    elif env is not None:
        env.delenv("MSA_SM90_KV_WINDOW_TILES", raising=False)
    else:
        os.environ.pop("MSA_SM90_KV_WINDOW_TILES", None)


def kv_major_applies(prob, page_ok=True):
    """Whether the portable prefill has a KV-major path for this problem (prefill_portable/prefill.cu)."""
    G = prob.num_qo_heads // prob.num_kv_heads
    return (prob.block_idx is not None and 8 <= G <= 128 and G & (G - 1) == 0 and prob.head_dim == 128
            and prob.topk <= 64 and prob.page_size % 128 == 0 and page_ok and max(prob.qo_lens) >= 128 // G)


def plan_for(prob, monkeypatch, mode="auto", window_tiles=None):
    """A prefill plan under MSA_PORTABLE_PREFILL = mode; with qmajor / kvmajor, checks the route it names."""
    set_env(mode, window_tiles, monkeypatch)
    plan = msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset,
                            num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads,
                            head_dim=prob.head_dim, page_size=prob.page_size, topk=prob.topk,
                            causal=prob.causal, device=DEV)
    d = plan.describe()
    if mode != "auto":
        assert "sm90" not in d, d  # the knob sends the plan to the portable family
    if mode == "kvmajor":
        assert (d.get("portable") == "prefill") == kv_major_applies(prob), d
        if kv_major_applies(prob):
            assert d["kvmajor"] == "always", d
    if mode == "qmajor":
        assert "portable" not in d, d
    return plan


def run_gpu(plan, prob, tensors=None, k=None, v=None, **kw):
    """o, lse (numpy) of msa.attention with NaN-poisoned outputs."""
    t = tensors or mt.to_torch(prob, DEV, TORCH_DTYPE[prob.dtype])
    T = t["q"].shape[0]
    out = torch.full((T, prob.num_qo_heads, prob.head_dim_v), float("nan"), device=DEV, dtype=t["q"].dtype)
    lse = torch.full((T, prob.num_qo_heads), float("nan"), device=DEV, dtype=torch.float32)
    kw.setdefault("sm_scale", prob.sm_scale)
    msa.attention(plan, t["q"], t["k_cache"] if k is None else k, t["v_cache"] if v is None else v,
                  t["page_table"], t["qo_indptr"], t["kv_lens"], block_idx=t["block_idx"], qo_offset=t["qo_offset"],
                  page_indptr=t["page_indptr"], out=out, lse=lse, **kw)
    torch.cuda.synchronize()
    return out.float().cpu().numpy(), lse.cpu().numpy()


def check(plan, prob, tensors=None):
    o, lse = run_gpu(plan, prob, tensors)
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o, o_ref)
    mt.assert_lse_close(lse, lse_ref)
    return o, lse


# A cached prefix + a chunk (kv 1300, 260 new), a prefill from scratch with a tail (131 = 128 + 3), a
# short chunk after a prefix, and a request with no query tokens.
RAGGED = dict(qo_lens=[260, 131, 7, 0], kv_lens=[1300, 131, 900, 500])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern", ["random", "clustered", "shared"])
def test_sparse_patterns(rng, monkeypatch, pattern, mode):
    prob = problem(rng, **RAGGED, pattern=pattern, neg_slot_prob=0.3)
    check(plan_for(prob, monkeypatch, mode), prob)


@pytest.mark.parametrize("mode", ["auto", "kvmajor"])
def test_negative_scale(rng, monkeypatch, mode):
    """A negative sm_scale (finite, allowed): the KV-major kernel takes its row maximum on unscaled logits, so such
    a call runs on the paged kernel alone."""
    prob = problem(rng, **RAGGED, pattern="random", neg_slot_prob=0.2)
    prob = replace(prob, sm_scale=-prob.sm_scale)
    check(plan_for(prob, monkeypatch, mode), prob)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [True, False])
def test_dense_has_no_kv_major_path(rng, monkeypatch, mode, causal):
    """Dense plans run on the paged kernel alone whatever the knob."""
    prob = problem(rng, [300, 129, 1], [700, 129, 257], pattern=None, causal=causal)
    check(plan_for(prob, monkeypatch, mode), prob)


@pytest.mark.parametrize("mode", MODES)
def test_explicit_offset_and_empty_rows(rng, monkeypatch, mode):
    """qo_offset given (keys past the chunk exist but are in the future), some rows all -1."""
    prob = problem(rng, [200, 50], [1500, 700], qo_offset=[1000, 129], empty_row_prob=0.2)
    o, lse = check(plan_for(prob, monkeypatch, mode), prob)
    empty = (prob.block_idx < 0).all(axis=2)  # [T, Hkv]
    rows = np.repeat(empty, prob.num_qo_heads // prob.num_kv_heads, axis=1)
    assert rows.any(), "the problem should hold empty rows"
    assert (o[rows] == 0).all() and np.isneginf(lse[rows]).all()


@pytest.mark.parametrize("mode", ["auto", "kvmajor"])
def test_unsorted_rows_and_negative_slots(rng, monkeypatch, mode):
    """Rows in any order, -1 slots anywhere (half of them), a non-causal plan too."""
    for causal in (True, False):
        prob = problem(rng, [180, 40], [900, 600], neg_slot_prob=0.5, causal=causal)
        prob.block_idx = prob.block_idx[..., rng.permutation(prob.topk)].copy()
        check(plan_for(prob, monkeypatch, mode), prob)


@pytest.mark.parametrize("mode", ["qmajor", "kvmajor", "auto"])
def test_many_tiles_and_windows(rng, monkeypatch, mode):
    """Enough tiles to keep every SM busy (items claimed across CTAs), KV-major windows of 16 tiles."""
    prob = problem(rng, [1100, 300], [3000, 300], pattern="random")
    plan = plan_for(prob, monkeypatch, mode, window_tiles=16)
    if mode == "kvmajor":
        assert int(plan.describe()["windows"]) > 1, plan.describe()
    check(plan, prob)


@pytest.mark.parametrize("group,num_kv_heads", [(8, 4), (16, 2), (32, 1), (128, 1), (4, 2)])
@pytest.mark.parametrize("mode", ["auto", "kvmajor"])
def test_group_sizes(rng, monkeypatch, group, num_kv_heads, mode):
    """G = 8 (16 tokens a job) .. 128 (one token a job) take the KV-major path; G = 4 has none."""
    prob = problem(rng, [150, 40], [700, 40], group=group, num_kv_heads=num_kv_heads, pattern="random")
    check(plan_for(prob, monkeypatch, mode, window_tiles=24), prob)


@pytest.mark.parametrize("topk", [8, 32, 64])
def test_topk(rng, monkeypatch, topk):
    prob = problem(rng, [300, 70], [9000, 70], topk=topk, pattern="random")
    check(plan_for(prob, monkeypatch, "kvmajor", window_tiles=24), prob)


@pytest.mark.parametrize("page_size", [128, 256, 64])
@pytest.mark.parametrize("layout", ["slot_major", "flat", "htk"])
def test_pages_and_layouts(rng, monkeypatch, page_size, layout):
    """A 256-token page holds two blocks (the KV-major kernel's key offset inside a page); 64 has no KV-major
    path (the paged kernel alone)."""
    prob = problem(rng, [180, 33], [600, 400], page_size=page_size, slot_major=layout == "slot_major",
                   flat_pages=layout == "flat", index_layout="HTK" if layout == "htk" else "THK")
    check(plan_for(prob, monkeypatch, "kvmajor"), prob)


@pytest.mark.parametrize("pattern", ["random", "shared"])
def test_fp16(rng, monkeypatch, pattern):
    prob = problem(rng, [300, 20], [1500, 20], pattern=pattern, dtype="fp16")
    check(plan_for(prob, monkeypatch, "kvmajor"), prob)


def to_device_fp8(a):
    return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_fp8_kv(rng, monkeypatch, mode, dtype, interleaved):
    """fp8 e4m3 K/V widened to q's type in shared memory (exactly), q / k / v scales folded in, with lse."""
    prob = problem(rng, [300, 129, 1, 64], [700, 129, 257, 2000], num_kv_heads=4, dtype=dtype, empty_row_prob=0.05)
    k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE, interleaved=interleaved)
    if interleaved:
        pool = to_device_fp8(k8.base)
        k, v = pool[..., :prob.head_dim], pool[..., prob.head_dim:]
    else:
        k, v = to_device_fp8(k8), to_device_fp8(v8)
    plan = plan_for(prob, monkeypatch, mode, window_tiles=24)
    o, lse = run_gpu(plan, prob, k=k, v=v, sm_scale=prob.sm_scale, q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=V_SCALE)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE)
    mt.assert_close(o, o_ref)
    mt.assert_lse_close(lse, lse_ref)


def check_kv(plan, prob, kv):
    """check() on the bf16 cache, or on its e4m3 copy in two pools (K_SCALE, V_SCALE) against the dequantized
    reference."""
    if kv == "bf16":
        check(plan, prob)
        return
    k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE)
    o, lse = run_gpu(plan, prob, k=to_device_fp8(k8), v=to_device_fp8(v8), k_scale=K_SCALE, v_scale=V_SCALE)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd)
    mt.assert_close(o, o_ref)
    mt.assert_lse_close(lse, lse_ref)


@pytest.mark.parametrize("pattern", ["random", "shared"])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_one_kv_stage(rng, monkeypatch, pattern, kv):
    """MSA_PORTABLE_KV_STAGES=1: the one-stage kernel of the 99 KiB parts (sm_86 / 89 / 120), run here; items of
    one job (random) and of several (shared), several windows."""
    monkeypatch.setenv("MSA_PORTABLE_KV_STAGES", "1")
    prob = problem(rng, [700, 129, 5], [3000, 129, 900], num_kv_heads=2, pattern=pattern, neg_slot_prob=0.2)
    plan = plan_for(prob, monkeypatch, "kvmajor", window_tiles=16)
    assert plan.describe()["kv_stages"] == "1", plan.describe()
    check_kv(plan, prob, kv)


@pytest.mark.parametrize("shape,warp_rows,keys", [("keys32", "32", "32"), ("warps8", "16", "64")])
@pytest.mark.parametrize("pattern", [None, "shared", "clustered"])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_paged_tile_shapes(rng, monkeypatch, shape, warp_rows, keys, pattern, kv):
    """MSA_PAGED_TILE_SHAPE: the paged kernel's 128-row tiles as the A100 (4 warps of 32 rows, 32-key stages) and
    the sm_86 / 89 / 120 parts (8 warps of 16 rows) run them (the H200 takes 64-key stages), on the query-major
    tiles: dense and sparse, a cached prefix, a ragged batch with an empty request, both page sizes."""
    monkeypatch.setenv("MSA_PAGED_TILE_SHAPE", shape)
    page = 256 if pattern == "clustered" else 128
    prob = problem(rng, **RAGGED, num_kv_heads=2, pattern=pattern, page_size=page, empty_row_prob=0.05)
    plan = plan_for(prob, monkeypatch, "qmajor")
    d = plan.describe()
    assert (d["rows"], d["warp_rows"], d["keys"]) == ("128", warp_rows, keys), d
    check_kv(plan, prob, kv)


@pytest.mark.parametrize("mode", ["qmajor", "kvmajor"])
def test_repeated_runs_are_bitwise_equal(rng, monkeypatch, mode):
    """The KV-major lists are built with atomics and items claimed dynamically; results must not depend on it."""
    prob = problem(rng, [600, 90], [2000, 90], pattern="random")
    plan = plan_for(prob, monkeypatch, mode)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    first = run_gpu(plan, prob, t)
    for _ in range(3):
        again = run_gpu(plan, prob, t)
        np.testing.assert_array_equal(first[0], again[0])
        np.testing.assert_array_equal(first[1], again[1])


@pytest.mark.parametrize("mode", ["auto", "kvmajor"])
def test_graph_replays(rng, monkeypatch, mode):
    """Captured once in a CUDA graph and replayed (NaN-poisoned before each): the eager call's bits, close to the
    reference; over 3 KV-major windows."""
    prob = problem(rng, [600, 300], [8000, 900], pattern="random")
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    plan = plan_for(prob, monkeypatch, mode, window_tiles=80)
    T = t["q"].shape[0]
    out = torch.empty((T, prob.num_qo_heads, prob.head_dim_v), device=DEV, dtype=torch.bfloat16)
    lse = torch.empty((T, prob.num_qo_heads), device=DEV, dtype=torch.float32)

    def call():
        msa.attention(plan, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                      block_idx=t["block_idx"], qo_offset=t["qo_offset"], page_indptr=t["page_indptr"], out=out,
                      lse=lse, sm_scale=prob.sm_scale)

    def poisoned(fn):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        return out.float().cpu().numpy(), lse.cpu().numpy()

    eager = poisoned(call)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    torch.cuda.synchronize()
    for _ in range(3):
        again = poisoned(graph.replay)
        np.testing.assert_array_equal(again[0], eager[0])
        np.testing.assert_array_equal(again[1], eager[1])
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(eager[0], o_ref)
    mt.assert_lse_close(eager[1], lse_ref)


@pytest.mark.parametrize("mode", MODES)
def test_untrusted_device_values(rng, monkeypatch, mode):
    """Block ids out of range, duplicates, and page ids outside the pool are caller errors: no fault, no NaN;
    the rows the bad entries do not touch keep their exact results."""
    prob = problem(rng, [130, 40], [900, 300])
    o_ref, _ = mt.ref_attention(prob)
    bad = prob.block_idx.copy()
    bad[5, 0, :4] = [10**6, -7, 3, 3]       # out of range, negative, a duplicate
    bad[140, 1, 0] = 2**31 - 1
    prob.block_idx = bad
    table = prob.page_table.copy()
    table[1, 1] = prob.k_cache.shape[0] + 5  # request 1, keys 128..255: outside the pool
    prob.page_table = table
    o, lse = run_gpu(plan_for(prob, monkeypatch, mode), prob)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    untouched = np.ones(o.shape[0], bool)
    untouched[[5, 140]] = False
    untouched[130:] = False                  # request 1 reads the bad page
    mt.assert_close(o[untouched], o_ref[untouched])


def _sanitizer_case():
    """One small sparse case per decomposition: the launches compute-sanitizer watches. KV-major items span
    several jobs and CTAs claim several items (every K/V stage and item record reused)."""
    rng = np.random.default_rng(0)
    for mode, pattern, stages in (("qmajor", "clustered", "auto"), ("qmajor", "shared", "keys32"),
                                  ("qmajor", "shared", "warps8"), ("kvmajor", "random", "auto"),
                                  ("kvmajor", "shared", "auto"), ("kvmajor", "shared", "1")):
        set_env(mode)
        os.environ["MSA_PORTABLE_KV_STAGES"] = stages if stages in ("auto", "1") else "auto"
        os.environ["MSA_PAGED_TILE_SHAPE"] = stages if stages in ("keys32", "warps8") else "auto"
        prob = problem(rng, [300, 9], [1000, 9], pattern=pattern, num_kv_heads=1)
        o, lse = run_gpu(msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset,
                                          num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads,
                                          head_dim=prob.head_dim, page_size=prob.page_size, topk=prob.topk,
                                          causal=prob.causal, device=DEV), prob)
        o_ref, lse_ref = mt.ref_attention(prob)
        mt.assert_close(o, o_ref)
        mt.assert_lse_close(lse, lse_ref)
        print(f"{mode:8s} {pattern:10s} stages={stages} ok", flush=True)


if __name__ == "__main__":
    _sanitizer_case()
    sys.exit(0)
