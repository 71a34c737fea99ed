// fp8 e4m3 K/V tiles of the Hopper prefill kernels, widened in shared memory to the 16-bit layout their
// wgmma descriptors read, and the query-major kernel's bf16 Q rows rescaled into fp16 in place for its fp16
// products (docs/prefill.md, "fp8 K/V").
//
// A 16-bit K or V stage is 32 KiB: two 128B-swizzled halves of 16 KiB (dims 0-63 and 64-127), row r (a key)
// of a half at byte r * 128, its 16-byte chunk j at chunk j ^ (r % 8), as two TMA boxes of 64 elements write
// it. The fp8 tile is one TMA box of 128 keys x 128 bytes, 128B-swizzled, loaded into the stage's second
// half: its row r (fp8 chunk c = dims 16c .. 16c + 15 at chunk c ^ (r % 8)) lies exactly where row r of the
// second 16-bit half goes. Widening row r therefore overwrites fp8 row r and nothing else, so the tile is
// converted in place (no staging ring: the 16-bit rings keep the depths of the 16-bit path) once every
// chunk of the row has been read.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// bf16 q against fp8 K/V (query-major kernel): K and V are widened to fp16 (one instruction a pair, against four
// into bf16) and both products run on fp16 wgmma, so Q must be fp16 too. A consumer warp brings its own 16 rows of
// a Q tile (its MMA rows) into fp16 in place, each row scaled by 2^e (arch/fp8.cuh, fp16_row_exponent): the row's
// amax x 2^e lies in [2^14, 2^15), so the row's 8 significant bits survive (elements below amax x 2^-28 become
// fp16 subnormals: a relative effect under 2^-20 on the row's products); a row of zeros takes e = 0. The caller
// multiplies the row's logits by 2^-e (unscale[h], for row g + 8h of the warp's 16, lane = 4 g + t): the fp32
// logits are then those of the bf16 values, the products in the MMA being scaled by 2^e exactly.
//
// `rows`: the shared address of the warp's first row in the first 64-dim half (its row index a multiple of 8, so
// row g + 8h has the swizzle phase g). Lane 4g + t takes rows g and g + 8, chunks t and t + 4 of both halves, so
// that the 4 lanes of a row reduce its amax as the softmax reduces its row max; rows with g odd take chunk t + 4
// first, so that a quarter warp's two rows (g = 2a, 2a + 1) hit complementary bank groups in every load and store.
// Each lane rewrites only the chunks it read. Ends with the proxy fence: wgmma reads the rows after the warpgroup's
// next barrier.
__device__ __forceinline__ void q_rows_to_scaled_f16(uint32_t rows, int lane, float (&unscale)[2]) {
  const int g = lane >> 2, t = lane & 3;
  const uint32_t first = rows + g * 128 + 16 * ((t + 4 * (g & 1)) ^ g);  // chunk t or t + 4 (bit 6 flips it)
  uint4 x[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int c = 0; c < 4; ++c)
      x[h][c] = arch::ld_shared_v4((first ^ (64 * (c & 1))) + h * 8 * 128 + (c >> 1) * kHalfTileBytes);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t acc = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      acc = arch::bf16x2_abs_max(acc, x[h][c].x);
      acc = arch::bf16x2_abs_max(acc, x[h][c].y);
      acc = arch::bf16x2_abs_max(acc, x[h][c].z);
      acc = arch::bf16x2_abs_max(acc, x[h][c].w);
    }
    acc = __vmaxu2(acc, __shfl_xor_sync(~0u, acc, 1));
    acc = __vmaxu2(acc, __shfl_xor_sync(~0u, acc, 2));
    const float amax = arch::bf16x2_max_value(acc);
    const int e = amax > 0.f ? arch::fp16_row_exponent(amax) : 0;
    const float scale = arch::exp2_int(e);
    unscale[h] = arch::exp2_int(-e);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint4& v = x[h][c];
      st_shared_v4((first ^ (64 * (c & 1))) + h * 8 * 128 + (c >> 1) * kHalfTileBytes,
                   make_uint4(arch::bf16x2_to_scaled_f16x2(v.x, scale), arch::bf16x2_to_scaled_f16x2(v.y, scale),
                              arch::bf16x2_to_scaled_f16x2(v.z, scale), arch::bf16x2_to_scaled_f16x2(v.w, scale)));
    }
  }
  arch::fence_proxy_async();
}

#endif  // MSA_SM90A_DEVICE

}  // namespace msa::detail::cuda::prefill_sm90
