"""The CUDA backend and the per-tensor scales of msa.attention: fp8 e4m3 K/V (separate pools and the halves of
one interleaved pool) are refused with NotImplementedError naming the argument before anything launches (the
output stays as poisoned), and so is v_scale != 1 (the kernels have no output scale); q_scale and k_scale with
bf16 / fp16 K/V are folded into sm_scale and match the float64 reference, decode and prefill, sparse and dense,
also through msa.torch_ops and its op schema. The same fp8 call on CPU tensors runs (tests/python/cpu).

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_attention_fp8.py
"""
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


def problem(rng, qo_lens, kv_lens, pattern="random", **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=16, num_kv_heads=2, head_dim=128,
                           page_size=64, topk=8, pattern=pattern, **kw)


def plan_for(prob, decode, device=DEV):
    kw = dict(num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=prob.head_dim,
              page_size=prob.page_size, topk=prob.topk, causal=prob.causal, device=device)
    if decode:
        return msa.plan_decode(prob.batch_size, int(prob.qo_lens.max()), int(prob.kv_lens.max()), **kw)
    return msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset, **kw)


def fp8_tensors(prob, interleaved):
    """prob's K/V as torch float8_e4m3fn CUDA tensors (per-tensor scales 0.137 / 0.29), as two pools or the
    halves of one interleaved pool."""
    k8, v8, _, _ = mt.fp8_kv(prob, 0.137, 0.29, interleaved=interleaved)

    def dev(a):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)

    if interleaved:
        pool = dev(k8.base)
        D = prob.head_dim
        return pool[..., :D], pool[..., D:]
    return dev(k8), dev(v8)


def call(plan, prob, t, k, v, **kw):
    T = t["q"].shape[0]
    out = torch.full((T, prob.num_qo_heads, prob.head_dim_v), float("nan"), device=DEV, dtype=t["q"].dtype)
    lse = torch.full((T, prob.num_qo_heads), float("nan"), device=DEV, dtype=torch.float32)
    msa.attention(plan, t["q"], k, v, t["page_table"], t["qo_indptr"], t["kv_lens"], block_idx=t["block_idx"],
                  qo_offset=t["qo_offset"], page_indptr=t["page_indptr"], out=out, lse=lse, **kw)
    return out, lse


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("decode", [True, False])
def test_fp8_kv_is_refused_before_any_launch(rng, interleaved, decode):
    prob = problem(rng, [1, 1] if decode else [40, 9], [700, 300])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8 = fp8_tensors(prob, interleaved)
    with pytest.raises(NotImplementedError, match=r"^msa.attention: argument 'k': fp8 e4m3 K/V runs on the CPU "
                                                  r"backend only in this build; the CUDA kernels take K/V in the "
                                                  r"dtype of q \(bfloat16 or float16\)$"):
        out, lse = call(plan_for(prob, decode), prob, t, k8, v8, k_scale=0.137, v_scale=0.29)
    torch.cuda.synchronize()


def test_fp8_kv_refusal_leaves_the_outputs_alone(rng):
    prob = problem(rng, [1, 1], [700, 300])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8 = fp8_tensors(prob, True)
    out = torch.full((2, 16, 128), float("nan"), device=DEV, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="argument 'k'"):
        msa.attention(plan_for(prob, True), t["q"], k8, v8, t["page_table"], t["qo_indptr"], t["kv_lens"],
                      block_idx=t["block_idx"], out=out, k_scale=0.137)
    torch.cuda.synchronize()
    assert out.isnan().all()


def test_fp8_kv_runs_on_the_cpu_copies(rng):
    """The same call on CPU tensors (torch float8_e4m3fn) is computed, against the dequantized reference."""
    prob = problem(rng, [40, 9], [700, 300])
    k8, v8, kd, vd = mt.fp8_kv(prob, 0.137, 0.29)
    t = mt.to_torch(prob, "cpu", torch.bfloat16)
    kt = torch.from_numpy(k8.view(np.uint8)).view(torch.float8_e4m3fn)
    vt = torch.from_numpy(v8.view(np.uint8)).view(torch.float8_e4m3fn)
    o, lse = msa.attention(plan_for(prob, False, "cpu"), t["q"], kt, vt, t["page_table"], t["qo_indptr"],
                           t["kv_lens"], block_idx=t["block_idx"], return_lse=True, q_scale=1.5, k_scale=0.137,
                           v_scale=0.29)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd, q_scale=1.5)
    mt.assert_close(o.float().numpy(), o_ref)
    mt.assert_lse_close(lse.numpy(), lse_ref)


