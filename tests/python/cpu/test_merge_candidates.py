"""msa.merge_candidates on the CPU (numpy only, runs in CI): the selection of msa.select_topk over THK rows that
hold each candidate's score at its block id and NaN elsewhere (a block proposed twice keeps the higher score),
with ties, NaN, -inf, empty and out-of-range ids, forced blocks, prefixes, causal or not; and its argument checks."""
import numpy as np
import pytest

import msa

BLOCK = 128


def scattered(cs, ci, max_blocks):
    """[T, H, max_blocks] rows: NaN, each candidate's score at its id, the higher one where ids repeat."""
    N, T, H, K = cs.shape
    rows = np.full((T, H, max_blocks), np.nan, np.float32)
    for r in range(N):
        for t in range(T):
            for h in range(H):
                for k in range(K):
                    i, s = ci[r, t, h, k], cs[r, t, h, k]
                    if 0 <= i < max_blocks and (np.isnan(rows[t, h, i]) or (not np.isnan(s) and s > rows[t, h, i])):
                        rows[t, h, i] = s
    return rows


def random_case(rng, qo_lens, kv_lens, ranks, per_rank, extra_blocks=2, heads=2):
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv = np.asarray(kv_lens, np.int32)
    offset = (kv - np.asarray(qo_lens) - rng.integers(0, 2, len(kv))).astype(np.int32)
    nb = int(-(-kv.max() // BLOCK)) + extra_blocks
    T = int(qo_indptr[-1])
    shape = (ranks, T, heads, per_rank)
    u = rng.random(shape)
    cs = np.where(u < 0.1, np.nan, np.where(u < 0.2, -np.inf, rng.integers(-4, 5, shape))).astype(np.float32)
    ci = rng.integers(-2, nb + 2, shape).astype(np.int32)
    return qo_indptr, kv, offset, nb, cs, ci


@pytest.mark.parametrize("ranks,per_rank", [(1, 4), (2, 16), (3, 5), (8, 16)])
@pytest.mark.parametrize("forced", [(0, 1), (1, 2), (0, 0)])
@pytest.mark.parametrize("causal", [True, False])
def test_merge_is_select_topk_over_the_scattered_rows(rng, ranks, per_rank, forced, causal):
    qo_indptr, kv, offset, nb, cs, ci = random_case(rng, [1, 3, 1, 7], [900, 1500, 100, 2600], ranks, per_rank)
    fb, fe = forced
    want = msa.select_topk(scattered(cs, ci, nb), qo_indptr, kv, 6, qo_offset=offset, layout="THK", force_begin=fb,
                           force_end=fe, causal=causal)
    got = msa.merge_candidates(cs, ci, qo_indptr, kv, 6, nb, qo_offset=offset, force_begin=fb, force_end=fe,
                               causal=causal)
    np.testing.assert_array_equal(got, want)
    # Any strides: the same candidates stored [T, N, K, H].
    cs_t, ci_t = (np.ascontiguousarray(x.transpose(1, 0, 3, 2)).transpose(1, 0, 3, 2) for x in (cs, ci))
    out = np.full((cs.shape[1], cs.shape[2], 9), 777, np.int32)[:, :, 1:7]
    msa.merge_candidates(cs_t, ci_t, qo_indptr, kv, 6, nb, qo_offset=offset, force_begin=fb, force_end=fe,
                         causal=causal, out=out)
    np.testing.assert_array_equal(out, want)


def test_merge_checks_its_arguments(rng):
    qo_indptr, kv, offset, nb, cs, ci = random_case(rng, [1, 2], [300, 700], 2, 4)
    with pytest.raises(ValueError, match=r"msa.merge_candidates: argument 'cand_ids'.*num_heads"):
        msa.merge_candidates(cs, ci[:, :, :1], qo_indptr, kv, 4, nb)
    with pytest.raises(TypeError, match=r"msa.merge_candidates: argument 'cand_ids': expected dtype int32"):
        msa.merge_candidates(cs, ci.astype(np.int64), qo_indptr, kv, 4, nb)
    with pytest.raises(ValueError, match=r"argument 'max_blocks': expected >= 6 .*got 5"):
        msa.merge_candidates(cs, ci, qo_indptr, kv, 4, 5)
    with pytest.raises(ValueError, match=r"argument 'cand_scores': expected 4 dimensions|argument 'cand_scores'.*4"):
        msa.merge_candidates(cs[0], ci[0], qo_indptr, kv, 4, nb)


def test_torch_op(rng):
    """torch.ops.msa.merge_candidates (msa.torch_ops): the op's schema, and the wrapper against msa's call."""
    torch = pytest.importorskip("torch")
    import msa.torch_ops as mt_ops

    qo_indptr, kv, offset, nb, cs, ci = random_case(rng, [1, 3, 2], [900, 1500, 2600], 3, 8)
    t = {k: torch.from_numpy(v) for k, v in dict(cs=cs, ci=ci, qo=qo_indptr, kv=kv, off=offset).items()}
    out = torch.empty(cs.shape[1], cs.shape[2], 6, dtype=torch.int32)
    torch.library.opcheck(torch.ops.msa.merge_candidates.default,
                          (t["cs"], t["ci"], t["qo"], t["kv"], t["off"], nb, 6, 0, 1, True, out, False))
    got = mt_ops.merge_candidates(t["cs"], t["ci"], t["qo"], t["kv"], 6, nb, qo_offset=t["off"])
    want = msa.merge_candidates(cs, ci, qo_indptr, kv, 6, nb, qo_offset=offset)
    np.testing.assert_array_equal(got.numpy(), want)
