"""msa.write_cache on the CPU backend (contract §7): rows into paged caches of every pool layout at slots in any
order, negative slots skipped, plain copies and e4m3 quantization bitwise against ml_dtypes' rounding, per-tensor
and per-slot scales, index keys that block_scores scores as their dequantized values, and the errors."""
import numpy as np
import pytest

import msa

ml_dtypes = pytest.importorskip("ml_dtypes")
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
DTYPES = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32)}
POISON = 0x5A


def bits(a):
    """The raw bytes of an array's elements as unsigned integers of their width."""
    return np.ascontiguousarray(a).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def make_pool(layout, pages, H, P, D, dtype):
    """Poisoned storage and the [pages, H, P, D] view(s) of it msa writes: 'separate' (one pool per cache),
    'slot_major' (sglang's [slots, H, D]), 'interleaved' (K and V halves of one [pages, H, P, 2D] pool)."""
    if layout == "separate":
        store = np.empty((pages, H, P, D), dtype)
        views = [store]
    elif layout == "slot_major":
        store = np.empty((pages * P, H, D), dtype)
        views = [store.reshape(pages, P, H, D).transpose(0, 2, 1, 3)]
    else:
        store = np.empty((pages, H, P, 2 * D), dtype)
        views = [store[..., :D], store[..., D:]]
    store.view(np.uint8).fill(POISON)
    return store, views


def make_src(rng, n, H, D, dtype, spread=30.0, specials=True):
    """src [n, H, D] with a padded token stride, normal values and, optionally, specials (NaN, +-inf, huge,
    tiny, signed zeros)."""
    x = (rng.standard_normal((n, H, D + 8)) * spread).astype(np.float32)
    if specials and n:
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=12, replace=False)
        flat[picks] = [np.nan, -np.nan, np.inf, -np.inf, 1e4, -1e4, 0.0, -0.0, 1e-6, -3e-3, 464.0, 500.0]
    return x.astype(DTYPES[dtype])[:, :, :D]


def slot_ids(rng, n, capacity, dtype=np.int32, pad_every=5):
    """n distinct slots in shuffled order; every pad_every-th entry negative (padding)."""
    s = rng.permutation(capacity)[:n].astype(np.int64)
    s[pad_every - 1::pad_every] = -1 - np.arange(len(s[pad_every - 1::pad_every]))
    return s.astype(dtype)


def ref_e4m3(x, scale):
    """The writer's e4m3 bytes of x / scale: fp32 division, saturated to +-448 (infinities too), rounded to
    nearest even by ml_dtypes, NaN as 0x7f."""
    q = np.asarray(x, np.float32) / np.float32(scale)
    out = np.clip(q, -448.0, 448.0).astype(E4M3).view(np.uint8).copy()
    out[np.isnan(q)] = 0x7F
    return out


def ref_row_scales(x):
    """Per-row scales: amax of the finite |x| / 448 (in fp32), 1 where that is 0."""
    a = np.abs(np.asarray(x, np.float32))
    amax = np.where(np.isfinite(a), a, 0).max(axis=-1).astype(np.float32)
    s = (amax / np.float32(448.0)).astype(np.float32)
    return np.where(s > 0, s, np.float32(1.0)).astype(np.float32)


