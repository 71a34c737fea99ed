"""msa.sparse_attention_layer on the GPU: equal to the three steps done separately, close to the CPU
backend, captured once in a CUDA graph for decode while lengths and selections change between replays, and the
deep checks that validate=True adds on CUDA tensors (the layer's steps, build_page_table)."""
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


# The decode layer against block_scores, select_topk and attention run apart, bit for bit, and against the float64
# attention over its selection (fp8: over the dequantized cache), on the M3 shapes' decode forms (splits, MTP with
# ragged and empty requests, forced first blocks, HKT scores, fp8 K/V, rows longer than 512 blocks), outputs and
# block_idx poisoned first.
# name: (Hkv, group, qo_lens, kv_lens, plan max_kv_len, force_begin, force_end, score layout, fp8 K/V)
LAYER_DECODE_CASES = {
    "tp1": (4, 16, [1] * 6, [9000, 129, 0, 2048, 5000, 16 * BLOCK], 65536, 0, 1, "THK", False),
    "tp1_fp8": (4, 16, [1] * 4, [7000, 3000, 1, 17 * BLOCK], 65536, 0, 1, "THK", True),
    "tp4_splits_hkt": (1, 16, [1] * 3, [20000, 16 * BLOCK + 1, 70], 32768, 1, 1, "HKT", False),
    "mtp_ragged": (4, 16, [2, 0, 3, 1], [4000, 50, 9000, 300], 16384, 0, 1, "THK", False),
    "mtp_fp8_hkt": (1, 16, [4, 1, 3], [6000, 2000, 12000], 16384, 2, 1, "HKT", True),
    "long_rows": (4, 16, [1, 1], [12000, 1000], 81920, 0, 1, "THK", False),
}


@pytest.mark.parametrize("case", list(LAYER_DECODE_CASES))
def test_layer_decode_forms_equal_steps(rng, case):
    hkv, group, qo_lens, kv_lens, max_kv, fb, fe, layout, fp8 = LAYER_DECODE_CASES[case]
    prob, q_index, k_index = _m3_problem(rng, qo_lens, kv_lens, hkv=hkv, group=group)
    t = _cuda(prob, q_index, k_index)
    k, v, scales = t["k_cache"], t["v_cache"], {}
    if fp8:
        ks, vs = float(k.abs().max()) / 448, float(v.abs().max()) / 448
        k, v = (k / ks).to(torch.float8_e4m3fn), (v / vs).to(torch.float8_e4m3fn)
        scales = dict(k_scale=ks, v_scale=vs)
    plan = msa.plan_decode(len(kv_lens), max(qo_lens), max_kv, num_qo_heads=hkv * group, num_kv_heads=hkv, topk=16,
                           device="cuda")
    T, nb = t["q"].shape[0], (max_kv + BLOCK - 1) // BLOCK
    shape = (hkv, nb, T) if layout == "HKT" else (T, hkv, nb)
    scores = torch.empty(shape, device="cuda", dtype=torch.float32)
    bi = torch.full((T, hkv, 16), 12345, device="cuda", dtype=torch.int32)
    o = torch.full((T, hkv * group, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    msa.sparse_attention_layer(plan, t["q"], k, v, t["q_index"], t["k_index"], t["page_table"], t["qo_indptr"],
                               t["kv_lens"], force_begin=fb, force_end=fe, scores=scores, score_layout=layout,
                               block_idx=bi, out=o, **scales)
    scores2 = msa.block_scores(t["q_index"], t["k_index"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                               max_blocks=nb, layout=layout)
    bi2 = msa.select_topk(scores2, t["qo_indptr"], t["kv_lens"], 16, layout=layout, force_begin=fb, force_end=fe)
    o2 = msa.attention(plan, t["q"], k, v, t["page_table"], t["qo_indptr"], t["kv_lens"], block_idx=bi2, **scales)
    torch.cuda.synchronize()
    assert torch.equal(scores, scores2)
    assert torch.equal(bi, bi2)
    assert torch.equal(o, o2)
    assert not torch.isnan(o).any()
    prob.block_idx, prob.topk = bi.cpu().numpy(), 16
    if fp8:
        prob.k_cache = k.float().cpu().numpy().astype(np.float64) * scales["k_scale"]
        prob.v_cache = v.float().cpu().numpy().astype(np.float64) * scales["v_scale"]
    o_ref, _ = mt.ref_attention(prob)
    mt.assert_close(o.float().cpu().numpy(), o_ref)


def test_layer_validate_reaches_the_steps_on_cuda(rng):
    """validate=True runs each step's deep check on CUDA tensors: a page id outside the pool is refused, naming
    'page_table' (without it the GPU reads such a page as holding no keys); the output is the unchecked call's."""
    qo_lens, kv_lens = [1, 1], [3000, 700]
    prob, q_index, k_index = _m3_problem(rng, qo_lens, kv_lens)
    t = _cuda(prob, q_index, k_index)
    plan = msa.plan_decode(2, 1, 4096, device="cuda", num_qo_heads=64, num_kv_heads=4, topk=16)
    args = [t["q"], t["k_cache"], t["v_cache"], t["q_index"], t["k_index"], t["page_table"], t["qo_indptr"],
            t["kv_lens"]]
    o = msa.sparse_attention_layer(plan, *args, validate=True)
    torch.cuda.synchronize()
    assert torch.equal(o, msa.sparse_attention_layer(plan, *args))
    bad = t["page_table"].clone()
    bad[0, 0] = 10**6
    args[5] = bad
    msa.sparse_attention_layer(plan, *args)  # unchecked: runs, reads no page outside the pool
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="'page_table'"):
        msa.sparse_attention_layer(plan, *args, validate=True)


def test_build_page_table_validate_on_cuda(rng):
    """validate=True reads req_pool_indices and seq_lens on the host and refuses a row outside req_to_token."""
    r2t = torch.arange(4 * 512, dtype=torch.int32, device="cuda").view(4, 512)
    seq_lens = torch.tensor([300, 17], dtype=torch.int32, device="cuda")
    good = torch.tensor([3, 0], dtype=torch.int32, device="cuda")
    pt = msa.build_page_table(r2t, good, seq_lens, 64, validate=True)
    assert pt.cpu().tolist()[1][:2] == [0, -1] and pt.cpu().tolist()[0][:5] == [24, 25, 26, 27, 28]
    bad = torch.tensor([0, 6], dtype=torch.int32, device="cuda")
    msa.build_page_table(r2t, bad, seq_lens, 64)  # unchecked: no error, nothing read outside req_to_token
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="'req_pool_indices'"):
        msa.build_page_table(r2t, bad, seq_lens, 64, validate=True)
