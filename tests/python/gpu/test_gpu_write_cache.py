"""msa.write_cache on the GPU (contract §7): bitwise equal to the CPU backend on the same inputs, in every pool
layout (separate, sglang's slot-major view, the halves of an interleaved pool), for plain copies and e4m3 with
per-tensor and per-slot scales, on the 16-byte path and the element path (a row length or src address that is
not 16-byte aligned); poisoned storages, so that only the addressed slots may change; slot ids past the cache
skipped (refused with validate=True); and a CUDA graph replayed with slot ids and rows changed in place.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_write_cache.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import msa  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
NP = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp16": np.dtype(np.float16), "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
      "fp32": np.dtype(np.float32)}
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, "fp32": torch.float32}
POISON = 0x5A


class Storage:
    """A flat byte storage on the GPU and its CPU mirror, with the same strided views of both."""

    def __init__(self, nbytes, fill=POISON):
        nbytes = (nbytes + 15) // 16 * 16
        self.cpu = np.full(nbytes, fill, np.uint8)
        self.gpu = torch.from_numpy(self.cpu.copy()).to(DEV)

    def views(self, dtype, shape, strides, offset=0):
        """(gpu view, cpu view) of `dtype` elements: shape, strides and offset in elements."""
        npd = NP[dtype]
        c = np.lib.stride_tricks.as_strided(self.cpu.view(npd)[offset:], shape, [s * npd.itemsize for s in strides])
        g = self.gpu.view(TORCH[dtype]).as_strided(shape, strides, offset)
        return g, c

    def upload(self):
        self.gpu.copy_(torch.from_numpy(self.cpu))

    def assert_equal(self, what):
        got = self.gpu.cpu().numpy()
        diff = np.flatnonzero(got != self.cpu)
        assert diff.size == 0, f"{what}: {diff.size} bytes differ from the CPU backend, first at byte {diff[0]}: " \
                               f"GPU 0x{got[diff[0]]:02x}, CPU 0x{self.cpu[diff[0]]:02x}"


def cache_layout(layout, pages, H, P, D, half=0):
    """(numel of the pool, strides, offset) of a [pages, H, P, D] cache view in elements."""
    if layout == "separate":
        return pages * H * P * D, (H * P * D, P * D, D, 1), 0
    if layout == "slot_major":  # sglang's [slots, H, D] pool
        return pages * P * H * D, (P * H * D, D, H * D, 1), 0
    return pages * H * P * 2 * D, (H * P * 2 * D, P * 2 * D, 2 * D, 1), half * D  # [pages, H, P, 2D]


class Src:
    """src [n, H, D] rows with a padded token stride (and an optional element offset: unaligned)."""

    def __init__(self, dtype, n, H, D, offset=0):
        self.dtype, self.n, self.H, self.D, self.offset = dtype, n, H, D, offset
        self.pitch = D + 8
        self.store = Storage((offset + n * H * self.pitch) * NP[dtype].itemsize)
        self.g, self.c = self.store.views(dtype, (n, H, D), (H * self.pitch, self.pitch, 1), offset)

    def fill(self, rng, spread=20.0, specials=True):
        x = (rng.standard_normal((self.n, self.H, self.D)) * spread).astype(np.float32)
        if specials and x.size >= 12:
            flat = x.reshape(-1)
            flat[rng.choice(flat.size, 12, replace=False)] = [np.nan, -np.nan, np.inf, -np.inf, 1e4, -1e4, 0.0, -0.0,
                                                              1e-6, -3e-3, 464.0, 500.0]
        if x.shape[0] > 3:
            x[3] = 0.0  # an all-zero row (per-slot scale 1)
        self.c[...] = x.astype(NP[self.dtype])
        self.store.upload()


def slot_ids(rng, n, capacity, dtype=np.int32, out_of_range=False):
    """n distinct slots in shuffled order, every 5th negative; out_of_range: a few >= capacity too."""
    s = rng.permutation(capacity)[:n].astype(np.int64)
    s[4::5] = -1 - np.arange(len(s[4::5]))
    if out_of_range and n > 8:
        s[[2, 8]] = [capacity, capacity + 12345]
    return s.astype(dtype)


def write_both(src, cache, ids, scale=None, slot_scale=None):
    """msa.write_cache on the GPU views and on the CPU mirrors (ids past the cache: -1 for the CPU, which
    refuses them; the GPU skips them)."""
    g_ids = torch.from_numpy(np.ascontiguousarray(ids)).to(DEV)
    msa.write_cache(src.g, cache[0], g_ids, scale=scale, slot_scale=None if slot_scale is None else slot_scale[0])
    capacity = cache[1].shape[0] * cache[1].shape[2]
    c_ids = np.where(ids >= capacity, -1, ids).astype(ids.dtype)
    msa.write_cache(src.c, cache[1], c_ids, scale=scale, slot_scale=None if slot_scale is None else slot_scale[1])
    torch.cuda.synchronize()


MODES = ["copy", "fp8_tensor", "fp8_slot"]


def make_cache(mode, dtype, layout, pages, H, P, D):
    """(storage, [views of each half], scale storage, scale views) for one mode."""
    cdt = dtype if mode == "copy" else "fp8"
    numel, strides, _ = cache_layout(layout, pages, H, P, D)
    store = Storage(numel * NP[cdt].itemsize)
    halves = 2 if layout == "interleaved" else 1
    views = [store.views(cdt, (pages, H, P, D), strides, cache_layout(layout, pages, H, P, D, h)[2])
             for h in range(halves)]
    sstore, sviews = None, [None] * halves
    if mode == "fp8_slot":
        sstore = Storage(halves * pages * H * (P + 3) * 4)
        sviews = [sstore.views("fp32", (pages, H, P), (H * (P + 3), P + 3, 1), h * pages * H * (P + 3))
                  for h in range(halves)]
    return store, views, sstore, sviews


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["separate", "slot_major", "interleaved"])
@pytest.mark.parametrize("D,src_offset", [(128, 0), (64, 0), (256, 0), (40, 0), (128, 1)])
def test_bitwise_equal_to_cpu(rng, dtype, mode, layout, D, src_offset):
    pages, H, P, n = 9, 2, 16, 97
    store, views, sstore, sviews = make_cache(mode, dtype, layout, pages, H, P, D)
    for half, (cache, sv) in enumerate(zip(views, sviews)):
        src = Src(dtype, n, H, D, src_offset)
        src.fill(rng, spread=3.0 if mode == "fp8_slot" else 20.0)
        ids = slot_ids(rng, n, pages * P, np.int64 if half else np.int32, out_of_range=True)
        write_both(src, cache, ids, scale=0.25 if mode == "fp8_tensor" else None, slot_scale=sv)
    store.assert_equal("cache")
    if sstore is not None:
        sstore.assert_equal("slot_scale")


@pytest.mark.parametrize("mode", MODES)
def test_many_rows(rng, mode):
    """More rows than one pass of the grid (the kernels' grid-stride loops)."""
    pages, H, P, D, n = 2600, 8, 16, 128, 40000
    store, (cache,), sstore, (sv,) = make_cache(mode, "bf16", "slot_major", pages, H, P, D)
    src = Src("bf16", n, H, D)
    src.fill(rng, spread=3.0)
    write_both(src, cache, slot_ids(rng, n, pages * P), scale=0.5 if mode == "fp8_tensor" else None, slot_scale=sv)
    store.assert_equal("cache")
    if sstore is not None:
        sstore.assert_equal("slot_scale")


def test_out_of_range_slots_refused_with_validate(rng):
    pages, H, P, D, n = 3, 1, 16, 64, 12
    store, (cache,), _, _ = make_cache("copy", "bf16", "separate", pages, H, P, D)
    src = Src("bf16", n, H, D)
    src.fill(rng)
    ids = slot_ids(rng, n, pages * P, out_of_range=True)
    with pytest.raises(ValueError, match=r"msa.write_cache: argument 'slot_ids': entry 2: .*\[0, 48\).*got 48"):
        msa.write_cache(src.g, cache[0], torch.from_numpy(ids).to(DEV), validate=True)
    torch.cuda.synchronize()
    store.assert_equal("cache after a refused call")  # nothing written


def test_scale_on_the_device_is_refused(rng):
    _, (cache,), _, _ = make_cache("fp8_tensor", "bf16", "separate", 2, 1, 16, 64)
    src = Src("bf16", 4, 1, 64)
    with pytest.raises(TypeError, match="'scale': expected a host number"):
        msa.write_cache(src.g, cache[0], torch.zeros(4, dtype=torch.int32, device=DEV),
                        scale=torch.tensor(2.0, device=DEV))


def test_cuda_graph_replays_with_new_slots(rng):
    """One captured graph writes K and V (fp8, per-tensor scales) into the halves of an interleaved pool, a
    bf16 copy into a slot-major pool and the index keys (fp8, per-slot scales); the slot ids and the rows are
    rewritten in place between replays (with negative ids, and ids past the cache on every other replay)."""
    pages, H, P, D, Di, n = 40, 2, 16, 128, 128, 64
    kv_store, (k_view, v_view), _, _ = make_cache("fp8_tensor", "bf16", "interleaved", pages, H, P, D)
    bf_store, (bf_view,), _, _ = make_cache("copy", "bf16", "slot_major", pages, H, P, D)
    ik_store, (ik_view,), ks_store, (ks_view,) = make_cache("fp8_slot", "bf16", "slot_major", pages, 1, P, Di)
    k_src, v_src, ik_src = Src("bf16", n, H, D), Src("bf16", n, H, D), Src("bf16", n, 1, Di)
    ids_g = torch.zeros(n, dtype=torch.int64, device=DEV)
    k_scale, v_scale = 0.125, 0.5

    def step(side):  # side 0: the GPU views, 1: the CPU mirrors
        ids = ids_g if side == 0 else c_ids
        msa.write_cache((k_src.g, k_src.c)[side], k_view[side], ids, scale=k_scale)
        msa.write_cache((v_src.g, v_src.c)[side], v_view[side], ids, scale=v_scale)
        msa.write_cache((v_src.g, v_src.c)[side], bf_view[side], ids)
        msa.write_cache((ik_src.g, ik_src.c)[side], ik_view[side], ids, slot_scale=ks_view[side])

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(0)  # warm-up outside the capture (every row to slot 0): mirrored below
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    stores = ((kv_store, "K/V"), (bf_store, "bf16 copy"), (ik_store, "index K"), (ks_store, "index K scales"))
    for s, _ in stores:
        s.cpu[...] = s.gpu.cpu().numpy()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(0)
    capacity = pages * P
    for replay in range(6):
        for src in (k_src, v_src, ik_src):
            src.fill(rng, spread=3.0)
        ids = slot_ids(rng, n, capacity, np.int64, out_of_range=replay % 2 == 1)
        ids_g.copy_(torch.from_numpy(ids))
        graph.replay()
        torch.cuda.synchronize()
        c_ids = np.where(ids >= capacity, -1, ids)
        step(1)
        for s, what in stores:
            s.assert_equal(f"replay {replay}: {what}")
