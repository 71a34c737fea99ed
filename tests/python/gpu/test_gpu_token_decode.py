"""The single-token decode kernel (src/cuda/decode/token_kernel.cuh, sm_90) against the float64 reference,
and the general paged kernel on the same problems (MSA_PAGED_TOKEN_KERNEL=0): one query token per request
(and MTP: up to 8 tokens per request at G > 8, one CTA or cluster per token), head dim 128, G <= 16,
top-k <= 32, pages of a multiple of 64 tokens (powers of two and not). Unsorted rows with -1 slots and duplicates,
empty rows, qo_len 0 requests (the guessed token row is wrong), lengths that end inside a 64-key tile, prefixes,
non-causal, the slot-major pool, flat page tables, the [Hkv, T, topk] index layout, bad pages, splits
forced or fixed, fp16. Outputs are poisoned (NaN) before every run.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_token_decode.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402
from test_gpu_attention import check, plan_for, problem, run_gpu  # noqa: E402
from test_gpu_attention_fp8 import K_SCALE, V_SCALE, call, fp8_tensors, to_device_fp8  # noqa: E402

pytestmark = pytest.mark.gpu

KERNELS = ["token", "general"]


@pytest.fixture(params=KERNELS)
def kernel(request, monkeypatch):
    """Which kernel serves the plans made in the test (read at plan time)."""
    if request.param == "token" and mt.kernel_capability() < (9, 0):
        pytest.skip("below sm_90 code the single-token kernel serves only plans it runs unsplit "
                    "(test_below_sm90_code)")
    monkeypatch.setenv("MSA_PAGED_TOKEN_KERNEL", "0" if request.param == "general" else "1")
    return request.param


def decode_problem(rng, kv_lens, qo_lens=None, **kw):
    qo_lens = qo_lens if qo_lens is not None else [1] * len(kv_lens)
    return problem(rng, qo_lens, kv_lens, **kw)


@pytest.mark.parametrize("group", [16, 12, 8, 1])
@pytest.mark.parametrize("topk", [1, 16, 32])
def test_groups_and_topk(rng, kernel, group, topk):
    prob = decode_problem(rng, [3000, 129, 64, 1, 700], group=group, topk=topk, empty_row_prob=0.1)
    check(plan_for(prob, max_qo_len=1), prob)


@pytest.mark.parametrize("page_size", [64, 128, 256])
@pytest.mark.parametrize("layout", ["plain", "slot_major", "flat", "htk"])
def test_page_layouts(rng, kernel, page_size, layout):
    prob = decode_problem(rng, [900, 257, 1, 4000, 191], page_size=page_size, slot_major=layout == "slot_major",
                          flat_pages=layout == "flat", index_layout="HTK" if layout == "htk" else "THK")
    check(plan_for(prob, max_qo_len=1), prob)


@pytest.mark.parametrize("page_size", [192, 320])
def test_page_size_not_a_power_of_two(rng, kernel, page_size):
    """Pages of a multiple of 64 tokens that are no power of two: a tile's page by a division (page_shift
    -1), and a 128-key block whose two tiles lie in two pages."""
    prob = decode_problem(rng, [900, 257, 1, 4000, 191], page_size=page_size, topk=16)
    plan = plan_for(prob, max_qo_len=1)
    if kernel != "general":
        assert plan.describe()["paged"] == "token", plan.describe()
    check(plan, prob)


def test_ragged_batch_and_empty_rows(rng, kernel):
    """qo_len 0 requests move every later token off its guessed row b; all -1 rows give o = 0, lse = -inf."""
    prob = decode_problem(rng, [700, 300, 129, 2000, 65], qo_lens=[1, 0, 1, 0, 1], empty_row_prob=0.3)
    prob.block_idx[-1] = -1
    o, lse = check(plan_for(prob, max_qo_len=1), prob)
    assert np.isneginf(lse[-1]).all() and (o[-1] == 0).all()


def test_duplicates_and_out_of_range(rng, kernel):
    """Duplicate entries count once; entries past the token's blocks or negative are skipped."""
    prob = decode_problem(rng, [5000, 1000, 300], topk=16)
    bi = prob.block_idx.copy()
    bi[0, 0, :6] = [3, 3, 3, 0, 0, 10**6]
    bi[1, 1, :4] = [-5, 7, 7, 2**31 - 1]
    prob.block_idx = bi
    check(plan_for(prob, max_qo_len=1), prob)


def test_offsets_and_non_causal(rng, kernel):
    prob = decode_problem(rng, [600, 3000, 200], qo_offset=[400, 10, 199])
    check(plan_for(prob, max_qo_len=1), prob)
    prob = decode_problem(rng, [600, 3000, 200], causal=False)
    check(plan_for(prob, max_qo_len=1), prob)


