"""torch CPU tensors through the same entry points: torch outputs allocated for torch inputs, strided
views passed without copies, bf16 without ml_dtypes. Skipped when torch is not installed."""
import numpy as np
import pytest

import msa
import msa_testing as mt

torch = pytest.importorskip("torch")


def plan_for(prob):
    return msa.plan_prefill(torch.from_numpy(prob.qo_lens.astype(np.int32)), prob.kv_lens,
                            num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=prob.head_dim,
                            page_size=prob.page_size, topk=prob.topk, causal=prob.causal, qo_offset=prob.qo_offset,
                            device=torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", [dict(), dict(slot_major=True, index_layout="HTK", flat_pages=True)],
                         ids=["plain", "strided"])
def test_attention(rng, dtype, layout):
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    prob = mt.make_problem(rng, qo_lens=[6, 40], kv_lens=[300, 180], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                           page_size=32, topk=3, dtype=name, **layout)
    t = mt.to_torch(prob, device="cpu", dtype=dtype)
    o, lse = msa.attention(plan_for(prob), t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"],
                           t["kv_lens"], block_idx=t["block_idx"], page_indptr=t["page_indptr"], return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == dtype and lse.dtype == torch.float32
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o.float().numpy(), o_ref)
    mt.assert_lse_close(lse.numpy(), lse_ref)


def test_indexer_and_page_table(rng):
    prob = mt.make_problem(rng, qo_lens=[6, 20], kv_lens=[300, 180], num_qo_heads=4, num_kv_heads=1, head_dim=64,
                           pattern=None, dtype="bf16")
    t = mt.to_torch(prob, device="cpu")
    scores = msa.block_scores(t["q"], t["k_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"])
    assert isinstance(scores, torch.Tensor) and scores.shape == (4, 3, 26)
    bi = msa.select_topk(scores, t["qo_indptr"], t["kv_lens"], 2)
    assert isinstance(bi, torch.Tensor) and bi.dtype == torch.int32
    ref = mt.ref_select_topk(np.transpose(scores.numpy(), (2, 0, 1)), prob.qo_indptr, prob.kv_lens, 2)
    np.testing.assert_array_equal(bi.numpy(), ref)
    r2t = torch.arange(2 * 256, dtype=torch.int32).reshape(2, 256)
    pt = msa.build_page_table(r2t, torch.tensor([1, 0]), torch.tensor([130, 5]), 64)
    assert pt.tolist() == [[4, 5, 6, -1], [0, -1, -1, -1]]


def test_merge_states(rng):
    v = torch.randn(2, 3, 4, 16)
    lse = torch.randn(2, 3, 4)
    o, lse_o = msa.merge_states(v, lse, return_lse=True)
    w = torch.softmax(lse, dim=0)
    torch.testing.assert_close(o, (w[..., None] * v).sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse_o, torch.logsumexp(lse, dim=0), rtol=1e-5, atol=1e-5)


def test_cpu_stream_and_device_arguments():
    plan = msa.plan_decode(1, 1, 10, num_qo_heads=2, num_kv_heads=1, device=torch.device("cpu"))
    assert plan.device == "cpu"
    with pytest.raises(TypeError, match="'qo_lens'"):
        msa.plan_prefill(torch.tensor([1.0]), [3], num_qo_heads=2, num_kv_heads=1)
