"""The Hopper prefill kernels (src/cuda/prefill_sm90: query-major and KV-major, TMA + wgmma) against the float64
reference of msa_testing, over the contract's cases: a cached prefix + a chunk (default and explicit qo_offset),
ragged batches, lengths not multiple of 128, unsorted rows with -1 anywhere, empty rows (o = 0, lse = -inf), the
three selection patterns under each decomposition (MSA_SM90_PREFILL = auto, qmajor, kvmajor; several KV-major
windows), dense causal and non-causal, page sizes 128 / 256 (served) and 64 (the portable fallback), the
slot-major pool, the [Hkv, T, topk] index layout, the flat page table, fp16, untrusted device values (device lengths
past the plan's too), and bitwise-equal repeated runs. Outputs are NaN-poisoned before every run and the data are
fresh for every test. On a GPU other than sm_90 the same cases exercise the portable path.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_prefill.py

A small case for compute-sanitizer (memcheck / racecheck / synccheck), outside pytest:

    PYTHONPATH=build/python compute-sanitizer --tool memcheck python3 tests/python/gpu/test_gpu_prefill.py
"""
import faulthandler
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ["auto", "qmajor", "kvmajor"]


@pytest.fixture(autouse=True)
def watchdog():
    """A hung kernel blocks inside CUDA where Python signals cannot reach: dump the stacks and exit."""
    faulthandler.dump_traceback_later(300, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def problem(rng, qo_lens, kv_lens, *, group=16, num_kv_heads=2, pattern="random", topk=16, **kw):
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, num_qo_heads=group * num_kv_heads,
                           num_kv_heads=num_kv_heads, topk=topk, pattern=pattern, **kw)


def plan_for(prob, monkeypatch=None, mode="auto", window_tiles=None):
    """A prefill plan; the sm90 decomposition is read from the environment at plan time."""
    if monkeypatch is not None:
        monkeypatch.setenv("MSA_SM90_PREFILL", mode)
        if window_tiles:
            monkeypatch.setenv("MSA_SM90_KV_WINDOW_TILES", str(window_tiles))
        else:
            monkeypatch.delenv("MSA_SM90_KV_WINDOW_TILES", raising=False)
    return msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset,
                            num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads,
                            head_dim=prob.head_dim, page_size=prob.page_size, topk=prob.topk,
                            causal=prob.causal, device=DEV)


def run_gpu(plan, prob, tensors=None):
    """o, lse (numpy) of msa.attention with NaN-poisoned outputs."""
    t = tensors or mt.to_torch(prob, DEV, TORCH_DTYPE[prob.dtype])
    T = t["q"].shape[0]
    out = torch.full((T, prob.num_qo_heads, prob.head_dim_v), float("nan"), device=DEV, dtype=t["q"].dtype)
    lse = torch.full((T, prob.num_qo_heads), float("nan"), device=DEV, dtype=torch.float32)
    msa.attention(plan, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                  block_idx=t["block_idx"], qo_offset=t["qo_offset"], page_indptr=t["page_indptr"], out=out, lse=lse,
                  sm_scale=prob.sm_scale)
    torch.cuda.synchronize()
    return out.float().cpu().numpy(), lse.cpu().numpy()


def diagnose(o, o_ref, prob) -> str:
    """Where the output is wrong, in the kernel's terms: tokens, heads (rows 16w+g / +8 of a warp), the
    64-dim halves and 8-column groups of D, NaNs: enough to tell a layout slip from a masking one."""
    o = np.asarray(o, np.float64)
    bad = ~(np.abs(o - o_ref) <= 2e-2)                      # NaN counts as bad
    if not bad.any():
        return "no element off by more than 2e-2"
    G = prob.num_qo_heads // prob.num_kv_heads
    tok, head = np.nonzero(bad.any(axis=2))
    cols = bad.any(axis=(0, 1))
    lines = [f"{bad.sum()} of {bad.size} elements off ({np.isnan(o).sum()} NaN); "
             f"{len(np.unique(tok))} of {o.shape[0]} tokens, heads in group {sorted(set((head % G).tolist()))[:16]}",
             f"bad 8-column groups of D: {np.nonzero(cols.reshape(-1, 8).any(axis=1))[0].tolist()}",
             f"first bad (token, head): {list(zip(tok[:8].tolist(), head[:8].tolist()))}"]
    qo = prob.qo_indptr
    req = np.searchsorted(qo, tok, side="right") - 1
    lines.append(f"requests of bad tokens: {sorted(set(req.tolist()))}; tokens in request: "
                 f"{sorted(set((tok - qo[req]).tolist()))[:24]}")
    t0, h0 = tok[0], head[0]
    lines.append(f"o[{t0},{h0},:8] = {np.round(o[t0, h0, :8], 3).tolist()} ref {np.round(o_ref[t0, h0, :8], 3).tolist()}")
    return "\n".join(lines)


