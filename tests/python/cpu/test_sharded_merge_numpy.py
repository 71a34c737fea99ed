"""The rule msa.distributed's merge rests on, with numpy only (runs without torch, in CI): each rank's top-k of
the blocks it owns (msa.select_topk over its blocks, nothing forced), scattered into scores that are NaN
elsewhere, give msa.select_topk's single-device selection, with ties, -inf, NaN, forced blocks and causal
validity, for any split of the blocks."""
import numpy as np
import pytest

import msa

BLOCK = 128


def merged_selection(scores, owner, world, qo_indptr, kv_lens, topk, force_begin, force_end):
    """Each rank's top-k over its own blocks (a local view: its blocks packed in ascending order), scattered
    into NaN scores, then the single-device select_topk call."""
    T, H, nb = scores.shape
    merged = np.full_like(scores, np.nan)
    for r in range(world):
        mine = owner == r                                        # [nb]
        cols = np.flatnonzero(mine)
        if cols.size == 0:
            continue
        local = np.ascontiguousarray(scores[:, :, cols])
        # Each token a request of its own over the rank's blocks it may select: the valid ones of the token.
        valid = np.array([_valid(t, qo_indptr, kv_lens) for t in range(T)])
        lkv = np.array([np.count_nonzero(cols < v) * BLOCK for v in valid], np.int32)
        sel = msa.select_topk(local, np.arange(T + 1, dtype=np.int32), lkv, topk, qo_offset=np.zeros(T, np.int32),
                              layout="THK", force_begin=0, force_end=0, causal=False)
        for t in range(T):
            for h in range(H):
                for j in sel[t, h]:
                    if j >= 0:
                        merged[t, h, cols[j]] = scores[t, h, cols[j]]
    return msa.select_topk(merged, qo_indptr, kv_lens, topk, layout="THK", force_begin=force_begin,
                           force_end=force_end)


def _valid(t, qo_indptr, kv_lens):
    b = int(np.searchsorted(qo_indptr[1:], t, side="right"))
    qo_len = qo_indptr[b + 1] - qo_indptr[b]
    pos = kv_lens[b] - qo_len + (t - qo_indptr[b])
    return min(-(-kv_lens[b] // BLOCK), pos // BLOCK + 1)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("split", ["round_robin", "contiguous", "random"])
@pytest.mark.parametrize("forced", [(0, 1), (1, 2), (0, 0)])
def test_union_of_rank_topk_merges_to_global_selection(rng, world, split, forced):
    qo_lens, kv_lens = [1, 3, 40, 1], [2000, 900, 1500, 100]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv = np.array(kv_lens, np.int32)
    T, H, nb, topk = qo_indptr[-1], 3, 16, 5
    # Few distinct values: many ties; some -inf and NaN entries.
    scores = rng.integers(0, 6, size=(T, H, nb)).astype(np.float32)
    scores[rng.random(scores.shape) < 0.1] = -np.inf
    scores[rng.random(scores.shape) < 0.1] = np.nan
    if split == "round_robin":
        owner = np.arange(nb) % world
    elif split == "contiguous":
        cuts = np.sort(rng.integers(0, nb + 1, size=world - 1))
        owner = np.searchsorted(cuts, np.arange(nb), side="right")
    else:
        owner = rng.integers(0, world, size=nb)
    want = msa.select_topk(scores, qo_indptr, kv, topk, layout="THK", force_begin=forced[0], force_end=forced[1])
    got = merged_selection(scores, owner, world, qo_indptr, kv, topk, *forced)
    np.testing.assert_array_equal(got, want)
