// fp8 e4m3 K/V tiles of the Hopper prefill kernels, widened in shared memory to the 16-bit layout their
// wgmma descriptors read (docs/prefill.md, "fp8 K/V").
//
// A 16-bit K or V stage is 32 KiB: two 128B-swizzled halves of 16 KiB (dims 0-63 and 64-127), row r (a key)
// of a half at byte r * 128, its 16-byte chunk j at chunk j ^ (r % 8), as two TMA boxes of 64 elements write
// it. The fp8 tile is one TMA box of 128 keys x 128 bytes, 128B-swizzled, loaded into the stage's second
// half: its row r (fp8 chunk c = dims 16c .. 16c + 15 at chunk c ^ (r % 8)) lies exactly where row r of the
// second 16-bit half goes. Widening row r therefore overwrites fp8 row r and nothing else, so the tile is
// converted in place (no staging ring: the 16-bit rings keep the depths of the 16-bit path) once every
// chunk of the row has been read.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/arch/fp8.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/sm90.cuh"
#include "cuda/prefill_sm90/config.h"

namespace msa::detail::cuda::prefill_sm90 {

#ifdef MSA_SM90A_DEVICE

__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Widens the e4m3 tile in the second half of `stage` (a shared-window address) into the whole stage, as
// values of T, exactly. Called by the kF8ConvertThreads converter threads, ct = 0 .. kF8ConvertThreads - 1.
// Warp w takes rows 8w .. 8w + 7 of every 8 x kF8ConvertWarps rows; lane 8q + i takes row i of those 8 and
// fp8 chunks q and q + 4. A quarter warp (8 lanes, one chunk of 8 rows) then touches 8 distinct bank groups
// in every load and store: conflict-free. (The 8 chunks of one row a quarter warp would put chunks c and c + 4,
// at the same bank positions of the two 16-bit halves, into one store: 2 wavefronts.) All rows a warp reads in
// an iteration are its own, so a __syncwarp between its loads and its stores is all the in-place order needs.
template <typename T>
__device__ __forceinline__ void widen_e4m3_tile(uint32_t stage, int ct) {
  const int warp = ct >> 5, lane = ct & 31;
  const int i = lane & 7, q = lane >> 3;
  constexpr int kRowsPerIter = 8 * kF8ConvertWarps;
  // Iterations whose loads go out together: 4 x 16 B a lane in flight for bf16; fp16 (a quarter of bf16's
  // instructions between the loads and the stores) takes one, which keeps it within the converters' 40
  // registers (with two, ptxas spilled a word).
  constexpr int kUnroll = std::is_same_v<T, __half> ? 1 : 2;
  static_assert(kBlockKeys % (kRowsPerIter * kUnroll) == 0, "whole iterations");
  // fp8 chunk c of row r is at chunk c ^ i of the second half; its 16-bit elements 0-7 go to chunk
  // 2 (c % 4) ^ i and 8-15 to chunk (2 (c % 4) + 1) ^ i of half c / 4. Chunks q + 4 and 2q + 1 are the
  // addresses of chunks q and 2q with bit 6, resp. 4, flipped (the rows are 128-byte aligned).
  const uint32_t row0 = stage + (warp * 8 + i) * 128;
  const uint32_t src_lo = row0 + kHalfTileBytes + 16 * (q ^ i), src_hi = src_lo ^ 64;
  const uint32_t dst_lo0 = row0 + 16 * ((2 * q) ^ i), dst_lo1 = dst_lo0 ^ 16;
  const uint32_t dst_hi0 = dst_lo0 + kHalfTileBytes, dst_hi1 = dst_lo1 + kHalfTileBytes;
#pragma unroll 1
  for (int r = 0; r < kBlockKeys; r += kRowsPerIter * kUnroll) {
    uint4 lo[kUnroll], hi[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t off = (r + u * kRowsPerIter) * 128;
      lo[u] = arch::ld_shared_v4(src_lo + off);
      hi[u] = arch::ld_shared_v4(src_hi + off);
    }
    __syncwarp();  // every lane's reads of these rows before any lane overwrites them
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t off = (r + u * kRowsPerIter) * 128;
      uint4 a, b;
      arch::e4m3x16_to<T>(lo[u], a, b);
      st_shared_v4(dst_lo0 + off, a);
      st_shared_v4(dst_lo1 + off, b);
      arch::e4m3x16_to<T>(hi[u], a, b);
      st_shared_v4(dst_hi0 + off, a);
      st_shared_v4(dst_hi1 + off, b);
    }
  }
  // The stores are generic-proxy writes that wgmma (async proxy) reads after the caller's mbarrier arrival.
  arch::fence_proxy_async();
}

#endif  // MSA_SM90A_DEVICE

}  // namespace msa::detail::cuda::prefill_sm90
