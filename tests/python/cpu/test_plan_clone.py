"""plan.clone() on the CPU: a distinct msa.Plan of the same configuration and lengths, describe() and repr
alike, the same results bitwise. (On CUDA it also has workspaces of its own: test_gpu_attention.py runs a plan
and its clone on two streams at once.)"""
import numpy as np
import pytest

import msa
import msa_testing as mt


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_clone_is_an_equal_plan_of_its_own(rng, phase):
    qo_lens = [5, 9] if phase == "prefill" else [1, 1]
    prob = mt.make_problem(rng, qo_lens=qo_lens, kv_lens=[300, 140], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                           page_size=64, topk=3, dtype="fp32")
    kw = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=64, topk=3)
    plan = (msa.plan_prefill(prob.qo_lens, prob.kv_lens, **kw) if phase == "prefill"
            else msa.plan_decode(2, 1, 512, **kw))
    clone = plan.clone()
    assert isinstance(clone, msa.Plan) and clone is not plan
    assert repr(clone) == repr(plan) and clone.describe() == plan.describe()
    assert clone.clone().describe() == plan.describe()
    a = mt.to_numpy(prob)
    args = (a["q"], a["k_cache"], a["v_cache"], a["page_table"], a["qo_indptr"], a["kv_lens"])
    o, lse = msa.attention(plan, *args, block_idx=a["block_idx"], return_lse=True)
    o2, lse2 = msa.attention(clone, *args, block_idx=a["block_idx"], return_lse=True)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse, lse2)
    mt.assert_close(o, mt.ref_attention(prob)[0])


def test_clone_is_documented():
    assert "clone" in msa.plan_prefill.__doc__ and "clone" in msa.plan_decode.__doc__
    assert "two streams" in msa.attention.__doc__ and "two streams" in msa.Plan.__doc__
    assert "workspaces of its own" in msa.Plan.clone.__doc__