def check(plan, prob, tensors=None):
    o, lse = run_gpu(plan, prob, tensors)
    o_ref, lse_ref = mt.ref_attention(prob)
    try:
        mt.assert_close(o, o_ref)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnose(o, o_ref, prob)}") from None
    mt.assert_lse_close(lse, lse_ref)
    return o, lse


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("group", [1, 4, 16])
def test_dense(rng, causal, group):
    prob = problem(rng, [300, 129, 1], [700, 129, 257], group=group, pattern=None, causal=causal)
    check(plan_for(prob), prob)


def test_dense_non_causal_empty_kv(rng):
    """Non-causal rows with kv_len = 0 see nothing: o = 0, lse = -inf."""
    prob = problem(rng, [5, 70], [0, 300], qo_offset=[0, 0], pattern=None, causal=False)
    o, lse = check(plan_for(prob), prob)
    assert (o[:5] == 0).all() and np.isneginf(lse[:5]).all()


# A cached prefix + a chunk (kv 1300, 260 new), a prefill from scratch with a tail (131 = 128 + 3), a
# short chunk after a prefix, and a request with no query tokens.
RAGGED = dict(qo_lens=[260, 131, 7, 0], kv_lens=[1300, 131, 900, 500])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern", ["random", "clustered", "shared"])
def test_sparse_patterns(rng, monkeypatch, pattern, mode):
    prob = problem(rng, **RAGGED, pattern=pattern, neg_slot_prob=0.3)
    check(plan_for(prob, monkeypatch, mode), prob)


@pytest.mark.parametrize("mode", MODES)
def test_sparse_explicit_offset_and_empty_rows(rng, monkeypatch, mode):
    """qo_offset given (keys past the chunk exist but are in the future), some rows all -1."""
    prob = problem(rng, [200, 50], [1500, 700], qo_offset=[1000, 129], empty_row_prob=0.2)
    o, lse = check(plan_for(prob, monkeypatch, mode), prob)
    empty = (prob.block_idx < 0).all(axis=2)  # [T, Hkv]
    G = prob.num_qo_heads // prob.num_kv_heads
    rows = np.repeat(empty, G, axis=1)
    assert rows.any(), "the problem should hold empty rows"
    assert (o[rows] == 0).all() and np.isneginf(lse[rows]).all()


@pytest.mark.parametrize("mode", ["qmajor", "kvmajor"])
def test_sparse_many_tiles_and_windows(rng, monkeypatch, mode):
    """Enough tiles to keep every SM busy, and KV-major windows of 16 tiles (several launches)."""
    prob = problem(rng, [1100, 300], [3000, 300], num_kv_heads=2, pattern="random")
    check(plan_for(prob, monkeypatch, mode, window_tiles=16), prob)


@pytest.mark.parametrize("group,num_kv_heads", [(8, 4), (4, 2), (32, 1)])
@pytest.mark.parametrize("mode", ["auto", "kvmajor"])
def test_sparse_group_sizes(rng, monkeypatch, group, num_kv_heads, mode):
    """G = 8 and 32 take both paths; G = 4 (32 tokens a tile) is query-major only."""
    prob = problem(rng, [150, 40], [700, 40], group=group, num_kv_heads=num_kv_heads, pattern="clustered")
    check(plan_for(prob, monkeypatch, mode), prob)


