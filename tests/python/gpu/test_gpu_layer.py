"""msa.sparse_attention_layer on the GPU: equal to the three steps done separately, close to the CPU
backend, and captured once in a CUDA graph for decode while lengths and selections change between replays."""
import numpy as np
import pytest

import msa
import msa_testing as mt

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
BLOCK = 128


def _m3_problem(rng, qo_lens, kv_lens, hkv=4, group=16, spare=4):
    prob = mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=hkv * group, num_kv_heads=hkv,
                           head_dim=128, page_size=128, topk=16, pattern=None, dtype="bf16", spare_pages=spare)
    q_index = mt.round_to(rng.standard_normal((prob.q.shape[0], hkv, 128)), "bf16")
    k_index = mt.round_to(rng.standard_normal((prob.k_cache.shape[0], 1, 128, 128)), "bf16")
    return prob, q_index, k_index


def _cuda(prob, q_index, k_index):
    t = mt.to_torch(prob, device="cuda", dtype=torch.bfloat16)
    t["q_index"] = torch.from_numpy(q_index).to("cuda", torch.bfloat16)
    t["k_index"] = torch.from_numpy(k_index).to("cuda", torch.bfloat16)
    return t


@pytest.mark.parametrize("decode", [False, True])
def test_layer_equals_steps_and_cpu(rng, decode):
    qo_lens, kv_lens = ([1, 1, 1, 1], [5000, 130, 20000, 777]) if decode else ([300, 1000], [2000, 1000])
    prob, q_index, k_index = _m3_problem(rng, qo_lens, kv_lens)
    t = _cuda(prob, q_index, k_index)
    kw = dict(num_qo_heads=64, num_kv_heads=4, topk=16)
    plan = (msa.plan_decode(len(kv_lens), 1, 32768, device="cuda", **kw) if decode
            else msa.plan_prefill(qo_lens, kv_lens, device="cuda", **kw))
    args = (t["q"], t["k_cache"], t["v_cache"], t["q_index"], t["k_index"], t["page_table"], t["qo_indptr"],
            t["kv_lens"])
    o, bi = msa.sparse_attention_layer(plan, *args, force_end=1, return_block_idx=True)
    nb = (32768 if decode else max(kv_lens) + BLOCK - 1) // BLOCK
    scores = msa.block_scores(t["q_index"], t["k_index"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                              max_blocks=nb, layout="THK")
    bi2 = msa.select_topk(scores, t["qo_indptr"], t["kv_lens"], 16, layout="THK", force_end=1)
    o2 = msa.attention(plan, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                       block_idx=bi2)
    torch.cuda.synchronize()
    assert torch.equal(bi, bi2)
    assert torch.equal(o, o2)
    # the float64 attention over the GPU's selection
    prob.block_idx, prob.topk = bi.cpu().numpy(), 16
    o_ref, _ = mt.ref_attention(prob)
    mt.assert_close(o.float().cpu().numpy(), o_ref)


def test_layer_decode_graph_replay_with_changing_lengths(rng):
    B, cap = 8, 8192
    prob, q_index, k_index = _m3_problem(rng, [1] * B, [cap] * B)
    t = _cuda(prob, q_index, k_index)
    plan = msa.plan_decode(B, 1, cap, num_qo_heads=64, num_kv_heads=4, topk=16, device="cuda")
    kv_lens = t["kv_lens"]
    scores = torch.empty(B, 4, cap // BLOCK, device="cuda", dtype=torch.float32)
    block_idx = torch.empty(B, 4, 16, device="cuda", dtype=torch.int32)
    out = torch.empty(B, 64, 128, device="cuda", dtype=torch.bfloat16)

    def step():
        msa.sparse_attention_layer(plan, t["q"], t["k_cache"], t["v_cache"], t["q_index"], t["k_index"],
                                   t["page_table"], t["qo_indptr"], kv_lens, force_end=1, scores=scores,
                                   block_idx=block_idx, out=out)

    g, _ = mt.capture_graph(step)
    for it in range(10):
        lens = torch.from_numpy(rng.integers(1, cap + 1, size=B).astype(np.int32)).cuda()
        kv_lens.copy_(lens)
        t["q"].copy_(torch.randn_like(t["q"]))
        t["q_index"].copy_(torch.randn_like(t["q_index"]))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        got, got_bi = out.clone(), block_idx.clone()
        out.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        assert torch.equal(got_bi, block_idx), f"replay {it}: selection differs from eager"
        assert torch.equal(got, out), f"replay {it}: output differs from eager"
        assert not torch.isnan(got).any()
