"""The CUDA backend with fp8 e4m3 K/V and the per-tensor scales (contract §1, §3): against the float64 reference
over the dequantized cache, outputs poisoned before each call, on separate pools and on the two halves of one
interleaved [pages, Hkv, page, 2D] pool; decode (the single-token kernel with its split merges, MTP, the general
kernel), prefill with a prefix (Hopper kernels where they take the call, else the paged kernel), sparse and dense,
bf16 and fp16 q, head dims 64 / 128 / 256, -1 slots, ragged lengths and empty rows. Every e4m3 value converts
exactly (K through the logits, V through the output; NaN stays NaN). Also: 50 CUDA graph replays with the
lengths changing, the layer call, torch_ops, and q_scale / k_scale folded into sm_scale.

    PYTHONPATH=build/python:tests/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_attention_fp8.py
"""
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
Q_SCALE, K_SCALE, V_SCALE = 1.7, 0.137, 0.29  # not powers of two: a scale applied twice or not at all shows


def problem(rng, qo_lens, kv_lens, pattern="random", *, heads=(16, 2), head_dim=128, topk=8, **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=heads[0], num_kv_heads=heads[1],
                           head_dim=head_dim, page_size=kw.pop("page_size", 64), topk=topk, pattern=pattern, **kw)


def plan_for(prob, decode, device=DEV, **kw):
    kw = dict(num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=prob.head_dim,
              page_size=prob.page_size, topk=prob.topk, causal=prob.causal, device=device, **kw)
    if decode:
        return msa.plan_decode(prob.batch_size, int(prob.qo_lens.max()), int(prob.kv_lens.max()), **kw)
    return msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset, **kw)


def to_device_fp8(a):
    return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)


def fp8_tensors(prob, interleaved, k_scale=K_SCALE, v_scale=V_SCALE):
    """prob's K/V as float8_e4m3fn CUDA tensors, as two pools or the halves of one interleaved pool, and their
    dequantized values (float64) for the reference."""
    k8, v8, kd, vd = mt.fp8_kv(prob, k_scale, v_scale, interleaved=interleaved)
    if interleaved:
        pool = to_device_fp8(k8.base)
        D = prob.head_dim
        return pool[..., :D], pool[..., D:], kd, vd
    return to_device_fp8(k8), to_device_fp8(v8), kd, vd


def call(plan, prob, t, k, v, **kw):
    T = t["q"].shape[0]
    out = torch.full((T, prob.num_qo_heads, prob.head_dim_v), float("nan"), device=DEV, dtype=t["q"].dtype)
    lse = torch.full((T, prob.num_qo_heads), float("nan"), device=DEV, dtype=torch.float32)
    msa.attention(plan, t["q"], k, v, t["page_table"], t["qo_indptr"], t["kv_lens"], block_idx=t["block_idx"],
                  qo_offset=t["qo_offset"], page_indptr=t["page_indptr"], out=out, lse=lse, **kw)
    torch.cuda.synchronize()
    return out, lse


def check_fp8(prob, decode, dtype="bf16", interleaved=False, plan_kw=None, rows=None):
    t = mt.to_torch(prob, DEV, TORCH_DTYPE[dtype])
    k8, v8, kd, vd = fp8_tensors(prob, interleaved)
    out, lse = call(plan_for(prob, decode, **(plan_kw or {})), prob, t, k8, v8, q_scale=Q_SCALE, k_scale=K_SCALE,
                    v_scale=V_SCALE)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE)
    n = o_ref.shape[0] if rows is None else rows
    mt.assert_close(out.float().cpu().numpy()[:n], o_ref[:n])
    mt.assert_lse_close(lse.cpu().numpy()[:n], lse_ref[:n])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("pattern", ["random", None])
def test_decode(rng, interleaved, dtype, pattern):
    """One token per request: the single-token kernel on sm_90 (G = 8 here), the general kernel elsewhere."""
    prob = problem(rng, [1, 1, 1, 1], [900, 300, 1, 5000], pattern, dtype=dtype, empty_row_prob=0.1)
    check_fp8(prob, True, dtype, interleaved)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("max_splits", [None, 1])
def test_decode_m3_group_with_splits(rng, interleaved, max_splits):
    """M3's group of 16 heads, long rows split across a cluster (push merge) or not split."""
    prob = problem(rng, [1, 1], [20000, 3000], "random", heads=(64, 4), topk=16, page_size=128)
    check_fp8(prob, True, "bf16", interleaved, plan_kw={} if max_splits is None else dict(max_splits=max_splits))


