"""The CUDA attention kernels against the float64 reference of msa_testing, on fresh random data: decode
(1/2/4/8 tokens per request) and prefill (with prefixes), sparse and dense, GQA 1/4/16 (and a padded
group of 12), head dims 64/128/256, page sizes 16/64/128 (and 7), the slot-major pool, the [Hkv, T, topk]
index layout, the flat page table, LSE, unsorted rows with -1 anywhere, empty rows, split-KV with its
fused merge, fixed splits bitwise invariant to the batch, a plan and its clone on two streams at once, and
device values no kernel may trust.
Outputs are poisoned (NaN) before every run. Also merge_states and build_page_table against the CPU.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_attention.py
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def plan_for(prob, decode=True, *, max_qo_len=None, max_kv_len=None, **split):
    kw = dict(num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=prob.head_dim,
              page_size=prob.page_size, topk=prob.topk, causal=prob.causal, device=DEV, **split)
    if decode:
        return msa.plan_decode(prob.batch_size, max_qo_len or int(prob.qo_lens.max()),
                               max_kv_len or max(int(prob.kv_lens.max()), 1), **kw)
    return msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset, **kw)


def run_gpu(plan, prob, tensors=None, extra_q_rows=0):
    """o, lse (numpy) of msa.attention on the GPU with NaN-poisoned outputs. extra_q_rows: q and o hold
    more rows than qo_indptr uses (decode buffers sized for the plan); those rows are no query's and
    are not compared."""
    t = tensors or mt.to_torch(prob, DEV, TORCH_DTYPE[prob.dtype])
    q = t["q"]
    if extra_q_rows:
        q = torch.cat([q, torch.randn(extra_q_rows, *q.shape[1:], device=DEV, dtype=q.dtype)])
    T = q.shape[0]
    out = torch.full((T, prob.num_qo_heads, prob.head_dim_v), float("nan"), device=DEV, dtype=q.dtype)
    lse = torch.full((T, prob.num_qo_heads), float("nan"), device=DEV, dtype=torch.float32)
    bi = t["block_idx"]
    if bi is not None and extra_q_rows:
        htk = bi.stride(0) < bi.stride(1)  # the [Hkv, T, topk] layout, read through a permuted view
        bi = torch.cat([bi, torch.full((extra_q_rows, *bi.shape[1:]), -1, device=DEV, dtype=bi.dtype)])
        if htk:  # keep it (torch.cat returns the [T, Hkv, topk] order)
            bi = bi.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    msa.attention(plan, q, t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"], block_idx=bi,
                  qo_offset=t["qo_offset"], page_indptr=t["page_indptr"], out=out, lse=lse, sm_scale=prob.sm_scale)
    torch.cuda.synchronize()
    o, l = out.float().cpu().numpy(), lse.cpu().numpy()
    if extra_q_rows:
        o, l = o[:-extra_q_rows], l[:-extra_q_rows]
    return o, l


def check(plan, prob, **kw):
    o, lse = run_gpu(plan, prob, **kw)
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o, o_ref)
    mt.assert_lse_close(lse, lse_ref)
    return o, lse


def problem(rng, qo_lens, kv_lens, *, group=16, num_kv_heads=2, head_dim=128, pattern="random", topk=16, **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=group * num_kv_heads,
                           num_kv_heads=num_kv_heads, head_dim=head_dim, topk=topk, pattern=pattern, **kw)


# ---- decode -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 16])
@pytest.mark.parametrize("qo_len", [1, 2, 4, 8])
@pytest.mark.parametrize("pattern", ["random", None])
def test_decode(rng, head_dim, group, qo_len, pattern):
    kv_lens = [int(rng.integers(qo_len, 1500)) for _ in range(3)] + [qo_len]
    qo_lens = [qo_len, max(1, qo_len - 1), qo_len, qo_len]  # ragged: one request with fewer tokens
    prob = problem(rng, qo_lens, kv_lens, group=group, head_dim=head_dim, pattern=pattern,
                   page_size=int(rng.choice([16, 64, 128])), empty_row_prob=0.1)
    check(plan_for(prob, max_qo_len=qo_len), prob)


@pytest.mark.parametrize("page_size", [16, 64, 128, 7])
@pytest.mark.parametrize("layout", ["slot_major", "flat", "htk", "plain"])
def test_decode_page_layouts(rng, page_size, layout):
    prob = problem(rng, [1, 2, 1], [900, 257, 1], page_size=page_size, slot_major=layout == "slot_major",
                   flat_pages=layout == "flat", index_layout="HTK" if layout == "htk" else "THK", group=4)
    check(plan_for(prob, max_qo_len=2), prob)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_decode_dtypes(rng, dtype):
    prob = problem(rng, [1, 4], [3000, 700], dtype=dtype, group=16)
    check(plan_for(prob, max_qo_len=4), prob)


def test_decode_padded_group(rng):
    """G = 12 runs in 16-row slots per token (4 padding rows)."""
    prob = problem(rng, [2, 1, 3], [600, 50, 1200], group=12, num_kv_heads=2)
    check(plan_for(prob, max_qo_len=3), prob)


def test_decode_non_causal_and_offsets(rng):
    prob = problem(rng, [2, 1], [600, 300], causal=False)
    check(plan_for(prob, max_qo_len=2), prob)
    prob = problem(rng, [2, 3], [600, 300], qo_offset=[400, 10], flat_pages=True)
    check(plan_for(prob, max_qo_len=3), prob)


def test_decode_fewer_tokens_than_the_plan(rng):
    """q and o sized for batch_size * max_qo_len, qo_indptr using fewer rows."""
    prob = problem(rng, [1, 2, 1], [500, 129, 64])
    check(plan_for(prob, max_qo_len=4, max_kv_len=4096), prob, extra_q_rows=5)


def test_decode_empty_rows_and_lengths(rng):
    """All -1 rows and a qo_len 0 request: o = 0, lse = -inf, never NaN."""
    prob = problem(rng, [1, 0, 2, 1], [700, 300, 129, 1], empty_row_prob=0.5, group=4)
    prob.block_idx[-1] = -1
    o, lse = check(plan_for(prob, max_qo_len=2, max_kv_len=1000), prob)
    assert np.isneginf(lse[-1]).all() and (o[-1] == 0).all()


@pytest.mark.parametrize("pattern", ["random", None])
def test_decode_split_kv(rng, pattern):
    """Few long requests: the plan splits each block list over many CTAs, merged inside a thread-block
    cluster (sm_90, up to 16 splits) or by the last CTA to finish through the workspace (32 splits)."""
    prob = problem(rng, [1, 1], [30000, 9000], pattern=pattern, group=16, num_kv_heads=1, topk=64)
    for split in (dict(), dict(max_splits=3), dict(max_splits=1), dict(fixed_split_blocks=5),
                  dict(fixed_split_blocks=2)):
        check(plan_for(prob, **split), prob)


@pytest.mark.parametrize("group", [4, 16, 32])
def test_decode_mtp(rng, group):
    """4 tokens per request: G=16 takes one 16-row tile per token; G=4 packs the 4 tokens in one 16-row
    tile and G=32 in one 128-row tile, both over the union of their block lists (clustered selections
    overlap)."""
    prob = problem(rng, [4, 4, 4], [5000, 4000, 3000], pattern="clustered", group=group, num_kv_heads=2)
    check(plan_for(prob), prob)


def test_fixed_split_is_batch_invariant(rng):
    """With fixed_split_blocks, a request's o and lse are bitwise the same whatever else is in the batch."""
    reqs = [problem(rng, [1], [n], group=16, num_kv_heads=2, topk=32) for n in (6000, 2500, 9000, 700)]

    def batch(order):
        ps = [reqs[i] for i in order]
        prob = mt.Problem(
            q=np.concatenate([p.q for p in ps]),
            k_cache=np.concatenate([p.k_cache for p in ps]),
            v_cache=np.concatenate([p.v_cache for p in ps]),
            page_table=None, page_indptr=None,
            qo_indptr=np.arange(len(ps) + 1, dtype=np.int32),
            kv_lens=np.array([p.kv_lens[0] for p in ps], np.int32), qo_offset=None,
            block_idx=np.concatenate([p.block_idx for p in ps]),
            num_qo_heads=ps[0].num_qo_heads, num_kv_heads=2, head_dim=128, head_dim_v=128, page_size=128,
            topk=32, causal=True, sm_scale=ps[0].sm_scale)
        width = max(p.page_table.shape[1] for p in ps)
        table, base = np.full((len(ps), width), -1, np.int32), 0
        for i, p in enumerate(ps):
            row = p.page_table[0]
            table[i, :row.size] = np.where(row >= 0, row + base, -1)
            base += p.k_cache.shape[0]
        prob.page_table = table
        plan = msa.plan_decode(len(ps), 1, 9000, num_qo_heads=prob.num_qo_heads, num_kv_heads=2, head_dim=128,
                               topk=32, device=DEV, fixed_split_blocks=4)
        return run_gpu(plan, prob)

    o1, l1 = batch([0, 1, 2, 3])
    o2, l2 = batch([2, 0])
    o3, l3 = batch([3, 2, 1, 0, 1])
    np.testing.assert_array_equal(o1[2], o2[0])
    np.testing.assert_array_equal(o1[0], o2[1])
    np.testing.assert_array_equal(o1[2], o3[1])
    np.testing.assert_array_equal(o1[1], o3[4])
    np.testing.assert_array_equal(l1[2], l2[0])
    np.testing.assert_array_equal(l1[0], l3[3])


