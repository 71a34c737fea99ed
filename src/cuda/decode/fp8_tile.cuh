// fp8 K/V tiles of the paged kernels. The general kernel loads them by cp.async as they lie in the cache
// (row-major, D bytes per key, K rows then V rows: half the bytes of a 16-bit tile) and converts them with
// the whole CTA into the swizzled 16-bit tile its MMA loops read (16-byte chunk c of row r at byte
// 128 * (c / 8) + ((c % 8) ^ (r % 8)) * 16 of the row): K in q's type, V in fp16 (P V then runs on fp16
// MMAs whatever q's type: e4m3 -> fp16 is one instruction per pair on sm_89+, bf16 four; P in [0, 2^8]
// loses nothing in fp16). The single-token kernel converts neither: its K fragments (below) and its V
// fragments (token_fp8_loop.cuh) come straight from the fp8 rows. Every conversion is exact (arch/fp8.cuh),
// so an fp8 cache costs no accuracy beyond its own rounding.
//
// Shared memory of the general kernel: the converted tile takes one 16-bit stage and the fp8 ring the rest,
// 2 (stages - 1) fp8 stages in the bytes of `stages` 16-bit ones. While a tile is consumed, 2 stages - 3 fp8
// tiles are in flight against the 16-bit ring's stages - 1 (3 stages: three tiles of half the bytes against
// two), half a 16-bit stage's bytes less.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "cuda/arch/fp8.cuh"
#include "cuda/arch/sm80.cuh"
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

// ROWS staged fp8 rows (D bytes each, row-major) -> 16-bit rows of U (2 D bytes, swizzled), by the whole CTA
// in two halves: load_fp8_rows reads this thread's chunks into registers, store_fp8_rows_as converts and
// stores them. Split so that a caller can issue the loads early (shared-memory accesses are volatile asm:
// the compiler keeps them in program order, so a load after a store waits for it). The caller orders both
// between barriers (the rows landed; the previous reads of `dst` are done) and the stores before the MMAs
// that read `dst` (a barrier between).
template <int D, int ROWS, int THREADS>
struct Fp8Rows {
  static constexpr int kRowChunks = D / 16;  // 16-byte fp8 chunks per row
  static constexpr int kPasses = ROWS * kRowChunks / THREADS;
  static_assert((ROWS * kRowChunks) % THREADS == 0, "whole passes");
  uint4 raw[kPasses];
};

template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_fp8_rows(uint32_t src, int tid, Fp8Rows<D, ROWS, THREADS>& r) {
#pragma unroll
  for (int pass = 0; pass < r.kPasses; ++pass) r.raw[pass] = arch::ld_shared_v4(src + (pass * THREADS + tid) * 16);
}

// The stored values are the e4m3 values / arch::e4m3_f16_unscale() (exact; 2^-8 below sm_89 code, where that saves
// a multiply per pair): the caller folds the factor into its logit and output scales. Below sm_89 code the
// thread's chunks are widened first and checked for the NaN encoding at once (one HMNMX2 per word,
// arch::e4m3_raw_abs_max), the per-word fix running only for a thread whose bytes hold a NaN.
template <typename U, int D, int ROWS, int THREADS>
__device__ __forceinline__ void store_fp8_rows_as(uint32_t dst, int tid, const Fp8Rows<D, ROWS, THREADS>& r) {
  constexpr uint32_t kRowBytes = D * 2;
  constexpr int kPasses = Fp8Rows<D, ROWS, THREADS>::kPasses;
  // Chunks 2f (lo) and 2f + 1 (hi) of pass `pass`'s row. Chunk 2f (f % 8 < 4) or 2f + 1 (f % 8 >= 4) first: the
  // 8 threads of a store phase then hit 8 distinct 16-byte bank groups (chunks 2f of f = 0..7 would pair up
  // across the two 128-byte halves).
  const auto store = [&](int pass, const uint4& lo, const uint4& hi) {
    const int i = pass * THREADS + tid;
    const int row = i / r.kRowChunks, f = i % r.kRowChunks;
    const bool odd_first = (f & 4) != 0;
    const int c0 = 2 * f + (odd_first ? 1 : 0), c1 = c0 ^ 1;
    const uint32_t at = dst + row * kRowBytes;
    arch::st_shared_v4(at + 128 * (c0 >> 3) + (((c0 & 7) ^ (row & 7)) << 4), odd_first ? hi : lo);
    arch::st_shared_v4(at + 128 * (c1 >> 3) + (((c1 & 7) ^ (row & 7)) << 4), odd_first ? lo : hi);
  };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    uint4 lo, hi;
    arch::e4m3x16_to<U>(r.raw[pass], lo, hi);
    store(pass, lo, hi);
  }