@pytest.mark.parametrize("pattern", ["random", None])
def test_decode_fixed_split_and_workspace_merge(rng, pattern):
    prob = problem(rng, [1, 1, 1], [3000, 700, 6000], pattern, heads=(32, 2), topk=32)
    check_fp8(prob, True, "bf16", False, plan_kw=dict(fixed_split_blocks=3))
    # G = 32: the general kernel; 24 splits are more than a cluster holds, so they merge through the workspace.
    prob = problem(rng, [1, 1, 1], [3000, 700, 6000], pattern, heads=(64, 2), topk=32)
    check_fp8(prob, True, "bf16", True, plan_kw=dict(max_splits=24))


@pytest.mark.parametrize("qo", [2, 4, 8, 16])
@pytest.mark.parametrize("heads", [(64, 4), (16, 4)])
def test_mtp(rng, qo, heads):
    """MTP: G = 16 takes the token kernel up to 16 tokens per request; G = 4 packs tokens into general tiles."""
    prob = problem(rng, [qo, max(1, qo - 1), qo], [900, 300, 4100], "random", heads=heads, topk=16, page_size=128)
    check_fp8(prob, True, "bf16", True)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("pattern", ["random", None])
@pytest.mark.parametrize("decode", [True, False])
def test_head_dims(rng, head_dim, pattern, decode):
    prob = problem(rng, [1, 2] if decode else [40, 9, 130], [700, 300] if decode else [700, 300, 1100], pattern,
                   heads=(16, 1), head_dim=head_dim)
    check_fp8(prob, decode, "fp16", head_dim != 64)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("pattern", ["random", "shared", None])
def test_prefill_with_prefix(rng, interleaved, dtype, pattern):
    """M3's shapes with 128-token pages (the Hopper prefill kernels' case) and 64-token pages."""
    prob = problem(rng, [64, 9, 130, 1], [900, 300, 1100, 129], pattern, heads=(64, 4), topk=16, page_size=128,
                   dtype=dtype, empty_row_prob=0.05)
    check_fp8(prob, False, dtype, interleaved)
    prob = problem(rng, [40, 9], [700, 300], pattern, dtype=dtype)
    check_fp8(prob, False, dtype, interleaved)


def test_slot_major_pools(rng):
    """sglang's slot-major pools ([slots, Hkv, D] viewed as pages) in fp8: strided views, no copy."""
    prob = problem(rng, [1, 1, 1], [900, 300, 2000], "random", slot_major=True)
    k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE)
    # the fp8 arrays keep prob's slot-major strides; rebuild them on the device with the same view
    P = prob.page_size
    slots_k = to_device_fp8(np.ascontiguousarray(k8.transpose(0, 2, 1, 3)))  # [pages, P, Hkv, D] contiguous
    slots_v = to_device_fp8(np.ascontiguousarray(v8.transpose(0, 2, 1, 3)))
    k = slots_k.permute(0, 2, 1, 3)
    v = slots_v.permute(0, 2, 1, 3)
    assert k.shape == tuple(k8.shape) and P == k.shape[2]
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    out, lse = call(plan_for(prob, True), prob, t, k, v, q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=V_SCALE)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


def every_e4m3_byte():
    """The 254 non-NaN e4m3 bytes and two zeros in place of 0x7F / 0xFF, as 256 bytes."""
    b = np.arange(256, dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] = 0
    return b


