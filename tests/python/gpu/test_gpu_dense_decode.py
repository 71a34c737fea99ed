"""Dense decode at long context: few items (one request, one or four KV heads) split over the whole GPU. The
single-token kernel takes each split's range of at most 32 blocks without clusters, every split's rows merged by a
second kernel (plan.describe() says merge=kernel); the general kernel (MSA_PAGED_TOKEN_KERNEL=0) merges in clusters
of 16 and then through the workspace (merge=cluster+workspace).
Both against the float64 reference: bf16 and fp8 K/V (two pools and the halves of one interleaved pool), lse
included, outputs poisoned, ragged and empty requests, MTP, non-causal; and under a CUDA graph replayed with
the lengths changing (the general kernel's arrival counters reset themselves). Plans of more requests than one
wave of splits holds: bf16 K/V on the general kernel, fp8 K/V on the single-token kernel in several waves
(plan.describe(): fp8_paged).

    PYTHONPATH=build/python:tests/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_dense_decode.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
K_SCALE, V_SCALE = 0.137, 0.29


@pytest.fixture(params=["token", "general"])
def kernel(request, monkeypatch):
    """Which kernel serves the plans made in the test (read at plan time)."""
    if request.param == "token" and mt.kernel_capability() < (9, 0):
        pytest.skip("the single-token kernel's dense plans need sm_90 code (cluster merges)")
    monkeypatch.setenv("MSA_PAGED_TOKEN_KERNEL", "0" if request.param == "general" else "1")
    return request.param


def plan_for(batch, max_kv, hq, hkv, max_qo=1, **kw):
    return msa.plan_decode(batch, max_qo, max_kv, num_qo_heads=hq, num_kv_heads=hkv, head_dim=128, page_size=128,
                           topk=0, device=DEV, **kw)


def to_device_fp8(a):
    return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)


def run(plan, prob, fp8, interleaved=False):
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    k, v, scales = t["k_cache"], t["v_cache"], {}
    if fp8:
        k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE, interleaved=interleaved)
        if interleaved:
            pool = to_device_fp8(k8.base)
            k, v = pool[..., :128], pool[..., 128:]
        else:
            k, v = to_device_fp8(k8), to_device_fp8(v8)
        scales = dict(k_scale=K_SCALE, v_scale=V_SCALE)
    T = t["q"].shape[0]
    out = torch.full((T, prob.num_qo_heads, 128), float("nan"), device=DEV, dtype=torch.bfloat16)
    lse = torch.full((T, prob.num_qo_heads), float("nan"), device=DEV)
    msa.attention(plan, t["q"], k, v, t["page_table"], t["qo_indptr"], t["kv_lens"], qo_offset=t["qo_offset"],
                  out=out, lse=lse, **scales)
    torch.cuda.synchronize()
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd) if fp8 else mt.ref_attention(prob)
    mt.assert_close(out.float().cpu().numpy(), o_ref)
    mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


def expected_merge(kernel):
    return "kernel" if kernel == "token" else "cluster+workspace"


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("heads", [(16, 1), (64, 4)])
@pytest.mark.parametrize("kv", [[65536], [40000, 3], [131072]])
def test_long_dense_decode(rng, kernel, fp8, heads, kv):
    prob = mt.make_problem(rng, qo_lens=[1] * len(kv), kv_lens=kv, num_qo_heads=heads[0], num_kv_heads=heads[1],
                           head_dim=128, page_size=128, topk=0, pattern=None)
    plan = plan_for(len(kv), max(kv), *heads)
    if len(kv) == 1 and mt.kernel_capability() >= (9, 0):  # one request
        d = plan.describe()
        if kernel == "token" and kv[0] <= 65536:  # longer rows may need more splits than one wave holds
            assert d.get("paged") == "token", d
        assert d.get("merge") == expected_merge("token" if d.get("paged") == "token" else "general"), d
    run(plan, prob, fp8)


# (query heads, KV heads), qo_lens, kv_lens, causal, fp8, interleaved pool, the plan's max_kv_len (None: the longest)
CASES = {
    "ragged": ((16, 1), [1, 1], [70001, 129], True, False, False, None),
    "mtp": ((16, 1), [4, 3], [65536, 20000], True, False, False, None),  # each token causal at its own position
    "non_causal_empty": ((16, 1), [1, 1], [0, 70000], False, False, False, None),  # no key: o = 0, lse = -inf
    "short_in_long_plan": ((16, 1), [1, 1], [300, 1], True, False, False, 131072),  # most splits see no block
    "odd_lengths": ((16, 1), [1, 1], [99999, 65537], True, False, False, None),
    "fp8_interleaved": ((16, 1), [1], [65535], True, True, True, None),
    "tp1_fp8": ((64, 4), [1], [100000], True, True, False, None),
    # with max_splits=16: one cluster of 16
    "one_cluster": ((16, 1), [1] * 8, [4000, 1, 3000, 128, 129, 2500, 4096, 700], True, False, False, None),
    "few_splits": ((16, 1), [1] * 24, [4096 + 97 * i for i in range(24)], True, True, False, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dense_decode_cases(rng, kernel, case):
    heads, qo, kv, causal, fp8, interleaved, max_kv = CASES[case]
    prob = mt.make_problem(rng, qo_lens=qo, kv_lens=kv, num_qo_heads=heads[0], num_kv_heads=heads[1], head_dim=128,
                           page_size=128, topk=0, pattern=None, causal=causal)
    extra = dict(max_splits=16) if case == "one_cluster" else {}
    plan = plan_for(len(kv), max_kv or max(kv), *heads, max_qo=max(qo), causal=causal, **extra)
    if kernel == "token":
        assert plan.describe().get("paged") == "token", plan.describe()
        if case == "one_cluster":
            assert plan.describe().get("merge") == "push", plan.describe()
        elif case not in ("few_splits", "mtp"):  # (those take one cluster of 16 or fewer splits)
            assert plan.describe().get("merge") == "kernel", plan.describe()
    run(plan, prob, fp8, interleaved)


def check_graph_replays(plan, heads, max_kv, fp8, length_sets, rng):
    """Captures one call of `plan` over buffers sized for len(length_sets[0]) requests of up to max_kv tokens, then
    per set of lengths rewrites q, K/V, the page table and the lengths in place, poisons the output, replays and
    checks against the reference."""
    B, (HQ, HKV) = len(length_sets[0]), heads
    width = max_kv // 128 + 4
    kv_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    scales = dict(k_scale=K_SCALE, v_scale=V_SCALE) if fp8 else {}
    q = torch.zeros(B, HQ, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.zeros(B * width, HKV, 128, 128, device=DEV, dtype=kv_dtype)
    v = torch.zeros_like(k)
    table = torch.full((B, width), -1, device=DEV, dtype=torch.int32)
    qo_indptr = torch.arange(B + 1, device=DEV, dtype=torch.int32)
    kv_lens = torch.ones(B, device=DEV, dtype=torch.int32)
    out = torch.full((B, HQ, 128), float("nan"), device=DEV, dtype=torch.bfloat16)

    def step():
        msa.attention(plan, q, k, v, table, qo_indptr, kv_lens, out=out, **scales)
        return out

    graph, _ = mt.capture_graph(step)
    for lens in length_sets:
        prob = mt.make_problem(rng, qo_lens=[1] * B, kv_lens=lens, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=128,
                               page_size=128, topk=0, pattern=None)
        t = mt.to_torch(prob, DEV, torch.bfloat16)
        npg = t["k_cache"].shape[0]
        if fp8:
            k8, v8, kd, vd = mt.fp8_kv(prob, K_SCALE, V_SCALE)
            k[:npg].copy_(to_device_fp8(k8))
            v[:npg].copy_(to_device_fp8(v8))
            o_ref = mt.scaled_reference(prob, kd, vd)[0]
        else:
            k[:npg].copy_(t["k_cache"])
            v[:npg].copy_(t["v_cache"])
            o_ref = mt.ref_attention(prob)[0]
        q.copy_(t["q"])
        table.fill_(-1)
        table[:, :t["page_table"].shape[1]].copy_(t["page_table"])
        kv_lens.copy_(t["kv_lens"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        mt.assert_close(out.float().cpu().numpy(), o_ref, what=f"kv_lens {lens[:4]}")


@pytest.mark.parametrize("fp8", [False, True])
def test_dense_merge_under_a_graph(rng, kernel, fp8):
    """One plan captured once; 12 replays with the length changing (some steps shorter than one split's share)."""
    plan = plan_for(1, 65536, 16, 1)
    if mt.kernel_capability() >= (9, 0):
        assert plan.describe().get("merge") == expected_merge(kernel), plan.describe()
    lengths = [65536, 1, 300, 4096, 65535, 129, 20000, 2, 65536, 777, 50000, 128]
    check_graph_replays(plan, (16, 1), 65536, fp8, [[n] for n in lengths], rng)


# More requests than one wave of splits of <= 32 blocks holds: (query heads, KV heads), kv_lens, fp8 splits and
# cluster (0: none, the merge kernel) on 132 SMs. bf16 K/V keep the general kernel; fp8 K/V take the single-token
# kernel in several waves.
WAVES = {
    "tp4_one_cluster": ((16, 1), [20000, 0, 1, 129, 4097] + [500 + 211 * i for i in range(25)], 8, 8),
    "tp1_cluster_of_16": ((64, 4), [65536, 127, 128, 40000, 3000], 16, 16),
    "tp4_no_cluster": ((16, 1), [70000, 65537, 5, 1, 300, 4096, 128, 20000], 18, 0),  # 547 blocks: 18 splits
}


def waves_plan(case):
    heads, kv, splits, cluster = WAVES[case]
    plan = plan_for(len(kv), max(kv), *heads)
    if mt.kernel_capability() == (9, 0) and torch.cuda.get_device_properties(0).multi_processor_count == 132:
        d = plan.describe()
        assert d.get("paged") == "general" and d.get("fp8_paged") == "token", d
        assert (d.get("fp8_splits"), d.get("fp8_cluster")) == (str(splits), str(cluster)), d
    return plan


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("case", list(WAVES))
def test_fp8_dense_decode_in_waves(rng, case, interleaved):
    """fp8 K/V of a dense plan of many requests: one cluster of a power of two splits per item (two CTAs a SM), or
    past 512 blocks splits without clusters merged by the second kernel, in as many waves as they take; the plan's
    bf16 runs stay on the general kernel. Ragged and empty requests, both pool layouts, lse, outputs poisoned."""
    heads, kv = WAVES[case][:2]
    prob = mt.make_problem(rng, qo_lens=[1] * len(kv), kv_lens=kv, num_qo_heads=heads[0], num_kv_heads=heads[1],
                           head_dim=128, page_size=128, topk=0, pattern=None)
    plan = waves_plan(case)
    run(plan, prob, True, interleaved)
    run(plan, prob, False)


@pytest.mark.parametrize("case", ["tp4_one_cluster", "tp4_no_cluster"])
def test_fp8_dense_waves_under_a_graph(rng, case):
    """The fp8 waves plan captured once, 6 replays with every length, q and K/V changing in place."""
    heads, kv = WAVES[case][:2]
    B, max_kv = len(kv), max(kv)
    length_sets = []
    for it in range(6):
        lens = [int(x) for x in rng.integers(0, max_kv + 1, B)]
        lens[it % B] = max_kv
        length_sets.append(lens)
    check_graph_replays(waves_plan(case), heads, max_kv, True, length_sets, rng)