def test_v_scale_is_refused(rng):
    prob = problem(rng, [1, 1], [700, 300])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    with pytest.raises(NotImplementedError, match=r"^msa.attention: argument 'v_scale': the CUDA kernels have no "
                                                  r"output scale, so v_scale must be 1 for CUDA tensors in this "
                                                  r"build, got 0.5"):
        call(plan_for(prob, True), prob, t, t["k_cache"], t["v_cache"], v_scale=0.5)
    # Bad scales are ValueErrors on CUDA tensors too.
    with pytest.raises(ValueError, match=r"argument 'k_scale': expected a finite number > 0, got -1"):
        call(plan_for(prob, True), prob, t, t["k_cache"], t["v_cache"], k_scale=-1.0)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("pattern", ["random", None])
@pytest.mark.parametrize("decode", [True, False])
def test_q_and_k_scales_with_bf16_kv(rng, dtype, pattern, decode):
    prob = problem(rng, [1, 2, 1] if decode else [64, 9, 130], [900, 300, 1100], pattern, dtype=dtype,
                   empty_row_prob=0.1)
    t = mt.to_torch(prob, DEV, TORCH_DTYPE[dtype])
    out, lse = call(plan_for(prob, decode), prob, t, t["k_cache"], t["v_cache"], q_scale=0.6, k_scale=2.3,
                    v_scale=1.0)
    torch.cuda.synchronize()
    o_ref, lse_ref = mt.scaled_reference(prob, q_scale=0.6, k_scale=2.3)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


def test_q_and_k_scales_equal_sm_scale_folded_by_the_caller(rng):
    """On CUDA q_scale * k_scale are folded into sm_scale (in double, rounded once): bit for bit what a caller
    passing that sm_scale gets."""
    prob = problem(rng, [1, 2, 1], [900, 300, 1100])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    plan = plan_for(prob, True)
    a, lse_a = call(plan, prob, t, t["k_cache"], t["v_cache"], sm_scale=0.1, q_scale=0.6, k_scale=2.3)
    # The float arguments, widened to double, multiplied left to right, rounded to float.
    folded = float(np.float32(float(np.float32(0.1)) * float(np.float32(0.6)) * float(np.float32(2.3))))
    b, lse_b = call(plan, prob, t, t["k_cache"], t["v_cache"], sm_scale=folded)
    torch.cuda.synchronize()
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert torch.equal(lse_a, lse_b)


def test_torch_ops_forward_the_scales(rng):
    torch_ops = pytest.importorskip("msa.torch_ops")
    prob = problem(rng, [1, 2, 1], [900, 300, 1100])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    handle = torch_ops.PlanHandle(plan_for(prob, True))
    o = torch_ops.attention(handle, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"],
                            t["kv_lens"], block_idx=t["block_idx"], q_scale=0.6, k_scale=2.3)
    torch.cuda.synchronize()
    mt.assert_close(o.float().cpu().numpy(), mt.scaled_reference(prob, q_scale=0.6, k_scale=2.3)[0])
    out = torch.empty_like(o)
    lse = torch.empty(o.shape[:2], device=DEV)
    args = (handle.handle, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
            t["block_idx"], None, None, out, lse, None, False, 0.6, 2.3, 1.0)
    torch.ops.msa.attention(*args)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), o.view(torch.int16))
    torch.library.opcheck(torch.ops.msa.attention.default, args)
    with pytest.raises(NotImplementedError, match="argument 'k'"):
        k8, v8 = fp8_tensors(prob, False)
        torch_ops.attention(handle, t["q"], k8, v8, t["page_table"], t["qo_indptr"], t["kv_lens"],
                            block_idx=t["block_idx"], k_scale=0.137)


def test_layer_refuses_fp8_kv(rng):
    """msa.sparse_attention_layer: the attention step raises the same NotImplementedError (its indexer steps run
    first)."""
    prob = problem(rng, [1, 1], [700, 300])
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k8, v8 = fp8_tensors(prob, True)
    q_index = torch.randn(t["q"].shape[0], 2, 128, device=DEV, dtype=torch.bfloat16)
    k_index = torch.randn(t["k_cache"].shape[0], 1, 64, 128, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="argument 'k': fp8 e4m3 K/V runs on the CPU backend only"):
        msa.sparse_attention_layer(plan_for(prob, True), t["q"], k8, v8, q_index, k_index, t["page_table"],
                                   t["qo_indptr"], t["kv_lens"], k_scale=0.137, v_scale=0.29)
    torch.cuda.synchronize()


def test_cli_demo_reports_the_refusal():
    """`msa demo --backend cuda --kv-dtype fp8`: exit status 1 with the library's message, found out by a one-key
    call before the demo builds its data."""
    path = os.environ.get("MSA_CLI") or str(Path(msa.__file__).resolve().parents[2] / "msa")
    if not os.path.isfile(path):
        pytest.skip(f"no msa CLI at {path} (set MSA_CLI)")
    run = subprocess.run([path, "demo", "--backend", "cuda", "--kv-dtype", "fp8", "--check-rows", "16"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "msa demo: prefill on cuda: msa.attention: argument 'k': fp8 e4m3 K/V runs on the CPU backend only" \
        in run.stderr, run.stderr
    assert "building synthetic data" not in run.stderr
    assert "ERROR" in run.stdout