@pytest.mark.parametrize("split", [dict(), dict(max_splits=1), dict(max_splits=3), dict(fixed_split_blocks=1),
                                   dict(fixed_split_blocks=5)])
def test_splits(rng, kernel, split):
    """Few long requests: up to 16 splits per (request, head), merged in a cluster."""
    prob = decode_problem(rng, [30000, 9000], group=16, num_kv_heads=1, topk=32)
    check(plan_for(prob, **split), prob)


def test_fp16_and_lse_optional(rng, kernel):
    prob = decode_problem(rng, [3000, 700, 128], dtype="fp16")
    check(plan_for(prob, max_qo_len=1), prob)


def test_bad_pages_do_not_crash(rng, kernel):
    """Page ids outside the pool are caller errors: no fault, no NaN, and the requests that do not read
    them keep their exact results."""
    prob = decode_problem(rng, [900, 700, 1500], group=16)
    o_ref, _ = mt.ref_attention(prob)
    table = prob.page_table.copy()
    table[0, 1] = prob.k_cache.shape[0] + 5
    table[1, 0] = -3
    prob.page_table = table
    o, lse = run_gpu(plan_for(prob, max_qo_len=1), prob)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    mt.assert_close(o[2:], o_ref[2:])


@pytest.mark.parametrize("tq", [2, 3, 4, 8])
@pytest.mark.parametrize("group", [16, 12, 8])
def test_mtp(rng, kernel, tq, group):
    """Several tokens per request (MTP): the token kernel takes one CTA (or cluster) per token when the
    general kernel would also give each token its own tile (G > 8), 2^ceil(log2(tq)) CTAs per request (tq = 3:
    one idle); each token is causal at its own position. Ragged: a request with fewer tokens than the plan, one with none (every later token off its
    guessed row), one with kv_len = qo_len; unsorted rows with -1 slots."""
    qo_lens = [tq, max(1, tq - 1), 0, tq, 1]
    prob = decode_problem(rng, [3000, 700, 129, tq, 65], qo_lens=qo_lens, group=group, empty_row_prob=0.1)
    plan = plan_for(prob, max_qo_len=tq)
    if kernel != "general":
        assert plan.describe()["paged"] == ("token" if group > 8 else "general"), plan.describe()
    o, lse = check(plan, prob)
    assert not np.isnan(o).any() and not np.isnan(lse).any()


@pytest.mark.parametrize("split", [dict(), dict(max_splits=3), dict(fixed_split_blocks=2)])
def test_mtp_offsets_splits_and_spare_rows(rng, kernel, split):
    """MTP with prefixes (qo_offset), non-causal, split block lists (few long requests), fp16, and q / o sized
    for batch x max_qo_len while qo_indptr uses fewer rows."""
    prob = decode_problem(rng, [30000, 9000], qo_lens=[4, 3], qo_offset=[20000, 9000 - 3], topk=32, num_kv_heads=1)
    check(plan_for(prob, max_qo_len=4, **split), prob)
    prob = decode_problem(rng, [5000, 700, 300], qo_lens=[2, 4, 1], causal=False, dtype="fp16")
    check(plan_for(prob, max_qo_len=4, **split), prob)
    prob = decode_problem(rng, [500, 129, 64], qo_lens=[1, 2, 1])
    check(plan_for(prob, max_qo_len=4, max_kv_len=4096, **split), prob, extra_q_rows=5)