def exact_problem(rng, kv_len=1):
    """Non-causal dense prefill, B = 2 requests of 8 tokens each seeing key 0 of its own page (kv_len 1): the
    16 heads x 8 tokens of a request are one-hot on the 128 dims, so lse = k[dim] * scale and o = v."""
    return mt.make_problem(rng, qo_lens=[8, 8], kv_lens=[kv_len, kv_len], qo_offset=[0, 0], num_qo_heads=16,
                           num_kv_heads=1, head_dim=128, page_size=64, topk=0, pattern=None, causal=False)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_e4m3_value_converts_exactly(rng, dtype):
    prob = exact_problem(rng)
    b = every_e4m3_byte().reshape(2, 128)
    f8 = mt.numpy_dtype("fp8")
    k8 = np.zeros(prob.k_cache.shape, np.uint8)
    v8 = np.zeros(prob.v_cache.shape, np.uint8)
    pages = prob.page_table[:, 0]
    for r in range(2):
        k8[pages[r], 0, 0] = b[r]
        v8[pages[r], 0, 0] = b[r][::-1]
    q = np.zeros(prob.q.shape, np.float32)  # [16 tokens, 16 heads, 128]
    for t in range(16):
        for h in range(16):
            q[t, h, (t % 8) * 16 + h] = 1.0
    prob.q = q
    t = mt.to_torch(prob, DEV, TORCH_DTYPE[dtype])
    plan = plan_for(prob, False)
    out, lse = call(plan, prob, t, to_device_fp8(k8.view(f8)), to_device_fp8(v8.view(f8)), sm_scale=1.0)
    kval = k8.view(f8).astype(np.float64)
    vval = v8.view(f8).astype(np.float64)
    lse = lse.cpu().numpy().astype(np.float64)
    out = out.float().cpu().numpy().astype(np.float64)
    for tok in range(16):
        r = tok // 8
        for h in range(16):
            d = (tok % 8) * 16 + h
            want = kval[pages[r], 0, 0, d]
            assert abs(lse[tok, h] - want) <= 1e-6 * max(1.0, abs(want)), (tok, h, lse[tok, h], want)
        np.testing.assert_array_equal(out[tok], np.broadcast_to(vval[pages[r], 0, 0], (16, 128)))


def test_nan_bytes_stay_nan(rng):
    """e4m3's NaN (0x7F / 0xFF) converts to a 16-bit NaN: in V it makes its output column NaN; in K the call gives
    what a bf16 cache with a NaN at that key gives."""
    prob = exact_problem(rng)
    f8 = mt.numpy_dtype("fp8")
    k8 = np.full(prob.k_cache.shape, 0x38, np.uint8)  # 1.0
    v8 = np.full(prob.v_cache.shape, 0x38, np.uint8)
    p0, p1 = prob.page_table[:, 0]
    v8[p0, 0, 0, 5] = 0x7F
    k8[p1, 0, 0, 9] = 0xFF
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    plan = plan_for(prob, False)
    out, lse = call(plan, prob, t, to_device_fp8(k8.view(f8)), to_device_fp8(v8.view(f8)))
    o = out.float().cpu().numpy()
    assert np.isnan(o[:8, :, 5]).all() and not np.isnan(np.delete(o[:8], 5, axis=2)).any()
    k16 = torch.from_numpy(k8.view(f8).astype(np.float32)).to(DEV, torch.bfloat16)
    v16 = torch.from_numpy(v8.view(f8).astype(np.float32)).to(DEV, torch.bfloat16)
    assert torch.isnan(k16[p1, 0, 0, 9]) and torch.isnan(v16[p0, 0, 0, 5])
    out16, lse16 = call(plan, prob, t, k16, v16)
    assert torch.equal(out.isnan(), out16.isnan()) and torch.equal(lse.isnan(), lse16.isnan())
    assert torch.equal(out.nan_to_num().view(torch.int16), out16.nan_to_num().view(torch.int16))


def test_v_scale_with_bf16_kv(rng):
    """v_scale scales the output of any cache (bf16 here); lse is unchanged by it."""
    prob = problem(rng, [1, 2, 1], [900, 300, 1100])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    plan = plan_for(prob, True)
    out, lse = call(plan, prob, t, t["k_cache"], t["v_cache"], v_scale=0.5)
    o_ref, lse_ref = mt.scaled_reference(prob, v_scale=0.5)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)
    with pytest.raises(ValueError, match=r"argument 'k_scale': expected a finite number > 0, got -1"):
        call(plan, prob, t, t["k_cache"], t["v_cache"], k_scale=-1.0)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("pattern", ["random", None])
@pytest.mark.parametrize("decode", [True, False])
def test_q_and_k_scales_with_bf16_kv(rng, dtype, pattern, decode):
    prob = problem(rng, [1, 2, 1] if decode else [64, 9, 130], [900, 300, 1100], pattern, dtype=dtype,
                   empty_row_prob=0.1)
    t = mt.to_torch(prob, DEV, TORCH_DTYPE[dtype])
    out, lse = call(plan_for(prob, decode), prob, t, t["k_cache"], t["v_cache"], q_scale=0.6, k_scale=2.3)
    o_ref, lse_ref = mt.scaled_reference(prob, q_scale=0.6, k_scale=2.3)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


