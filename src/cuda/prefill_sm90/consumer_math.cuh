// The consumer-warpgroup math shared by the Hopper prefill kernels: the two wgmma products of one
// 64-row x 128-key block, masking, the online softmax and the fragment conversions.
// A consumer thread holds rows r and r + 8 of its warpgroup's 64 (lane = 4 g + t, r = 16 warp + g).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/arch/fast_math.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/arch/sm90.cuh"
#include "cuda/arch/sm90_wgmma.cuh"
#include "cuda/prefill_sm90/config.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MSA_SM90A_DEVICE 1
#endif

namespace msa::detail::cuda::prefill_sm90 {

// The element type of Q, K, V and O.
template <bool kBf16>
using Element = std::conditional_t<kBf16, __nv_bfloat16, __half>;

#ifdef MSA_SM90A_DEVICE

// S = Q K^T over D = 128: 8 k-steps, 4 per 64-dim half (32 B apart inside a swizzle atom).
template <bool kBf16>
__device__ __forceinline__ void issue_qk(float (&sc)[64], uint32_t q_addr, uint32_t k_addr) {
  const uint32_t q_lo = arch::smem_desc_lo(q_addr, 16), k_lo = arch::smem_desc_lo(k_addr, 16);
  constexpr uint32_t hi = arch::smem_desc_hi(1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t off = (kk / 4) * kHalfTileBytes + (kk % 4) * 32;
    arch::wgmma_m64n128k16_ss<Element<kBf16>>(sc, arch::smem_desc_at(q_lo, hi, off), arch::smem_desc_at(k_lo, hi, off),
                                              kk > 0);
  }
  arch::wgmma_commit();
}

// O += P V over the block's 128 keys: 8 k-steps of 16 keys (2 KiB of V each); the two 64-dim
// halves of V are the two MN atoms of N = 128 (LBO = 16 KiB apart).
template <bool kBf16>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pf)[32], uint32_t v_addr) {
  const uint32_t v_lo = arch::smem_desc_lo(v_addr, kHalfTileBytes);
  constexpr uint32_t hi = arch::smem_desc_hi(1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    arch::wgmma_m64n128k16_rs<Element<kBf16>>(o, pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3],
                                              arch::smem_desc_at(v_lo, hi, kk * 2048));
  }
  arch::wgmma_commit();
}

// Keys at or past lim[h] (columns of this block) are invisible to row h: set to -inf (a select,
// so garbage in unused page slots never leaks into the max).
__device__ __forceinline__ void mask_scores(float (&sc)[64], const int32_t (&lim)[2], int t) {
  if (lim[0] >= kBlockKeys && lim[1] >= kBlockKeys) return;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * t + e;
      if (col >= lim[0]) sc[4 * j + e] = -INFINITY;
      if (col >= lim[1]) sc[4 * j + 2 + e] = -INFINITY;
    }
  }
}

// The logit scale of the softmax (sm_scale x log2(e)): one for every row, or one per row of a thread (h = 0, 1)
// where Q rows were scaled into fp16 by 2^e (fp8_tiles.cuh): sm_scale x log2(e) x 2^-e.
struct RowScales {
  float row[2];
};
__device__ __forceinline__ float scale_of_row(float s, int) { return s; }
__device__ __forceinline__ float scale_of_row(const RowScales& s, int h) { return s.row[h]; }

// Online softmax of one block: updates the running max m (log2 domain, scaled) and sum l (this
// thread's share of the row), turns sc into unnormalized probabilities (in [0, 1]: the running max is
// subtracted), returns the rescale factor of the previous accumulator in alpha. Scale: float or RowScales.
template <typename Scale>
__device__ __forceinline__ void softmax_block(float (&sc)[64], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                              Scale scale_log2) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(sc[4 * j], sc[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
  }
  float base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(~0u, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(~0u, mx[h], 2));
    const float m_new = fmaxf(m[h], mx[h] * scale_of_row(scale_log2, h));
    base[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
    alpha[h] = arch::exp2_approx(m[h] - base[h]);
    m[h] = m_new;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[4 * j + 2 * h] = arch::exp2_approx(fmaf(sc[4 * j + 2 * h], scale_of_row(scale_log2, h), -base[h]));
      sc[4 * j + 2 * h + 1] = arch::exp2_approx(fmaf(sc[4 * j + 2 * h + 1], scale_of_row(scale_log2, h), -base[h]));
      sum[h] += sc[4 * j + 2 * h] + sc[4 * j + 2 * h + 1];
    }
  }
  l[0] = l[0] * alpha[0] + sum[0];
  l[1] = l[1] * alpha[1] + sum[1];
}

// Accumulator layout -> A-operand registers of the PV product (see arch/sm90_wgmma.cuh).
template <bool kBf16>
__device__ __forceinline__ void scores_to_operand(const float (&sc)[64], uint32_t (&pf)[32]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pf[4 * kk + r] = arch::pack2<Element<kBf16>>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);
  }
}

__device__ __forceinline__ void rescale(float (&o)[64], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// V rows of keys at or past kv_len hold whatever the pool holds there (possibly NaN bit patterns);
// P is 0 for them, but 0 * NaN = NaN inside the MMA, so both consumer warpgroups zero those rows
// of the stage before the PV product. Only a request's last, partial block and a block of an invalid page
// (all its rows) take this path.
__device__ __forceinline__ void zero_v_rows(uint8_t* v_stage, int32_t first_row) {
  const int ct = threadIdx.x - 128;  // 0..255 over both consumer warpgroups
  const int chunks = (kBlockKeys - first_row) * 16;
  for (int c = ct; c < chunks; c += 256) {
    const int row = first_row + (c >> 4);
    *reinterpret_cast<uint4*>(v_stage + ((c >> 3) & 1) * kHalfTileBytes + row * 128 + (c & 7) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  arch::fence_proxy_async();
  arch::named_barrier_sync(kVTailBarrier, 2 * 128);
}

#endif  // MSA_SM90A_DEVICE

}  // namespace msa::detail::cuda::prefill_sm90