def test_repeated_runs_are_bitwise_equal(rng):
    prob = problem(rng, [1, 1, 1], [20000, 3000, 129], group=16)
    plan = plan_for(prob)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    first = run_gpu(plan, prob, tensors=t)
    for _ in range(3):
        again = run_gpu(plan, prob, tensors=t)
        np.testing.assert_array_equal(first[0], again[0])
        np.testing.assert_array_equal(first[1], again[1])


# ---- prefill (the portable path; on Hopper the sm90 kernels may serve some of these) -------------------

@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 16])
@pytest.mark.parametrize("pattern", ["random", None])
def test_prefill(rng, head_dim, group, pattern):
    qo_lens = [37, 200, 1]
    kv_lens = [37 + 300, 200, 129]  # a prefix, none, a single token after a prefix
    prob = problem(rng, qo_lens, kv_lens, group=group, head_dim=head_dim, pattern=pattern, num_kv_heads=2,
                   page_size=int(rng.choice([16, 64, 128])), empty_row_prob=0.05)
    check(plan_for(prob, decode=False), prob)


def test_prefill_offsets_flat_slot_major(rng):
    prob = problem(rng, [50, 70], [400, 300], qo_offset=[300, 0], flat_pages=True, slot_major=True,
                   index_layout="HTK", group=4)
    check(plan_for(prob, decode=False), prob)