def expected_cache(before, src, slots, P, convert):
    """The cache `before` with row (i, h) of src converted (convert(rows) -> bytes of the cache dtype)
    at the slots that are not negative."""
    out = bits(before).copy()
    for i, s in enumerate(slots):
        if s >= 0:
            out[s // P, :, s % P, :] = convert(src[i])
    return out


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("layout", ["separate", "slot_major", "interleaved"])
def test_plain_copy(rng, dtype, layout):
    pages, H, P, D, n = 6, 2, 16, 64, 41
    _, views = make_pool(layout, pages, H, P, D, DTYPES[dtype])
    want = []
    for v in views:  # the interleaved pool's K half, then its V half
        before = v.copy()
        src = make_src(rng, n, H, D, dtype)
        slots = slot_ids(rng, n, pages * P, np.int64 if layout == "slot_major" else np.int32)
        assert msa.write_cache(src, v, slots) is None
        want.append(expected_cache(before, src, slots, P, bits))
    for v, w in zip(views, want):
        np.testing.assert_array_equal(bits(v), w)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("layout", ["separate", "slot_major", "interleaved"])
@pytest.mark.parametrize("D", [128, 40])
def test_fp8_per_tensor_scale(rng, dtype, layout, D):
    pages, H, P, n = 5, 2, 16, 53
    _, views = make_pool(layout, pages, H, P, D, E4M3)
    want = []
    for v, scale in zip(views, (0.3, 2.5)):
        before = v.copy()
        src = make_src(rng, n, H, D, dtype)
        slots = slot_ids(rng, n, pages * P)
        msa.write_cache(src, v, slots, scale=scale)
        want.append(expected_cache(before, src, slots, P, lambda r, s=scale: ref_e4m3(r, s)))
    for v, w in zip(views, want):
        np.testing.assert_array_equal(bits(v), w)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("layout", ["separate", "slot_major"])
def test_fp8_per_slot_scales(rng, dtype, layout):
    pages, H, P, D, n = 4, 1, 64, 128, 150
    _, (cache,) = make_pool(layout, pages, H, P, D, E4M3)
    scales_store = np.full((pages, H, P + 3), -7.0, np.float32)
    scales = scales_store[..., :P]
    before = cache.copy()
    src = make_src(rng, n, H, D, dtype, spread=3.0)
    src[7] = 0  # an all-zero row: scale 1
    slots = slot_ids(rng, n, pages * P)
    msa.write_cache(src, cache, slots, slot_scale=scales)
    row_scales = ref_row_scales(src)  # [n, H]
    want_scales = np.full_like(scales, -7.0)
    for i, s in enumerate(slots):
        if s >= 0:
            want_scales[s // P, :, s % P] = row_scales[i]
    np.testing.assert_array_equal(scales, want_scales)
    assert (scales_store[..., P:] == -7.0).all()
    if slots[7] >= 0:
        assert (scales[slots[7] // P, :, slots[7] % P] == 1.0).all()
    want = bits(before).copy()
    for i, s in enumerate(slots):
        if s >= 0:
            for h in range(H):
                want[s // P, h, s % P] = ref_e4m3(src[i, h], row_scales[i, h])
    np.testing.assert_array_equal(bits(cache), want)


def test_saturation_nan_and_rounding():
    vals = np.array([448, 464, 500, -1e30, np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 2.0**-10, 3 * 2.0**-10,
                     -(2.0**-12), 1.0625, 1.1875, 240, 248], np.float32)
    want = np.array([0x7E, 0x7E, 0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7F, 0x00, 0x80, 0x00, 0x02, 0x80, 0x38, 0x3A,
                     0x77, 0x78], np.uint8)
    cache = np.zeros((1, 1, 2, len(vals)), E4M3)
    msa.write_cache(vals.reshape(1, 1, -1), cache, np.array([1], np.int32), scale=1.0)
    np.testing.assert_array_equal(cache.view(np.uint8)[0, 0, 1], want)
    assert (cache.view(np.uint8)[0, 0, 0] == 0).all()
    # The finite values agree with ml_dtypes where it does not overflow to NaN (|x| < 464).
    finite = np.abs(vals) < 464
    np.testing.assert_array_equal(want[finite], vals[finite].astype(E4M3).view(np.uint8))


def test_index_keys_score_as_their_dequantized_values(rng):
    """Keys written with per-slot scales score in block_scores' fp8 path exactly as the fp32 keys
    e4m3 value x scale do."""
    T, H, Hk, D, P, pages, kv = 3, 4, 1, 128, 64, 7, 300
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    keys = (rng.standard_normal((kv, Hk, D)) * rng.uniform(0.1, 20, (kv, 1, 1))).astype(DTYPES["bf16"])
    page_of = rng.permutation(pages)[:5].astype(np.int32)
    slots = (page_of[np.arange(kv) // P] * P + np.arange(kv) % P).astype(np.int32)
    k8 = np.zeros((pages * P, Hk, D), E4M3).reshape(pages, P, Hk, D).transpose(0, 2, 1, 3)
    ks = np.zeros((pages, Hk, P), np.float32)
    msa.write_cache(keys, k8, slots, slot_scale=ks)
    k32 = (k8.astype(np.float32) * ks[..., None]).astype(np.float32)
    table = page_of.reshape(1, -1)
    args = (table, np.array([0, T], np.int32), np.array([kv], np.int32))
    s8 = msa.block_scores(q, k8, *args, k_scale=ks, layout="THK")
    s32 = msa.block_scores(q, np.ascontiguousarray(k32), *args, layout="THK")
    np.testing.assert_array_equal(s8, s32)
    # and the dequantized keys are the source keys to e4m3's precision (relative 2^-4 of the row's amax)
    deq = k32[page_of[np.arange(kv) // P], :, np.arange(kv) % P]
    src = keys.astype(np.float32)
    amax = np.abs(src).max(axis=-1, keepdims=True)
    assert (np.abs(deq - src) <= amax * 2.0**-4).all()


def test_duplicate_slot_keeps_the_last_row_on_the_cpu():
    src = np.arange(3 * 8, dtype=np.float32).reshape(3, 1, 8)
    cache = np.zeros((1, 1, 4, 8), np.float32)
    msa.write_cache(src, cache, np.array([2, 2, -1], np.int64))
    np.testing.assert_array_equal(cache[0, 0, 2], src[1, 0])


def test_errors(rng):
    src = make_src(rng, 2, 2, 16, "bf16", specials=False)
    bf = np.zeros((2, 2, 4, 16), DTYPES["bf16"])
    f8 = np.zeros((2, 2, 4, 16), E4M3)
    ok = np.array([0, 7], np.int32)
    with pytest.raises(ValueError, match=r"msa.write_cache: argument 'slot_ids': entry 1: .*\[0, 8\).*got 8"):
        msa.write_cache(src, bf, np.array([3, 8], np.int32))
    with pytest.raises(ValueError, match=r"entry 0: .*got 123456789012"):
        msa.write_cache(src, bf, np.array([123456789012, -1], np.int64))
    with pytest.raises(TypeError, match="'cache': expected dtype bfloat16 or float8_e4m3fn"):
        msa.write_cache(src, np.zeros((2, 2, 4, 16), np.float16), ok)
    with pytest.raises(TypeError, match="'slot_ids': expected dtype int32 or int64"):
        msa.write_cache(src, bf, ok.astype(np.int16))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="'scale': expected a finite number > 0"):
            msa.write_cache(src, f8, ok, scale=bad)
    with pytest.raises(TypeError, match="'scale'"):
        msa.write_cache(src, f8, ok, scale="2")
    with pytest.raises(TypeError, match="'scale'"):
        msa.write_cache(src, f8, ok, scale=True)
    with pytest.raises(ValueError, match="'scale': only used with a float8_e4m3fn cache"):
        msa.write_cache(src, bf, ok, scale=2.0)
    with pytest.raises(ValueError, match="'slot_scale': only used with a float8_e4m3fn cache"):
        msa.write_cache(src, bf, ok, slot_scale=np.zeros((2, 2, 4), np.float32))
    with pytest.raises(ValueError, match="'scale' and 'slot_scale'"):
        msa.write_cache(src, f8, ok, scale=2.0, slot_scale=np.zeros((2, 2, 4), np.float32))
    with pytest.raises(ValueError, match=r"'slot_scale': expected shape\[2\] \(page_size\) = 4, got 3"):
        msa.write_cache(src, f8, ok, slot_scale=np.zeros((2, 2, 3), np.float32))
    with pytest.raises(TypeError, match="'slot_scale': expected dtype float32"):
        msa.write_cache(src, f8, ok, slot_scale=np.zeros((2, 2, 4), np.float64))
    with pytest.raises(ValueError, match=r"'slot_ids': expected shape\[0\] \(num_tokens, as src\) = 2, got 3"):
        msa.write_cache(src, bf, np.array([0, 1, 2], np.int32))
    with pytest.raises(ValueError, match=r"'cache': expected shape\[3\] \(head_dim, as src\) = 16, got 8"):
        msa.write_cache(src, bf[..., :8], ok)
    with pytest.raises(ValueError, match="'cache': expected the innermost dimension contiguous"):
        msa.write_cache(src[..., :8], np.zeros((2, 2, 4, 16), DTYPES["bf16"])[..., ::2], ok)
    ro = np.zeros((2, 2, 4, 16), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="'cache': expected a writable tensor"):
        msa.write_cache(src.astype(np.float32), ro, ok)
    # nothing was written by the refused calls
    assert not bits(bf).any() and not bits(f8).any()