@pytest.mark.parametrize("page_size", [128, 256, 64])
@pytest.mark.parametrize("layout", ["slot_major", "flat", "htk"])
@pytest.mark.parametrize("pattern", ["random", None])
def test_pages_and_layouts(rng, monkeypatch, page_size, layout, pattern):
    """Page sizes 128 and 256 run on sm90 (a 256 page holds two blocks), 64 falls back to the paged family."""
    prob = problem(rng, [180, 33], [600, 400], page_size=page_size, pattern=pattern,
                   slot_major=layout == "slot_major", flat_pages=layout == "flat",
                   index_layout="HTK" if layout == "htk" else "THK")
    check(plan_for(prob, monkeypatch, "kvmajor" if pattern else "auto"), prob)


@pytest.mark.parametrize("pattern", ["random", "shared", None])
def test_fp16(rng, pattern):
    prob = problem(rng, [140, 20], [800, 20], pattern=pattern, dtype="fp16")
    check(plan_for(prob), prob)


@pytest.mark.parametrize("mode", ["qmajor", "kvmajor"])
def test_repeated_runs_are_bitwise_equal(rng, monkeypatch, mode):
    """The KV-major lists are built with atomics (any order); results must not depend on it."""
    prob = problem(rng, [600, 90], [2000, 90], pattern="random")
    plan = plan_for(prob, monkeypatch, mode)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    first = run_gpu(plan, prob, t)
    for _ in range(3):
        again = run_gpu(plan, prob, t)
        np.testing.assert_array_equal(first[0], again[0])
        np.testing.assert_array_equal(first[1], again[1])


def eager_and_replays(plan, prob, t, replays=3):
    """The call eagerly on a non-default stream, then captured once in a CUDA graph and replayed; o and lse
    NaN-poisoned before each. Returns [eager, replay 1, ...] as numpy (o, lse) pairs."""
    T = t["q"].shape[0]
    out = torch.empty((T, prob.num_qo_heads, prob.head_dim_v), device=DEV, dtype=torch.bfloat16)
    lse = torch.empty((T, prob.num_qo_heads), device=DEV, dtype=torch.float32)

    def call():
        msa.attention(plan, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                      block_idx=t["block_idx"], qo_offset=t["qo_offset"], page_indptr=t["page_indptr"], out=out,
                      lse=lse, sm_scale=prob.sm_scale)

    def poisoned_run(fn):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        return out.float().cpu().numpy(), lse.cpu().numpy()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        results = [poisoned_run(call)]
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    torch.cuda.synchronize()
    results += [poisoned_run(graph.replay) for _ in range(replays)]
    return results


@pytest.mark.parametrize("case", ["random", "clustered", "windows", "htk", "dense"])
def test_eager_and_graph_replays(rng, monkeypatch, case):
    """With a KV-major path the KV-major launches run on the plan's side stream beside the query-major
    kernel (a fork and a join of the caller's stream; src/cuda/runtime/stream_fork.h), and the launches that
    follow a kernel of the run use programmatic dependent launch (src/cuda/prefill_sm90/launch.h). Eagerly on
    a non-default stream and in every replay of a CUDA graph that captured the call (NaN-poisoned before
    each): the same bits, close to the reference. random: request 0's tiles (63 blocks to pick from) go
    KV-major, request 1's (8 blocks) query-major; clustered: mostly query-major tiles (a pool of 24 blocks per
    query block), the KV-major launches finding little or nothing to do; windows: the KV-major path over 3
    windows (scan -> fill -> KV-major kernel, merge -> next window's KV-major kernel); htk: windows with the
    [Hkv, T, topk] index layout; dense: the query-major kernel right after the schedule."""
    prob = problem(rng, [600, 300], [8000, 900], pattern={"clustered": "clustered", "dense": None}.get(case, "random"),
                   **(dict(index_layout="HTK") if case == "htk" else {}))
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    plan = plan_for(prob, monkeypatch, window_tiles=80 if case in ("windows", "htk") else None)
    if case == "windows":
        assert plan.describe()["windows"] == "3", plan.describe()
    runs = eager_and_replays(plan, prob, t)
    for run in runs[1:]:
        np.testing.assert_array_equal(run[0], runs[0][0])
        np.testing.assert_array_equal(run[1], runs[0][1])
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(runs[0][0], o_ref)
    mt.assert_lse_close(runs[0][1], lse_ref)


