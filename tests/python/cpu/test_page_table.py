"""msa.build_page_table on the CPU backend: sglang's req_to_token map to a dense page table."""
import math

import numpy as np
import pytest

import msa


def engine_pool(rng, seq_lens, page_size, num_reqs_pool=6, max_context=600):
    """req_to_token [pool, max_context] whose rows map tokens to slots page by page (sglang's layout)."""
    pages_total = num_reqs_pool * math.ceil(max_context / page_size)
    perm = rng.permutation(pages_total)
    r2t = np.zeros((num_reqs_pool, max_context), np.int32)
    for r in range(num_reqs_pool):
        for i in range(max_context):
            r2t[r, i] = perm[r * math.ceil(max_context / page_size) + i // page_size] * page_size + i % page_size
    rows = rng.choice(num_reqs_pool, size=len(seq_lens), replace=False)
    return r2t, rows


def ref_page_table(r2t, rows, seq_lens, page_size, max_pages):
    out = np.full((len(rows), max_pages), -1, np.int32)
    for b, (r, n) in enumerate(zip(rows, seq_lens)):
        for p in range(math.ceil(n / page_size)):
            out[b, p] = r2t[r, p * page_size] // page_size
    return out


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_build_page_table(rng, index_dtype, page_size):
    seq_lens = np.array([1, 600, 0, 129], index_dtype)
    r2t, rows = engine_pool(rng, seq_lens, page_size)
    pt = msa.build_page_table(r2t, rows.astype(index_dtype), seq_lens, page_size)
    width = math.ceil(600 / page_size)  # default: ceil(max_context / page_size)
    assert pt.dtype == np.int32 and pt.shape == (4, width)
    np.testing.assert_array_equal(pt, ref_page_table(r2t, rows, seq_lens, page_size, width))


def test_explicit_max_pages_and_out(rng):
    seq_lens = np.array([300, 17], np.int32)
    r2t, rows = engine_pool(rng, seq_lens, 64)
    pt = msa.build_page_table(r2t, rows.astype(np.int32), seq_lens, 64, max_pages=5)
    np.testing.assert_array_equal(pt, ref_page_table(r2t, rows, seq_lens, 64, 5))
    buf = np.full((2, 12), 42, np.int32)
    out = buf[:, :8]
    assert msa.build_page_table(r2t, rows.astype(np.int32), seq_lens, 64, out=out) is out
    np.testing.assert_array_equal(out, ref_page_table(r2t, rows, seq_lens, 64, 8))
    assert (buf[:, 8:] == 42).all()


def test_too_narrow_or_too_long_is_rejected(rng):
    seq_lens = np.array([300, 17], np.int32)
    r2t, rows = engine_pool(rng, seq_lens, 64)
    with pytest.raises(ValueError, match="'out'"):
        msa.build_page_table(r2t, rows.astype(np.int32), seq_lens, 64, max_pages=4)
    with pytest.raises(ValueError, match="'seq_lens'"):
        msa.build_page_table(r2t, rows.astype(np.int32), np.array([601, 1], np.int32), 64)
    with pytest.raises(ValueError, match="'req_pool_indices'"):
        msa.build_page_table(r2t, np.array([0, 6], np.int32), seq_lens, 64)


@pytest.mark.parametrize("validate", [False, True])
def test_validate_is_taken(rng, validate):
    """validate= is accepted (CPU tensors are checked either way): the same table, the same refusals."""
    seq_lens = np.array([300, 17], np.int32)
    r2t, rows = engine_pool(rng, seq_lens, 64)
    pt = msa.build_page_table(r2t, rows.astype(np.int32), seq_lens, 64, validate=validate)
    np.testing.assert_array_equal(pt, ref_page_table(r2t, rows, seq_lens, 64, math.ceil(600 / 64)))
    with pytest.raises(ValueError, match="'req_pool_indices'"):
        msa.build_page_table(r2t, np.array([0, 6], np.int32), seq_lens, 64, validate=validate)
