"""msa.select_topk's options on the CPU backend: finite_only, block_map and out_scores against a small
independent model of contract §4 (rows with NaN / -inf / +inf, fewer finite candidates than topk, all
non-finite, forced blocks of -inf score, ties, a block map with a row stride past max_blocks, strided
out_scores), the Python-side allocation of out_scores, argument errors, and the torch op's schema."""
import math

import numpy as np
import pytest

import msa
import msa_testing as mt

BLOCK = 128


def model_row(s, n, topk, fb, fe, finite_only):
    """The selected blocks of one row over its n valid blocks: the forced ones, then the best of the others by
    (not NaN, score, lower index), finite ones only with finite_only; ascending."""
    forced = [b for b in range(n) if b < fb or b >= n - fe]
    rest = [b for b in range(n) if b not in forced and (not finite_only or math.isfinite(s[b]))]
    rest.sort(key=lambda b: (not math.isnan(s[b]), -math.inf if math.isnan(s[b]) else s[b], -b), reverse=True)
    return sorted(forced + rest[:topk - fb - fe])


def model(s_thk, qo_indptr, kv_lens, topk, *, qo_offset=None, force_begin=0, force_end=1, causal=True,
          finite_only=False, block_map=None):
    """(ids int32 [T, H, topk], scores fp32 [T, H, topk]) of contract §4 with the options."""
    T, H, _ = s_thk.shape
    ids = np.full((T, H, topk), -1, np.int32)
    scores = np.full((T, H, topk), np.nan, np.float32)
    for b in range(len(kv_lens)):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        off = int(kv_lens[b]) - (q1 - q0) if qo_offset is None else int(qo_offset[b])
        for t in range(q0, q1):
            n = math.ceil(int(kv_lens[b]) / BLOCK)
            if causal:
                pos = off + t - q0
                n = 0 if pos < 0 else min(n, pos // BLOCK + 1)
            for h in range(H):
                row = [float(x) for x in s_thk[t, h]]
                chosen = model_row(row, n, topk, force_begin, force_end, finite_only)
                for j, blk in enumerate(chosen):
                    ids[t, h, j] = blk if block_map is None else block_map[b, blk]
                    scores[t, h, j] = s_thk[t, h, blk]
    return ids, scores


def spiky_scores(rng, T, H, nb):
    """Small-integer scores (many ties) where each row keeps a random share of finite values (none, a few,
    about half, nearly all); the rest NaN, -inf or +inf."""
    return mt.non_finite_rows(rng, rng.integers(-3, 4, (T, H, nb)).astype(np.float32), (0.0, 0.05, 0.5, 0.95))


def run(s_thk, qo_indptr, kv_lens, topk, *, layout="THK", qo_offset=None, force=(0, 1), causal=True,
        finite_only=True, block_map=None):
    """msa.select_topk with strided inputs and outputs: scores in `layout` with padded strides, block_map a view
    with row stride max_blocks + 3, out_scores a head-major view with slot stride 2."""
    T, H, nb = s_thk.shape
    if layout == "HKT":
        store = np.full((H, nb, T + 2), 9.0, np.float32)
        store[:, :, :T] = s_thk.transpose(1, 2, 0)
        scores = store[:, :, :T]
    else:
        store = np.full((T, H, nb + 2), 9.0, np.float32)
        store[:, :, :nb] = s_thk
        scores = store[:, :, :nb]
    bm = None
    if block_map is not None:
        bm_store = np.full((block_map.shape[0], nb + 3), -9, np.int32)
        bm_store[:, :nb] = block_map
        bm = bm_store[:, :nb]
    os_store = np.full((H, T, 2 * topk), 5.0, np.float32)
    out_scores = os_store.transpose(1, 0, 2)[:, :, ::2]
    ids, got_scores = msa.select_topk(
        scores, np.asarray(qo_indptr, np.int32), np.asarray(kv_lens, np.int32), topk,
        qo_offset=None if qo_offset is None else np.asarray(qo_offset, np.int32), layout=layout,
        force_begin=force[0], force_end=force[1], causal=causal, finite_only=finite_only, block_map=bm,
        out_scores=out_scores, return_scores=True)
    assert got_scores is out_scores
    assert (os_store[:, :, 1::2] == 5.0).all(), "out_scores written outside its view"
    return ids, np.array(out_scores)


def check(s_thk, qo_indptr, kv_lens, topk, **kw):
    layout = kw.pop("layout", "THK")
    got = run(s_thk, qo_indptr, kv_lens, topk, layout=layout, **kw)
    force = kw.pop("force", (0, 1))
    want = model(s_thk, qo_indptr, kv_lens, topk, force_begin=force[0], force_end=force[1], **kw)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])  # NaN where NaN


def one_row(row, topk, force=(0, 0), finite_only=True):
    s = np.asarray(row, np.float32).reshape(1, 1, -1)
    n = s.shape[2]
    return run(s, [0, 1], [n * BLOCK], topk, force=force, finite_only=finite_only)


nan, inf = float("nan"), float("inf")


def test_non_finite_scores_are_never_chosen_by_score():
    ids, sc = one_row([nan, -inf, 3, nan, 1, inf], 3)
    assert ids.ravel().tolist() == [2, 4, -1]
    assert sc.ravel()[:2].tolist() == [3.0, 1.0] and np.isnan(sc.ravel()[2])
    assert one_row([nan, -inf, 3, nan, 1, inf], 4, finite_only=False)[0].ravel().tolist() == [1, 2, 4, 5]
    assert one_row([-inf, 2, -inf, 2, -inf, 5, 1], 2)[0].ravel().tolist() == [1, 5]  # ties: the lower block


