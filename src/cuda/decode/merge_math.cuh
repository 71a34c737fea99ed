// Merging attention states over disjoint key sets by their LSEs (natural log), shared by the fused
// split merge of the paged kernel and the public merge_states kernel. Parts at lse = -inf hold no
// key and are never read (their values may be garbage); a part equal to the max gets weight exactly
// 1, so a single non-empty part passes through bit for bit (fixed-split results then do not depend
// on how many empty splits surround them).
#pragma once

#include <cmath>

#include "cuda/arch/fast_math.cuh"

namespace msa::detail::cuda::decode {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Running max over the non-empty parts; a NaN lse propagates (as in the reference).
__device__ __forceinline__ float lse_fold_max(float m, float lse) {
  if (lse == -INFINITY) return m;
  return (lse <= m) ? m : lse;
}

// exp(lse - m) for a non-empty part, exactly 1 for the max itself.
__device__ __forceinline__ float lse_weight(float lse, float m) {
  return lse == m ? 1.f : arch::exp2_approx((lse - m) * kLog2e);
}

// lse_weight with its exp2 taken unconditionally (the same bits): for the unrolled loops of the cluster
// merges, where written as lse_weight under a branch the compiler put a divergence region around
// each exp2, 16 in a row (~1800 cycles of the push merge at D-B1, token_trace).
__device__ __forceinline__ float lse_weight_eager(float lse, float m) {
  const float e = arch::exp2_approx((lse - m) * kLog2e);
  return lse == m ? 1.f : e;
}

// 1 / sum and ln(sum) of a merge's weight sum, which lies in [1, S] (the max part weighs exactly 1)
// or is NaN: there MUFU.RCP and MUFU.LG2 are within 2 ulp (no denormal, no overflow), and they leave
// out the IEEE division's and logf's range checks and slow-path calls (with the tail's divisions by S
// through the host's magic: 208 -> 102 instructions from the last MMA to the sends at D-B1, D-B1
// 6.66-6.75 -> 6.32 us on the H200). Every split merge of the paged family (workspace, cluster pull,
// cluster push) takes these, so the three stay bitwise equal.
__device__ __forceinline__ float merge_inv(float sum) { return __fdividef(1.f, sum); }
__device__ __forceinline__ float merge_log(float sum) { return __logf(sum); }

// A tile loop's row at its end, from its exp2-domain maximum m and sum l: 1 / l times the output scale, and its lse
// (natural log). A row that saw no key (l = 0) gets 0 and -inf. A row that met a NaN or an Inf among its keys has
// l NaN: its lse is NaN, so that every merge of its splits weighs it NaN and the merged row is NaN, as the reference
// is (with -inf there a merge would drop the split and return the other splits' finite rows). l >= 1 when seen (the
// running max's key adds exp2(0) = 1), so MUFU.RCP / MUFU.LG2 are within 2 ulp and the IEEE paths' range checks and
// slow-path calls are left out. The single-token kernel's 16-bit and fp8 tails both take these (the same bits).
__device__ __forceinline__ float row_out_scale(float l, float scale) { return l > 0.f ? __fdividef(1.f, l) * scale : 0.f; }
__device__ __forceinline__ float row_lse(float m, float l) { return l == 0.f ? -INFINITY : (m + __log2f(l)) * kLn2; }

}  // namespace msa::detail::cuda::decode
