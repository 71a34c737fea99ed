// fp8 K/V tiles of the paged kernels: loaded by cp.async as they lie in the cache (row-major, D bytes per
// key, K rows then V rows of the tile: half the bytes of a 16-bit tile), then converted by the whole CTA
// into the swizzled 16-bit tile the MMA loops read (16-byte chunk c of row r at byte
// 128 * (c / 8) + ((c % 8) ^ (r % 8)) * 16 of the row): K in q's type, V in fp16 (P V then runs on fp16
// MMAs whatever q's type: e4m3 -> fp16 is one instruction per pair on sm_89+, bf16 four; P in [0, 2^8]
// loses nothing in fp16). The conversion is exact (arch/fp8.cuh), so an fp8 cache costs no accuracy
// beyond its own rounding.
//
// Shared memory: the converted tile takes one 16-bit stage and the fp8 ring the rest, 2 (stages - 1)
// fp8 stages in the bytes of `stages` 16-bit ones: as many bytes in flight as the 16-bit ring, at
// twice the keys.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "cuda/arch/fp8.cuh"
#include "cuda/arch/memory.cuh"

namespace msa::detail::cuda::decode {

// The element type of an fp8 e4m3 K/V cache in the kernels' template arguments.
using E4M3 = __nv_fp8_e4m3;

template <typename KV>
inline constexpr bool kIsFp8 = std::is_same_v<KV, E4M3>;

// fp8 stages that fill the bytes of `stages16` 16-bit stages, one of which holds the converted tile.
__host__ __device__ constexpr int fp8_stages(int stages16) { return 2 * (stages16 - 1); }

// The type P V runs in: fp16 for fp8 V (see above), else q's type.
template <typename T, typename KV>
using PvType = std::conditional_t<kIsFp8<KV>, __half, T>;

// Converts the staged fp8 tile at `src` (KEYS K rows then KEYS V rows of D bytes) into the 16-bit tile
// at `dst` (KEYS K rows, then KEYS V rows, of 2 D bytes, swizzled). Every thread of the CTA takes part;
// the caller orders it between barriers (the tile landed; the previous tile's MMAs are done) and
// before the MMAs (a barrier after).
template <typename T, int D, int KEYS, int THREADS>
__device__ __forceinline__ void convert_fp8_tile(uint32_t src, uint32_t dst, int tid) {
  constexpr int kRowChunks = D / 16;  // 16-byte fp8 chunks per row
  constexpr int kChunks = 2 * KEYS * kRowChunks;
  static_assert((KEYS * kRowChunks) % THREADS == 0 && KEYS % 8 == 0, "K and V in whole passes; K and V rows share r % 8");
  constexpr uint32_t kRowBytes = D * 2;
#pragma unroll
  for (int pass = 0; pass < kChunks / THREADS; ++pass) {
    const int i = pass * THREADS + tid;
    const int r = i / kRowChunks, f = i % kRowChunks;  // rows [0, KEYS) are K, [KEYS, 2 KEYS) are V
    const uint4 raw = arch::ld_shared_v4(src + i * 16);
    uint4 lo, hi;  // 16-bit chunks 2f and 2f + 1
    if (pass < kChunks / THREADS / 2)
      arch::e4m3x16_to<T>(raw, lo, hi);
    else
      arch::e4m3x16_to<__half>(raw, lo, hi);
    // Chunk 2f (f % 8 < 4) or 2f + 1 (f % 8 >= 4) first: the 8 threads of a store phase then hit 8
    // distinct 16-byte bank groups (chunks 2f of f = 0..7 would pair up across the two 128-byte halves).
    const bool odd_first = (f & 4) != 0;
    const int c0 = 2 * f + (odd_first ? 1 : 0), c1 = c0 ^ 1;
    const uint32_t row = dst + r * kRowBytes;
    arch::st_shared_v4(row + 128 * (c0 >> 3) + (((c0 & 7) ^ (r & 7)) << 4), odd_first ? hi : lo);
    arch::st_shared_v4(row + 128 * (c1 >> 3) + (((c1 & 7) ^ (r & 7)) << 4), odd_first ? lo : hi);
  }
}

}  // namespace msa::detail::cuda::decode