@pytest.mark.parametrize("fp8", [False, True])
def test_below_sm90_code(rng, fp8):
    """Below sm_90 code (no clusters) the single-token kernel takes a plan only when it runs it unsplit (at least
    half as many items as SMs); with fewer items the general kernel splits them. sm_90 code takes all."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hkv = 4
    big = -(-sms // hkv)  # requests whose items (x Hkv) fill every SM
    mid = sms // (2 * hkv) + 1  # the fewest whose items are more than half the SMs: one split (M3-TP1 D-B32)
    for batch in (big, mid, 2):
        prob = decode_problem(rng, [int(x) for x in rng.integers(1, 2500, batch)], group=16, num_kv_heads=hkv,
                              topk=16, empty_row_prob=0.05)
        plan = plan_for(prob, max_qo_len=1)
        d = plan.describe()
        if mt.kernel_capability() >= (9, 0) or batch != 2:
            assert d["paged"] == "token", d
        else:
            assert d["paged"] == "general", d
        if mt.kernel_capability() < (9, 0) and batch != 2:
            assert d["splits"] == "1" and d["merge"] == "none", d
        if not fp8:
            check(plan, prob)
            continue
        k8, v8, kd, vd = fp8_tensors(prob, False)
        out, lse = call(plan, prob, mt.to_torch(prob, "cuda", torch.bfloat16), k8, v8, k_scale=K_SCALE, v_scale=V_SCALE)
        o_ref, lse_ref = mt.scaled_reference(prob, kd, vd)
        mt.assert_close(out.float().cpu().numpy(), o_ref)
        mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


@pytest.mark.parametrize("interleaved", [False, True])
def test_fp8_ring_depths(rng, interleaved):
    """The fp8 tile loop cycles through 3 ring stages on grids of up to four waves, through 5 on grids of at most one
    CTA per SM whose CTAs stream 8 blocks or more (sm_90 code), and through 6 on longer grids (token_config.h): each
    against the float64 reference over the dequantized cache, ragged lengths (tiles cut inside, rows shorter than the
    ring), empty rows, both pool layouts. Below sm_90 code the kernel serves only the unsplit plans of the last two."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hkv = 4
    sm90 = mt.kernel_capability() >= (9, 0)
    # 5 requests: 4 splits of 4 blocks; SMs / 4 requests: one unsplit CTA per SM, 16 blocks; 2 CTAs per SM: 4 waves
    # hold 8 x SMs items
    cases = [(sms // hkv, "5" if sm90 else "3"), (8 * sms // hkv + 1, "6")]
    for batch, stages in ([(5, "3")] if sm90 else []) + cases:
        lens = [int(x) for x in rng.integers(1, 3000, batch)]
        prob = decode_problem(rng, lens, group=16, num_kv_heads=hkv, topk=16, empty_row_prob=0.05)
        plan = plan_for(prob, max_qo_len=1)
        d = plan.describe()
        assert d["paged"] == "token" and d["fp8_stages"] == stages, d
        k8, v8, kd, vd = fp8_tensors(prob, interleaved)
        out, lse = call(plan, prob, mt.to_torch(prob, "cuda", torch.bfloat16), k8, v8, k_scale=K_SCALE, v_scale=V_SCALE)
        o_ref, lse_ref = mt.scaled_reference(prob, kd, vd)
        mt.assert_close(out.float().cpu().numpy(), o_ref)
        mt.assert_lse_close(lse.cpu().numpy(), lse_ref)


def test_fp8_nan_bytes(rng):
    """e4m3's NaN bytes (0x7F / 0xFF) in the cache under the single-token kernel, which below sm_89 code widens a
    tile's bytes without the per-word NaN step and fixes its words only when their largest magnitude shows the NaN
    encoding: o NaN exactly where the float64 reference over the dequantized values has it (a K byte: every head of
    its KV group for that token; a V byte: that dim of the group's heads), the rest within tolerance; lse NaN
    where the reference's is (the K byte's rows), the others as the reference's. Items for every SM: the
    single-token kernel unsplit on any build (tests/python/gpu/test_gpu_non_finite.py: split plans)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hkv = 4
    batch = -(-sms // hkv)
    prob = decode_problem(rng, [int(x) for x in rng.integers(300, 2500, batch)], group=16, num_kv_heads=hkv, topk=16)
    plan = plan_for(prob, max_qo_len=1)
    assert plan.describe()["paged"] == "token"
    k8, v8, _, _ = mt.fp8_kv(prob, K_SCALE, V_SCALE)

    def selected_key(r, g, off):
        """(request, page, slot): key `off` (or the last) of a block that the token of request r (or of the next
        request that selected one) selected for KV head g."""
        while True:
            kv = int(prob.kv_lens[r])
            blocks = [int(b) for b in prob.block_idx[r, g] if 0 <= b and b * 128 < kv]
            if blocks:
                key = blocks[0] * 128 + min(off, kv - blocks[0] * 128 - 1)
                return r, prob.page_table[r, key // prob.page_size], key % prob.page_size
            r += 1

    rk, p, s = selected_key(3, 1, 70)
    k8.view(np.uint8)[p, 1, s, 9] = 0xFF
    rv, p, s = selected_key(rk + 1, 2, 5)
    v8.view(np.uint8)[p, 2, s, 33] = 0x7F
    kd, vd = k8.astype(np.float64) * K_SCALE, v8.astype(np.float64) * V_SCALE
    out, lse = call(plan, prob, mt.to_torch(prob, "cuda", torch.bfloat16), to_device_fp8(k8), to_device_fp8(v8),
                    k_scale=K_SCALE, v_scale=V_SCALE)
    o_ref, lse_ref = mt.scaled_reference(prob, kd, vd)
    o, l = out.float().cpu().numpy(), lse.cpu().numpy()
    nan_o, nan_l = np.isnan(o_ref), np.isnan(lse_ref)
    assert nan_o[rk, 16:32].all() and nan_o[rv, 32:48, 33].all() and nan_l[rk, 16:32].all(), "the NaN bytes reach"
    np.testing.assert_array_equal(np.isnan(o), nan_o)
    np.testing.assert_array_equal(np.isnan(l), nan_l)
    mt.assert_close(np.where(nan_o, 0.0, o), np.where(nan_o, 0.0, o_ref))
    mt.assert_lse_close(l[~nan_l], lse_ref[~nan_l])
