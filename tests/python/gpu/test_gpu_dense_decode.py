"""Dense decode at long context: few items (one request, one or four KV heads) split over the whole GPU, in
clusters of 16 that merge in distributed shared memory and then through the workspace (plan.describe() says
merge=cluster+workspace); against the float64 reference, bf16 and fp8 K/V, lse included, outputs poisoned,
and under a CUDA graph replayed with the lengths changing (the arrival counters reset themselves).

    PYTHONPATH=build/python:tests/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_dense_decode.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"


def plan_for(batch, max_kv, hq, hkv, **kw):
    return msa.plan_decode(batch, 1, max_kv, num_qo_heads=hq, num_kv_heads=hkv, head_dim=128, page_size=128, topk=0,
                           device=DEV, **kw)


def run(plan, prob, fp8):
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k, v, scales, kd, vd = t["k_cache"], t["v_cache"], {}, None, None
    if fp8:
        k8, v8, kd, vd = mt.fp8_kv(prob, 0.137, 0.29)
        k = torch.from_numpy(k8.view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)
        v = torch.from_numpy(v8.view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)
        scales = dict(k_scale=0.137, v_scale=0.29)
    T = t["q"].shape[0]
    out = torch.full((T, prob.num_qo_heads, 128), float("nan"), device=DEV, dtype=torch.bfloat16)
    lse = torch.full((T, prob.num_qo_heads), float("nan"), device=DEV)
    msa.attention(plan, t["q"], k, v, t["page_table"], t["qo_indptr"], t["kv_lens"], out=out, lse=lse, **scales)
    torch.cuda.synchronize()
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd) if fp8 else mt.ref_attention(prob)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("heads", [(16, 1), (64, 4)])
@pytest.mark.parametrize("kv", [[65536], [40000, 3], [131072]])
def test_long_dense_decode(rng, fp8, heads, kv):
    prob = mt.make_problem(rng, qo_lens=[1] * len(kv), kv_lens=kv, num_qo_heads=heads[0], num_kv_heads=heads[1],
                           head_dim=128, page_size=128, topk=0, pattern=None)
    plan = plan_for(len(kv), max(kv), *heads)
    if len(kv) == 1 and heads[1] == 1 and mt.kernel_capability() >= (9, 0):  # one item
        assert plan.describe().get("merge") == "cluster+workspace", plan.describe()
    run(plan, prob, fp8)


def test_two_level_merge_under_a_graph(rng):
    """One plan captured once; 12 replays with the length changing (some steps shorter than one cluster's share)."""
    B, HQ, HKV, MAX_KV = 1, 16, 1, 65536
    plan = plan_for(B, MAX_KV, HQ, HKV)
    pages = MAX_KV // 128 + 4
    q = torch.zeros(B, HQ, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.zeros(pages, HKV, 128, 128, device=DEV, dtype=torch.bfloat16)
    v = torch.zeros_like(k)
    table = torch.full((B, MAX_KV // 128 + 4), -1, device=DEV, dtype=torch.int32)
    qo_indptr = torch.arange(B + 1, device=DEV, dtype=torch.int32)
    kv_lens = torch.ones(B, device=DEV, dtype=torch.int32)
    out = torch.full((B, HQ, 128), float("nan"), device=DEV, dtype=torch.bfloat16)

    def step():
        msa.attention(plan, q, k, v, table, qo_indptr, kv_lens, out=out)
        return out

    graph, _ = mt.capture_graph(step)
    for n in [65536, 1, 300, 4096, 65535, 129, 20000, 2, 65536, 777, 50000, 128]:
        prob = mt.make_problem(rng, qo_lens=[1], kv_lens=[n], num_qo_heads=HQ, num_kv_heads=HKV, head_dim=128,
                               page_size=128, topk=0, pattern=None)
        t = mt.to_torch(prob, DEV, torch.bfloat16)
        npg = t["k_cache"].shape[0]
        k[:npg].copy_(t["k_cache"])
        v[:npg].copy_(t["v_cache"])
        q.copy_(t["q"])
        table.fill_(-1)
        table[:, :t["page_table"].shape[1]].copy_(t["page_table"])
        kv_lens.copy_(t["kv_lens"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        mt.assert_close(out.float().cpu().numpy(), mt.ref_attention(prob)[0], what=f"kv_len {n}")