def test_fewer_finite_candidates_and_all_non_finite_rows():
    assert one_row([-inf, 2, -inf, 2, -inf, 5, 1], 6)[0].ravel().tolist() == [1, 3, 5, 6, -1, -1]
    assert one_row([nan, -inf, -inf, nan, inf], 3)[0].ravel().tolist() == [-1, -1, -1]
    ids, sc = one_row([nan, -inf, -inf, nan, inf], 3, force=(1, 1))  # forced blocks kept whatever their score
    assert ids.ravel().tolist() == [0, 4, -1]
    assert np.isnan(sc.ravel()[0]) and sc.ravel()[1] == inf and np.isnan(sc.ravel()[2])
    # fewer valid blocks than topk
    assert one_row([-inf, -inf, 7], 5)[0].ravel().tolist() == [2, -1, -1, -1, -1]
    assert one_row([-inf, nan, -inf], 5, force=(1, 1))[0].ravel().tolist() == [0, 2, -1, -1, -1]
    assert one_row([-inf, nan], 4, force=(2, 2))[0].ravel().tolist() == [0, 1, -1, -1]


@pytest.mark.parametrize("layout", ["HKT", "THK"])
@pytest.mark.parametrize("finite_only", [True, False])
@pytest.mark.parametrize("topk,force", [(1, (0, 0)), (1, (0, 1)), (5, (0, 1)), (5, (1, 1)), (5, (2, 3)),
                                        (16, (0, 0)), (16, (2, 3))])
def test_random_rows_with_every_option(rng, layout, finite_only, force, topk):
    qo_lens, kv_lens = [30, 2, 0, 3], [2500, 300, 0, 1500]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    nb = math.ceil(max(kv_lens) / BLOCK)
    s = spiky_scores(rng, int(qo_indptr[-1]), 3, nb)
    block_map = rng.permutation(10 * nb * len(kv_lens))[:len(kv_lens) * nb].reshape(len(kv_lens), nb).astype(np.int32)
    check(s, qo_indptr, kv_lens, topk, layout=layout, force=force, finite_only=finite_only, block_map=block_map)


@pytest.mark.parametrize("finite_only", [True, False])
def test_non_causal_with_offsets_and_empty_requests(rng, finite_only):
    qo_lens, kv_lens, off = [4, 3, 2], [1100, 129, 0], [0, 7, 0]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    s = spiky_scores(rng, int(qo_indptr[-1]), 2, 9)
    check(s, qo_indptr, kv_lens, 6, qo_offset=off, force=(1, 1), causal=False, finite_only=finite_only,
          block_map=np.arange(27, dtype=np.int32).reshape(3, 9) * 3)
    ids, _ = run(s, qo_indptr, kv_lens, 6, qo_offset=off, causal=False, finite_only=finite_only)
    assert (ids[7:] == -1).all()


def test_options_default_to_the_plain_selection(rng):
    s = spiky_scores(rng, 12, 2, 20)
    args = (s, np.array([0, 12], np.int32), np.array([20 * BLOCK], np.int32), 8)
    plain = msa.select_topk(*args, layout="THK")
    ids, sc = msa.select_topk(*args, layout="THK", return_scores=True)
    np.testing.assert_array_equal(ids, plain)
    assert sc.dtype == np.float32 and sc.shape == (12, 2, 8)
    mapped = msa.select_topk(*args, layout="THK", block_map=np.arange(20, dtype=np.int32)[None, :] + 100)
    np.testing.assert_array_equal(mapped, np.where(plain >= 0, plain + 100, -1))


def test_bad_options_name_the_argument():
    s = np.zeros((2, 1, 4), np.float32)
    args = (s, np.array([0, 2], np.int32), np.array([512], np.int32), 2)
    with pytest.raises(TypeError, match=r"argument 'block_map': expected dtype int32.*got float32"):
        msa.select_topk(*args, layout="THK", block_map=np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"argument 'block_map': expected shape\[0\] \(batch_size\) = 1, got 2"):
        msa.select_topk(*args, layout="THK", block_map=np.zeros((2, 4), np.int32))
    with pytest.raises(ValueError, match=r"argument 'block_map': expected shape\[1\] .* >= 4, got 3"):
        msa.select_topk(*args, layout="THK", block_map=np.zeros((1, 3), np.int32))
    with pytest.raises(ValueError, match=r"argument 'out_scores': expected shape\[2\] \(topk\) = 2, got 3"):
        msa.select_topk(*args, layout="THK", out_scores=np.zeros((2, 1, 3), np.float32))
    with pytest.raises(TypeError, match=r"argument 'out_scores': expected dtype float32.*got int32"):
        msa.select_topk(*args, layout="THK", out_scores=np.zeros((2, 1, 2), np.int32))


def test_torch_op_schema_takes_the_options(rng):
    torch = pytest.importorskip("torch")
    import msa.torch_ops as mt_ops

    s = torch.from_numpy(spiky_scores(rng, 5, 2, 6))
    qo_indptr, kv_lens = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([6 * BLOCK], dtype=torch.int32)
    block_map = torch.arange(6, dtype=torch.int32).view(1, 6) * 2
    out, out_scores = torch.empty(5, 2, 4, dtype=torch.int32), torch.empty(5, 2, 4)
    torch.library.opcheck(torch.ops.msa.select_topk.default,
                          (s, qo_indptr, kv_lens, 4, None, "THK", 0, 1, True, out, False, True, block_map, out_scores))
    ids, sc = mt_ops.select_topk(s, qo_indptr, kv_lens, 4, layout="THK", finite_only=True, block_map=block_map,
                                 return_scores=True)
    want = model(s.numpy(), [0, 5], [6 * BLOCK], 4, finite_only=True, block_map=block_map.numpy())
    np.testing.assert_array_equal(ids.numpy(), want[0])
    np.testing.assert_array_equal(sc.numpy(), want[1])