def test_q_and_k_scales_equal_sm_scale_folded_by_the_caller(rng):
    """On CUDA q_scale * k_scale are folded into sm_scale (in double, rounded once): bit for bit what a caller
    passing that sm_scale gets, fp8 K/V too."""
    prob = problem(rng, [1, 2, 1], [900, 300, 1100])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8, _, _ = fp8_tensors(prob, True)
    plan = plan_for(prob, True)
    folded = float(np.float32(float(np.float32(0.1)) * float(np.float32(0.6)) * float(np.float32(2.3))))
    for k, v in ((t["k_cache"], t["v_cache"]), (k8, v8)):
        a, lse_a = call(plan, prob, t, k, v, sm_scale=0.1, q_scale=0.6, k_scale=2.3)
        b, lse_b = call(plan, prob, t, k, v, sm_scale=folded)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert torch.equal(lse_a, lse_b)


@pytest.mark.parametrize("interleaved", [False, True])
def test_graph_replays_with_changing_lengths(rng, interleaved):
    """Decode captured once on fp8 pools and replayed 50 times while lengths, pages and selections change in place:
    every replay bitwise equal to an eager call and within tolerance of the reference."""
    B, HQ, HKV, D, TOPK, P, MAX_KV = 4, 64, 4, 128, 16, 128, 4096
    pages_per_req = math.ceil(MAX_KV / P)
    num_pages = B * pages_per_req + 4
    plan = msa.plan_decode(B, 1, MAX_KV, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=P, topk=TOPK,
                           device=DEV)
    q = torch.zeros(B, HQ, D, device=DEV, dtype=torch.bfloat16)
    if interleaved:
        pool = torch.zeros(num_pages, HKV, P, 2 * D, device=DEV, dtype=torch.float8_e4m3fn)
        k, v = pool[..., :D], pool[..., D:]
    else:
        k = torch.zeros(num_pages, HKV, P, D, device=DEV, dtype=torch.float8_e4m3fn)
        v = torch.zeros_like(k)
    page_table = torch.full((B, pages_per_req + 4), -1, device=DEV, dtype=torch.int32)
    qo_indptr = torch.arange(B + 1, device=DEV, dtype=torch.int32)
    kv_lens = torch.ones(B, device=DEV, dtype=torch.int32)
    block_idx = torch.full((B, HKV, TOPK), -1, device=DEV, dtype=torch.int32)
    out = torch.full((B, HQ, D), float("nan"), device=DEV, dtype=torch.bfloat16)

    def step():
        msa.attention(plan, q, k, v, page_table, qo_indptr, kv_lens, block_idx=block_idx, out=out, k_scale=K_SCALE,
                      v_scale=V_SCALE)
        return out

    graph, _ = mt.capture_graph(step)
    for it in range(50):
        prob = mt.make_problem(rng, qo_lens=[1] * B, kv_lens=rng.integers(1, MAX_KV + 1, B).tolist(), num_qo_heads=HQ,
                               num_kv_heads=HKV, head_dim=D, page_size=P, topk=TOPK, pattern="random")
        k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE)
        n = k8.shape[0]
        assert n <= num_pages
        k[:n].copy_(to_device_fp8(k8))
        v[:n].copy_(to_device_fp8(v8))
        t = mt.to_torch(prob, DEV, torch.bfloat16)
        q.copy_(t["q"])
        page_table.fill_(-1)
        page_table[:, :t["page_table"].shape[1]].copy_(t["page_table"])
        kv_lens.copy_(t["kv_lens"])
        block_idx.copy_(t["block_idx"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        replayed = out.clone()
        out.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        assert torch.equal(replayed.view(torch.int16), out.view(torch.int16)), f"replay {it}"
        mt.assert_close(replayed.float().cpu().numpy(), mt.scaled_reference(prob, kd, vd)[0], what=f"replay {it}")


def test_torch_ops_take_fp8(rng):
    torch_ops = pytest.importorskip("msa.torch_ops")
    prob = problem(rng, [1, 2, 1], [900, 300, 1100])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8, kd, vd = fp8_tensors(prob, False)
    handle = torch_ops.PlanHandle(plan_for(prob, True))
    o = torch_ops.attention(handle, t["q"], k8, v8, t["page_table"], t["qo_indptr"], t["kv_lens"],
                            block_idx=t["block_idx"], q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=V_SCALE)
    torch.cuda.synchronize()
    mt.assert_close(o.float().cpu().numpy(), mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE)[0])


def test_layer_with_fp8_kv(rng):
    """msa.sparse_attention_layer on fp8 K/V: the attention of its own selection, against the CPU layer on the same
    (dequantized-exact) inputs."""
    prob = problem(rng, [1, 1], [700, 300], heads=(16, 2))
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8, _, _ = fp8_tensors(prob, True)
    q_index = torch.randn(t["q"].shape[0], 2, 128, device=DEV, dtype=torch.bfloat16)
    k_index = torch.randn(t["k_cache"].shape[0], 1, 64, 128, device=DEV, dtype=torch.bfloat16)
    plan = plan_for(prob, True)
    o = msa.sparse_attention_layer(plan, t["q"], k8, v8, q_index, k_index, t["page_table"], t["qo_indptr"],
                                   t["kv_lens"], k_scale=K_SCALE, v_scale=V_SCALE)
    torch.cuda.synchronize()
    cpu = lambda x: x.cpu()  # noqa: E731
    o_cpu = msa.sparse_attention_layer(plan_for(prob, True, "cpu"), cpu(t["q"]), cpu(k8), cpu(v8), cpu(q_index),
                                       cpu(k_index), cpu(t["page_table"]), cpu(t["qo_indptr"]), cpu(t["kv_lens"]),
                                       k_scale=K_SCALE, v_scale=V_SCALE)
    mt.assert_close(o.float().cpu().numpy(), o_cpu.float().numpy())


def test_cli_demo_runs_fp8_on_cuda():
    """`msa demo --backend cuda --kv-dtype fp8`: runs and checks against float64."""
    path = os.environ.get("MSA_CLI") or str(Path(msa.__file__).resolve().parents[2] / "msa")
    if not os.path.isfile(path):
        pytest.skip(f"no msa CLI at {path} (set MSA_CLI)")
    run = subprocess.run([path, "demo", "--backend", "cuda", "--kv-dtype", "fp8", "--check-rows", "16"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ERROR" not in run.stdout


# ---- the Hopper prefill kernels on fp8 K/V (query-major and KV-major; the portable kernel elsewhere) ----------

def plan_sm90(prob, monkeypatch, mode, window_tiles=None):
    """mode: MSA_SM90_PREFILL's, or qmajor-tiles: every tile query-major, each fp8 tile widened in the kernel
    (MSA_SM90_FP8_QMAJOR=tiles) instead of the plan's 16-bit copy of the blocks."""
    monkeypatch.setenv("MSA_SM90_PREFILL", mode.removesuffix("-tiles"))
    monkeypatch.setenv("MSA_SM90_FP8_QMAJOR", "tiles" if mode.endswith("-tiles") else "auto")
    if window_tiles:
        monkeypatch.setenv("MSA_SM90_KV_WINDOW_TILES", str(window_tiles))
    else:
        monkeypatch.delenv("MSA_SM90_KV_WINDOW_TILES", raising=False)
    return plan_for(prob, False)


def check_prefill_fp8(plan, prob, dtype, interleaved, v_scale=V_SCALE):
    t = mt.to_torch(prob, DEV, TORCH_DTYPE[dtype])
    k8, v8, kd, vd = fp8_tensors(prob, interleaved, v_scale=v_scale)
    out, lse = call(plan, prob, t, k8, v8, q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=v_scale)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


@pytest.mark.parametrize("mode", ["auto", "qmajor", "qmajor-tiles", "kvmajor"])
@pytest.mark.parametrize("pattern", ["random", "clustered", "shared", None])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_sm90_prefill_modes(rng, monkeypatch, mode, pattern, dtype, interleaved):
    prob = problem(rng, [300, 129, 1, 64], [700, 129, 257, 2000], pattern, heads=(64, 4), topk=16, page_size=128,
                   dtype=dtype, empty_row_prob=0.05)
    check_prefill_fp8(plan_sm90(prob, monkeypatch, mode), prob, dtype, interleaved)


@pytest.mark.parametrize("kv_len", [5000, 40000])
@pytest.mark.parametrize("mode", ["qmajor", "qmajor-tiles"])
def test_sm90_prefill_wide_tile_lists(rng, monkeypatch, mode, kv_len):
    """G = 4 and top-32: 1024 selections a tile, whose union the CTA form of the tile-list pass builds (and, with
    the fp8 copy of 40000 tokens, flags); G < 8 has no KV-major path, so every tile is query-major."""
    prob = problem(rng, [300, 70], [kv_len, 900], "random", heads=(16, 4), topk=32, page_size=128)
    check_prefill_fp8(plan_sm90(prob, monkeypatch, mode), prob, "bf16", True)


@pytest.mark.parametrize("kv_len", [700, 10000, 20000, 40000])
def test_sm90_prefill_fp8_copy_unit_sizes(rng, monkeypatch, kv_len):
    """The widen kernel's units: on 132 SMs (1056 CTAs) 4 KV heads x 10 / 83 / 161 blocks take quarters, halves
    and whole (block, KV head) pairs, every block widened beside the tile lists; past 1024 pairs (317 blocks) the
    flagged pairs after them, whole, each flag cleared by the CTA that takes it; a second run reads the flags the
    first left."""
    prob = problem(rng, [150, 40], [kv_len, 500], "shared", heads=(64, 4), topk=16, page_size=128)
    plan = plan_sm90(prob, monkeypatch, "qmajor")
    pairs = 4 * sum((n + 127) // 128 for n in (kv_len, 500))
    if mt.kernel_capability() == (9, 0):
        assert plan.describe()["fp8_copy"] == ("every-block" if pairs <= 1024 else "flagged")
    for _ in range(2):
        check_prefill_fp8(plan, prob, "bf16", True)


@pytest.mark.parametrize("kv_len", [2000, 40000])
@pytest.mark.parametrize("mode", ["qmajor", "auto"])
def test_sm90_prefill_fp8_copy_graph_replays(rng, monkeypatch, mode, kv_len):
    """The fp8 copy under a CUDA graph in both widen modes (2000: every block, beside the tile lists, the KV-major
    tiles of `auto` reading the copy too; 40000: the flagged blocks, flags zeroed by the first eager run only, the
    KV-major tiles on the fp8 pool): captured once, replayed while q, K/V, pages and selections change in place
    (clustered, shared, random in turn), outputs poisoned before each replay, every replay against the reference."""
    kw = dict(heads=(64, 4), topk=16, page_size=128)
    prob = problem(rng, [200, 90], [kv_len, 900], "clustered", **kw)
    plan = plan_sm90(prob, monkeypatch, mode)
    if mt.kernel_capability() == (9, 0):
        assert plan.describe()["fp8_copy"] == ("every-block" if kv_len == 2000 else "flagged")
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8, _, _ = fp8_tensors(prob, True)
    out = torch.empty((t["q"].shape[0], prob.num_qo_heads, prob.head_dim_v), device=DEV, dtype=torch.bfloat16)
    lse = torch.empty((t["q"].shape[0], prob.num_qo_heads), device=DEV, dtype=torch.float32)

    def step():
        msa.attention(plan, t["q"], k8, v8, t["page_table"], t["qo_indptr"], t["kv_lens"], block_idx=t["block_idx"],
                      qo_offset=t["qo_offset"], out=out, lse=lse, q_scale=Q_SCALE, k_scale=K_SCALE, v_scale=V_SCALE)

    graph, _ = mt.capture_graph(step)
    for it in range(6):
        new = problem(rng, [200, 90], [kv_len, 900], ("clustered", "shared", "random")[it % 3], **kw)
        nt = mt.to_torch(new, DEV, torch.bfloat16)
        nk, nv, kd, vd = fp8_tensors(new, True)
        for name in ("q", "page_table", "block_idx"):
            t[name].copy_(nt[name])
        k8.copy_(nk)
        v8.copy_(nv)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        o_ref, lse_ref = mt.scaled_reference(new, kd, vd, q_scale=Q_SCALE)
        mt.assert_close(out.float().cpu().numpy(), o_ref, what=f"replay {it}")
        mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


def test_sm90_prefill_kvmajor_windows(rng, monkeypatch):
    prob = problem(rng, [400, 300, 9], [1200, 900, 300], "random", heads=(32, 2), topk=16, page_size=128)
    check_prefill_fp8(plan_sm90(prob, monkeypatch, "kvmajor", window_tiles=8), prob, "bf16", True)


@pytest.mark.parametrize("mode", ["qmajor", "qmajor-tiles", "kvmajor"])
def test_sm90_prefill_tiles_without_blocks_between_others(rng, monkeypatch, mode):
    """Requests with kv_len 0 (non-causal: nothing to see) and rows whose selections are all -1 between requests
    that have blocks: the producer's hand-over order across tiles with no block."""
    prob = problem(rng, [70, 5, 130, 40, 9], [700, 0, 900, 300, 0], "random", heads=(64, 4), topk=16, page_size=128,
                   qo_offset=[0, 0, 0, 0, 0], causal=False, empty_row_prob=0.3)
    check_prefill_fp8(plan_sm90(prob, monkeypatch, mode), prob, "bf16", False)


@pytest.mark.parametrize("mode", ["qmajor", "qmajor-tiles", "kvmajor"])
@pytest.mark.parametrize("fp8", [False, True])
def test_sm90_prefill_v_scale_leaves_lse(rng, monkeypatch, mode, fp8):
    """v_scale scales o and not lse, bf16 and fp8 caches, both decompositions."""
    prob = problem(rng, [300, 129], [700, 1000], "random", heads=(64, 4), topk=16, page_size=128)
    plan = plan_sm90(prob, monkeypatch, mode)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    if fp8:
        k, v, _, _ = fp8_tensors(prob, True)
    else:
        k, v = t["k_cache"], t["v_cache"]
    o1, lse1 = call(plan, prob, t, k, v, k_scale=K_SCALE if fp8 else 1.0, v_scale=V_SCALE if fp8 else 1.0)
    o2, lse2 = call(plan, prob, t, k, v, k_scale=K_SCALE if fp8 else 1.0, v_scale=(V_SCALE if fp8 else 1.0) * 3.0)
    assert torch.equal(lse1, lse2)
    mt.assert_close(o2.float().cpu().numpy() / 3.0, o1.float().cpu().numpy())


def test_sm90_prefill_fp8_copy_in_describe(rng, monkeypatch):
    """A sparse plan with query-major tiles holds the 16-bit copy of the fp8 blocks they read; tiles (or a forced
    KV-major plan, which has no query-major tile) widens in the kernel instead."""
    if mt.kernel_capability() != (9, 0):
        pytest.skip("the sm_90 prefill kernels")
    prob = problem(rng, [300], [700], "shared", heads=(64, 4), topk=16, page_size=128)
    assert plan_sm90(prob, monkeypatch, "auto").describe()["fp8_qmajor"] == "copy"
    assert plan_sm90(prob, monkeypatch, "qmajor").describe()["fp8_qmajor"] == "copy"
    assert plan_sm90(prob, monkeypatch, "qmajor-tiles").describe()["fp8_qmajor"] == "tiles"
    assert plan_sm90(prob, monkeypatch, "kvmajor").describe()["fp8_qmajor"] == "tiles"


@pytest.mark.parametrize("flat", [False, True])
def test_sm90_prefill_fp8_copy_keeps_bad_pages_invisible(rng, monkeypatch, flat):
    """Page ids outside the pool are invisible keys on both query-major fp8 paths: the copy marks them invalid in
    its own table instead of widening them, so the two paths agree, with no NaN."""
    if mt.kernel_capability() != (9, 0):
        pytest.skip("the sm_90 prefill kernels")
    prob = problem(rng, [200, 129], [900, 1000], "shared", heads=(64, 4), topk=16, page_size=128, flat_pages=flat)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8, _, _ = fp8_tensors(prob, True)
    table = t["page_table"]
    if flat:
        table[1] = 10**9
        table[int(t["page_indptr"][1]) + 2] = -3
    else:
        table[0, 1] = 10**9
        table[1, 2] = -3
    outs = []
    for mode in ("qmajor", "qmajor-tiles"):
        out, lse = call(plan_sm90(prob, monkeypatch, mode), prob, t, k8, v8, q_scale=Q_SCALE, k_scale=K_SCALE,
                        v_scale=V_SCALE)
        assert not torch.isnan(out).any() and not torch.isnan(lse).any()
        outs.append((out.float().cpu().numpy(), lse.cpu().numpy()))
    mt.assert_close(outs[0][0], outs[1][0])
    mt.assert_lse_close(outs[0][1], outs[1][1])


# ---- bf16 q on the query-major kernel's fp16 products: each Q row scaled by 2^e into fp16 -------------------------
# (docs/prefill.md, "fp8 K/V": amax x 2^e in [2^14, 2^15), the row's logits times 2^-e; a row of zeros keeps e = 0).
# That is the in-kernel widening (qmajor-tiles); the copy of the blocks runs q's own products, as a 16-bit cache does.
# The KV-major kernel runs bf16 products on fp8 K/V; it takes the cases that stay inside fp32 on that path.

def q_rows_problem(rng, pattern, dtype, case):
    """M3's group (G = 16: a consumer warp's 16 rows are one token's heads) with q rows built for the case:
      range: row magnitudes log-uniform over 1e-3 .. 1e4 (2^e from about 2^-1 to 2^23), a quarter of the rows spread
             inside the row too, elements log-uniform over 1e-6 .. 1e4 (the smallest become fp16 subnormals when
             scaled); sm_scale 3e-4 keeps the largest logits near 50.
      zeros: a third of the rows and every 7th token (all its heads: whole warps) all zeros, the rest N(0, 1).
      near_max: half the rows with elements of 1e37 .. 3.3e38 (bf16's largest finite is 3.39e38), random signs;
             sm_scale 2e-38 (k_scale 1: the folded scale stays a normal float) keeps their logits near 40."""
    sm_scale = {"range": 3e-4, "zeros": None, "near_max": 2e-38}[case]
    prob = problem(rng, [300, 129, 1, 64], [700, 129, 257, 2000], pattern, heads=(64, 4), topk=16, page_size=128,
                   dtype=dtype, sm_scale=sm_scale)
    T, H, D = prob.q.shape
    q = rng.standard_normal((T, H, D))
    if case == "range":
        q *= 10.0 ** rng.uniform(-3, 4, (T, H, 1))
        spread = rng.random((T, H)) < 0.25
        n = int(spread.sum())
        q[spread] = rng.choice([-1.0, 1.0], (n, D)) * 10.0 ** rng.uniform(-6, 4, (n, D))
    elif case == "zeros":
        q[rng.random((T, H)) < 0.3] = 0.0
        q[::7] = 0.0
    else:
        near = rng.random((T, H)) < 0.5
        n = int(near.sum())
        q[near] = rng.choice([-1.0, 1.0], (n, D)) * rng.uniform(1e37, 3.3e38, (n, D))
    prob.q = mt.round_to(q, dtype)
    assert np.isfinite(prob.q).all()
    return prob


Q_ROW_PATHS = [("qmajor-tiles", "shared"), ("qmajor-tiles", "clustered"), ("qmajor-tiles", None), ("qmajor", "shared"),
               ("kvmajor", "random")]


@pytest.mark.parametrize("case", ["range", "zeros"])
@pytest.mark.parametrize("mode,pattern", Q_ROW_PATHS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_sm90_prefill_q_row_scales(rng, monkeypatch, case, mode, pattern, dtype):
    check_q_row_scales(rng, monkeypatch, case, mode, pattern, dtype)


@pytest.mark.parametrize("mode,pattern", [p for p in Q_ROW_PATHS if p[0] == "qmajor-tiles"])
def test_sm90_prefill_q_near_bf16_max(rng, monkeypatch, mode, pattern):
    """bf16 q near bf16's max, on the sm_90 query-major kernel's scaled fp16 products only: bf16 products of
    such rows overflow fp32 (the KV-major kernel's, the portable kernel's, a bf16 cache's)."""
    if mt.kernel_capability() != (9, 0):
        pytest.skip("the sm_90 query-major kernel")
    check_q_row_scales(rng, monkeypatch, "near_max", mode, pattern, "bf16")


def check_q_row_scales(rng, monkeypatch, case, mode, pattern, dtype):
    prob = q_rows_problem(rng, pattern, dtype, case)
    q_scale, k_scale = (1.0, 1.0) if case == "near_max" else (Q_SCALE, K_SCALE)
    t = mt.to_torch(prob, DEV, TORCH_DTYPE[dtype])
    k8, v8, kd, vd = fp8_tensors(prob, True, k_scale=k_scale)
    out, lse = call(plan_sm90(prob, monkeypatch, mode), prob, t, k8, v8, sm_scale=prob.sm_scale, q_scale=q_scale,
                    k_scale=k_scale, v_scale=V_SCALE)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd, q_scale=q_scale)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


def test_sm90_prefill_zero_q_rows_average_v(rng, monkeypatch):
    """Rows of zeros (e = 0): every visible key weighs the same, so o is the mean of the visible V rows times
    v_scale and lse is ln(visible keys), on the query-major kernel's scaled path, dense causal."""
    prob = problem(rng, [200, 64], [700, 300], None, heads=(64, 4), page_size=128)
    prob.q[:] = 0.0
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8, kd, vd = fp8_tensors(prob, False)
    out, lse = call(plan_sm90(prob, monkeypatch, "qmajor-tiles"), prob, t, k8, v8, q_scale=Q_SCALE,
                    k_scale=K_SCALE, v_scale=V_SCALE)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd, q_scale=Q_SCALE)
    visible = prob.positions() + 1  # causal: keys 0 .. position
    np.testing.assert_allclose(lse_ref, np.broadcast_to(np.log(visible)[:, None], lse_ref.shape), rtol=1e-12)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)