def test_prefill_non_causal(rng):
    prob = problem(rng, [40, 3], [250, 600], causal=False, group=4)
    check(plan_for(prob, decode=False), prob)


# ---- one plan per stream ---------------------------------------------------------------------------------

@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_plan_and_its_clone_run_on_two_streams_at_once(rng, phase):
    """A plan's workspaces serve one run at a time; its clone has its own, so the two run concurrently on two
    streams (each stream's runs queued back to back, the streams interleaved) and both match the reference."""
    if phase == "prefill":
        prob = problem(rng, [1024, 300], [4096, 300 + 1700], group=16, num_kv_heads=2, page_size=128)
    else:
        prob = problem(rng, [1] * 16, [int(n) for n in rng.integers(3000, 20000, 16)], group=16, num_kv_heads=2,
                       page_size=128)
    plan = plan_for(prob, decode=phase == "decode")
    clone = plan.clone()
    assert clone is not plan and clone.describe() == plan.describe() and repr(clone) == repr(plan)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    outs = [torch.full((t["q"].shape[0], prob.num_qo_heads, prob.head_dim_v), float("nan"), device=DEV,
                       dtype=torch.bfloat16) for _ in range(2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    for _ in range(8):
        for p, o, s in zip((plan, clone), outs, streams):
            with torch.cuda.stream(s):
                msa.attention(p, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                              block_idx=t["block_idx"], qo_offset=t["qo_offset"], page_indptr=t["page_indptr"],
                              out=o, sm_scale=prob.sm_scale)
    torch.cuda.synchronize()
    o_ref, _ = mt.ref_attention(prob)
    for o in outs:
        mt.assert_close(o.float().cpu().numpy(), o_ref)
    assert torch.equal(outs[0], outs[1])


# ---- device values the kernels cannot trust -----------------------------------------------------------

def test_out_of_range_blocks_are_empty(rng):
    """Entries >= ceil(kv_len / 128) (and huge ones) are treated as empty slots; duplicates count once."""
    prob = problem(rng, [1, 2], [700, 300], group=4, topk=16)
    bad = prob.block_idx.copy()
    empty = np.argwhere(bad < 0)
    for n, (t, g, k) in enumerate(empty[:40]):
        bad[t, g, k] = [6, 7, 10**6, 2**31 - 1][n % 4] if n % 5 else bad[t, g, (k + 1) % bad.shape[2]]
    prob_bad = mt.Problem(**{**prob.__dict__, "block_idx": bad})
    o, lse = run_gpu(plan_for(prob_bad), prob_bad)
    o_ref, lse_ref = mt.ref_attention(prob)  # the reference of the clean rows (dedup: a set)
    mt.assert_close(o, o_ref)
    mt.assert_lse_close(lse, lse_ref)


@pytest.mark.parametrize("pattern", ["random", None])
def test_bad_pages_and_lengths_do_not_crash(rng, pattern):
    """Page ids outside the pool, lengths past the table (dense: the blocks end with the table, not after 2^24
    blocks), negative lengths: no fault, no hang, no NaN."""
    prob = problem(rng, [1, 1, 1], [900, 300, 500], group=4, pattern=pattern)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    t["page_table"][0, 1] = 10**9
    t["page_table"][1, 0] = -5
    t["kv_lens"][2] = 2**31 - 1      # far past its page-table row
    plan = plan_for(prob, max_kv_len=1000)
    o, lse = run_gpu(plan, prob, tensors=t)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    t["kv_lens"][:] = torch.tensor([-7, 0, -1], dtype=torch.int32)
    o, lse = run_gpu(plan, prob, tensors=t)
    assert (o == 0).all() and np.isneginf(lse).all()


# ---- merge_states and build_page_table ----------------------------------------------------------------

@pytest.mark.parametrize("parts_dtype,out_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                   (torch.float16, torch.float16)])
def test_merge_states(rng, parts_dtype, out_dtype):
    S, T, H, D = 5, 33, 6, 72
    v = torch.from_numpy(rng.standard_normal((S, T, H, D)).astype(np.float32)).to(DEV, parts_dtype)
    lse_np = (rng.standard_normal((S, T, H)) * 3).astype(np.float32)
    lse_np[rng.random((S, T, H)) < 0.3] = -np.inf
    lse_np[:, 0, 0] = -np.inf  # a row with no key in any part
    lse = torch.from_numpy(lse_np).to(DEV)
    out = torch.full((T, H, D), float("nan"), device=DEV, dtype=out_dtype)
    lse_out = torch.full((T, H), float("nan"), device=DEV)
    msa.merge_states(v, lse, out=out, lse_out=lse_out)
    o_ref, l_ref = mt.ref_merge_states(v.float().cpu().numpy(), lse_np)
    mt.assert_close(out.float().cpu().numpy(), o_ref, rel=1e-2, atol=2e-2)
    mt.assert_lse_close(lse_out.cpu().numpy(), l_ref, atol=1e-4)
    # the CPU backend on the same parts
    o_cpu, l_cpu = msa.merge_states(v.float().cpu().numpy(), lse_np, return_lse=True)
    np.testing.assert_allclose(out.float().cpu().numpy(), o_cpu, rtol=1e-2, atol=2e-2)
    np.testing.assert_allclose(lse_out.cpu().numpy(), l_cpu, rtol=1e-5, atol=1e-5)


def test_merge_states_of_no_values_still_merges_lse(rng):
    """Parts of head dim 0: lse_out is the merged lse, as on the CPU (the kernel returned before writing it;
    found by test_gpu_fuzz_ops.py)."""
    lse_np = (rng.standard_normal((2, 3, 4)) * 3).astype(np.float32)
    lse_np[:, 0, 0] = -np.inf
    lse_out = torch.full((3, 4), float("nan"), device=DEV)
    msa.merge_states(torch.zeros(2, 3, 4, 0, device=DEV), torch.from_numpy(lse_np).to(DEV), lse_out=lse_out)
    _, l_cpu = msa.merge_states(np.zeros((2, 3, 4, 0), np.float32), lse_np, return_lse=True)
    np.testing.assert_allclose(lse_out.cpu().numpy(), l_cpu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_build_page_table(rng, index_dtype, page_size):
    pool, max_context = 6, 700
    ppr = math.ceil(max_context / page_size)
    perm = rng.permutation(pool * ppr)
    r2t = np.zeros((pool, max_context), np.int32)
    for r in range(pool):
        i = np.arange(max_context)
        r2t[r] = perm[r * ppr + i // page_size] * page_size + i % page_size
    r2t[1, 5 * page_size:] = -1  # slots not assigned
    rows = np.array([4, 1, 0, 2, 5], np.int64)
    lens = np.array([700, 600, 0, 1, 129], np.int64)
    max_pages = ppr + 3
    out = torch.full((5, max_pages), 77, device=DEV, dtype=torch.int32)
    msa.build_page_table(torch.from_numpy(r2t).to(DEV), torch.from_numpy(rows).to(DEV, index_dtype),
                         torch.from_numpy(lens).to(DEV, index_dtype), page_size, out=out)
    ref = msa.build_page_table(r2t, rows.astype(np.int32), lens.astype(np.int32), page_size, max_pages=max_pages)
    np.testing.assert_array_equal(out.cpu().numpy(), ref)


def test_build_page_table_bad_values_do_not_crash(rng):
    r2t = torch.arange(4 * 300, dtype=torch.int32, device=DEV).view(4, 300)
    rows = torch.tensor([0, 9, -1, 3], dtype=torch.int32, device=DEV)  # 9, -1: outside the pool
    lens = torch.tensor([10**6, 50, 50, -3], dtype=torch.int32, device=DEV)
    out = torch.full((4, 20), 77, device=DEV, dtype=torch.int32)
    msa.build_page_table(r2t, rows, lens, 16, out=out)
    o = out.cpu().numpy()
    np.testing.assert_array_equal(o[0], np.where(np.arange(20) * 16 < 300, np.arange(20), -1))  # token < max_context
    assert (o[1:] == -1).all()