@pytest.mark.parametrize("pattern", ["clustered", None])
def test_qmajor_long_and_empty_tiles(rng, monkeypatch, pattern):
    """Query-major tiles longer than the stage ring (every stage and its record reused), a tile that
    selects nothing (its Q buffer released without a product), and dense tiles."""
    prob = problem(rng, [90, 17], [2600, 17], pattern=pattern)
    if pattern:
        prob.block_idx = prob.block_idx.copy()
        prob.block_idx[8:16] = -1            # the second tile of request 0 selects nothing
    o, lse = check(plan_for(prob, monkeypatch, "qmajor"), prob)
    if pattern:
        assert (o[8:16] == 0).all() and np.isneginf(lse[8:16]).all()


@pytest.mark.parametrize("group,num_kv_heads,topk", [(4, 1, 16), (4, 1, 32), (16, 2, 64)])
@pytest.mark.parametrize("mode", ["qmajor", "kvmajor"])
def test_tile_list_sizes(rng, monkeypatch, group, num_kv_heads, topk, mode):
    """Tile unions of 512 entries (32 tokens x top-16, the largest the warp sort takes), 1024 (the CTA
    kernel) and 8 tokens x top-64; duplicates in rows fold into one entry."""
    prob = problem(rng, [150, 40], [9000, 40], group=group, num_kv_heads=num_kv_heads, topk=topk, pattern="random")
    prob.block_idx = prob.block_idx.copy()
    prob.block_idx[3, 0, 1] = prob.block_idx[3, 0, 0]  # a duplicate (a caller error the fast path may fold)
    o_ref, _ = mt.ref_attention(prob)
    o, _ = run_gpu(plan_for(prob, monkeypatch, mode if group >= 8 else "auto"), prob)
    keep = np.ones(o.shape[0], bool)
    keep[3] = False
    mt.assert_close(o[keep], o_ref[keep])
    assert not np.isnan(o).any()


@pytest.mark.parametrize("group,num_kv_heads", [(8, 2), (16, 2), (32, 1)])
def test_kvmajor_partial_stores(rng, monkeypatch, group, num_kv_heads):
    """KV-major partial outputs through TMA stores (boxes of 8 rows when G = 8, 16 rows above), over several
    windows."""
    prob = problem(rng, [300, 70], [2200, 70], group=group, num_kv_heads=num_kv_heads, pattern="random")
    check(plan_for(prob, monkeypatch, "kvmajor", window_tiles=24), prob)


@pytest.mark.parametrize("kv_len,stripes", [(2200, "8"), (66000, "4")])
def test_kv_key_stripes(rng, monkeypatch, kv_len, stripes):
    """The rank pass's 8 counters per key (windows of at most 512 keys: 19 here) and 4 (more keys: 517, a
    request of 516 blocks), over several windows. KV-major items span several Q tiles, the last ones of a window
    claimed in parts (src/cuda/prefill_sm90/config.h kKvTailItemsPerSm: every item of so small a window)."""
    prob = problem(rng, [100, 70], [kv_len, 70], num_kv_heads=1, pattern="random")
    plan = plan_for(prob, monkeypatch, "kvmajor", window_tiles=4)
    assert plan.describe()["key_stripes"] == stripes, plan.describe()
    check(plan, prob)


# The bf16 ids are the ones these cases always had (the rng is seeded from the test id).
@pytest.mark.parametrize("group,num_kv_heads,topk,dtype", [(16, 2, 16, "bf16"), (8, 2, 16, "bf16"), (16, 2, 64, "bf16"),
                                                           (16, 2, 16, "fp16"), (8, 2, 16, "fp16"), (16, 2, 8, "bf16"),
                                                           (8, 2, 32, "bf16")],
                         ids=["16-2-16", "8-2-16", "16-2-64", "16-2-16-fp16", "8-2-16-fp16", "16-2-8", "8-2-32"])