#else
  uint4 wide[kPasses][2];  // the f16x2 words of arch::e4m3x4_to_f16x4_unchecked
  uint32_t amax = 0u;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    arch::e4m3x16_to_f16_unchecked(r.raw[pass], wide[pass][0], wide[pass][1]);
    amax = arch::e4m3_raw_abs_max(arch::e4m3_raw_abs_max(amax, wide[pass][0]), wide[pass][1]);
  }
  if (arch::e4m3_raw_has_nan(amax)) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
      wide[pass][0] = arch::e4m3_raw_nan_fix(wide[pass][0]), wide[pass][1] = arch::e4m3_raw_nan_fix(wide[pass][1]);
  }
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass)
    store(pass, arch::f16x8_raw_as<U>(wide[pass][0]), arch::f16x8_raw_as<U>(wide[pass][1]));
#endif
}

// ---- K fragments straight from fp8 rows (the single-token kernel) ---------------------------------------
// S = Q K^T sums over the head dims in any order, so Q and K may both take a permuted dim order. In this
// one, thread (g = lane / 4, t = lane % 4) of an m16n8k16 feeds, at k-step kk, the dims 32t + 4kk + {0, 1}
// (its k positions 2t, 2t + 1) and 32t + 4kk + {2, 3} (positions 2t + 8, 2t + 9): over the 8 k-steps of
// D = 128 a thread meets dims [32t, 32t + 32) of its key row, 32 contiguous fp8 bytes, two 16-byte loads,
// each 4-byte word one k-step's B fragment after one e4m3 -> fp16 instruction per pair. K never goes
// through a converted copy in shared memory (no stores, no barrier). K rows land with their 16-byte chunks
// swizzled (chunk c of row r at (c ^ (r % 8)) * 16), so a quarter-warp's loads (rows g, g + 1, chunks 2t or
// 2t + 1) hit 8 distinct bank groups.
// Q meets fp16 K in fp16: a bf16 row is brought into fp16 range by 2^e (arch::fp16_row_exponent, exact) and
// its logits are multiplied by 2^-e; an fp16 row is used as it is.

// The A fragments of 16 Q rows (rows g and g + 8 of this thread) in that dim order, from the 16-bit Q tile
// at s_q (rows of 256 bytes, 16-byte chunk c at (c ^ (r % 8)) * 16), in fp16; unscale[j] = 2^-e of row
// g + 8j (1 for fp16 q).
template <typename T>
__device__ __forceinline__ void q_fragments_dim_permuted(uint32_t s_q, int lane, uint32_t (&qa)[8][4],
                                                         float (&unscale)[2]) {
  const int g = lane >> 2, t = lane & 3;
  uint4 c[2][4];  // row g + 8j, dims 32t + 8u .. + 7
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = g + 8 * j;
#pragma unroll
    for (int u = 0; u < 4; ++u) c[j][u] = arch::ld_shared_v4(s_q + r * 256 + (((4 * t + u) ^ (r & 7)) << 4));
    unscale[j] = 1.f;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      float amax = 0.f;
#pragma unroll
      for (int u = 0; u < 4; ++u) amax = fmaxf(amax, arch::chunk_amax<T>(c[j][u]));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));  // the row's 4 threads
      const int e = arch::fp16_row_exponent(amax);
#pragma unroll
      for (int u = 0; u < 4; ++u) c[j][u] = arch::chunk_to_scaled_f16<T>(c[j][u], arch::exp2_int(e));
      unscale[j] = arch::exp2_int(-e);
    }
  }
  const auto word = [](const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; };
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const int u = kk >> 1, w = 2 * (kk & 1);
    qa[kk][0] = word(c[0][u], w);
    qa[kk][1] = word(c[1][u], w);
    qa[kk][2] = word(c[0][u], w + 1);
    qa[kk][3] = word(c[1][u], w + 1);
  }
}

// One key row's fp8 bytes for k_fragment_fp8_unchecked: the row at `row` (128 bytes, chunks swizzled by r7 = row % 8),
// dims [32t, 32t + 32) as two 16-byte loads.
struct KRowFp8 {
  uint4 c[2];
};
__device__ __forceinline__ KRowFp8 load_k_row_fp8(uint32_t row, int t, int r7) {
  return {{arch::ld_shared_v4(row + (((2 * t) ^ r7) << 4)), arch::ld_shared_v4(row + (((2 * t + 1) ^ r7) << 4))}};
}
// k-step kk's B fragment (b0, b1) of such a row, in fp16 (each value the e4m3 value / arch::e4m3_f16_unscale()),
// without the NaN step below sm_89 code (arch::e4m3_raw_abs_max: the caller checks a tile's words at once).
__device__ __forceinline__ uint2 k_fragment_fp8_unchecked(const KRowFp8& k, int kk) {
  const uint4& c = k.c[kk >> 2];
  const int w = kk & 3;
  return arch::e4m3x4_to_f16x4_unchecked(w == 0 ? c.x : w == 1 ? c.y : w == 2 ? c.z : c.w);
}

}  // namespace msa::detail::cuda::decode