def test_kv_merge_groups_and_topk(rng, monkeypatch, group, num_kv_heads, topk, dtype):
    """The KV-major kernel and merge (two heads of a token per warp) at G = 16 and 8; top-16, below one pass of
    16 slots (8), two passes (32) and four (64); bf16 and fp16 (test_fp16's problem is too short for auto to
    pick KV-major): several windows, a causal head with -1 slots."""
    prob = problem(rng, [300, 70], [2200, 70], group=group, num_kv_heads=num_kv_heads, topk=topk, pattern="random",
                   dtype=dtype)
    check(plan_for(prob, monkeypatch, "kvmajor", window_tiles=24), prob)


@pytest.mark.parametrize("mode", MODES)
def test_untrusted_device_values(rng, monkeypatch, mode):
    """Block ids out of range, duplicates, and page ids outside the pool are caller errors: no fault, no
    NaN; the rows the bad entries do not touch keep their exact results."""
    prob = problem(rng, [130, 40], [900, 300])
    o_ref, _ = mt.ref_attention(prob)
    bad = prob.block_idx.copy()
    bad[5, 0, :4] = [10**6, -7, 3, 3]       # out of range, negative, a duplicate
    bad[140, 1, 0] = 2**31 - 1
    prob.block_idx = bad
    table = prob.page_table.copy()
    table[1, 1] = prob.k_cache.shape[0] + 5  # request 1, keys 128..255: outside the pool
    prob.page_table = table
    o, lse = run_gpu(plan_for(prob, monkeypatch, mode), prob)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    T = o.shape[0]
    untouched = np.ones(T, bool)
    untouched[[5, 140]] = False
    untouched[130:] = False                  # request 1 reads the bad page
    mt.assert_close(o[untouched], o_ref[untouched])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern", ["random", None])
def test_device_lengths_past_the_plan(rng, monkeypatch, mode, pattern):
    """Device kv_lens far beyond the plan's (a caller error that only validate=True reports): 40 requests x 4 KV
    heads of 2^31 - 1 keys hold 2^31 blocks, past int32 in the tile schedule's block prefix (dense: a tile's blocks
    end with the page table, not after 2^24). The call must not fault or hang (its output is undefined), and the
    same plan then runs the true lengths exactly."""
    prob = problem(rng, [8] * 40, [300] * 40, num_kv_heads=4, pattern=pattern)
    plan = plan_for(prob, monkeypatch, mode)
    t = mt.to_torch(prob, DEV, TORCH_DTYPE[prob.dtype])
    run_gpu(plan, prob, dict(t, kv_lens=torch.full_like(t["kv_lens"], 2**31 - 1)))
    o, lse = run_gpu(plan, prob, t)
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o, o_ref)
    mt.assert_lse_close(lse, lse_ref)


def _sanitizer_case():
    """One small sparse case per path and a dense one: the launches compute-sanitizer watches. Tiles are
    longer than the stage rings (every ring slot and its stage / tile / Q-tile records are reused), one
    tile selects nothing (the query-major path that releases its Q buffer without a product), and
    KV-major items span several Q tiles, claimed in parts (every item of so small a window)."""
    rng = np.random.default_rng(0)
    for mode, pattern in (("qmajor", "clustered"), ("kvmajor", "random"), ("auto", None)):
        os.environ["MSA_SM90_PREFILL"] = mode
        prob = problem(rng, [70, 9], [1000, 9], pattern=pattern, num_kv_heads=1)
        if pattern:
            prob.block_idx = prob.block_idx.copy()
            prob.block_idx[8:16] = -1
        o, lse = run_gpu(plan_for(prob), prob)
        o_ref, lse_ref = mt.ref_attention(prob)
        mt.assert_close(o, o_ref)
        mt.assert_lse_close(lse, lse_ref)
        print(f"{mode:8s} {pattern or 'dense':10s} ok", flush=True)


if __name__ == "__main__":
    _sanitizer_case()
    sys.exit(0)
