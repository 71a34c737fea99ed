// The second level of the single-token kernel's two-level merge (dense plans of S = parts x C splits in clusters of
// C = 16, 8 or 4: plan_token_dense_splits in plan.cu). Each cluster has push-merged its rows (cluster rank k owns rows k,
// k + C, ...) and written them, with their lse, to the workspace as partial `part` of the item. The item's `parts`
// CTAs of rank k count their arrivals on rank k's own counter, and the last to arrive merges those rows over the
// parts: the final merge is spread over the C ranks instead of left to one CTA (the general kernel's last-CTA merge
// of every part), and no CTA waits for another (clusters that do not fit at once run later, correctly).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/decode/merge_math.cuh"
#include "cuda/decode/token_config.h"

namespace msa::detail::cuda::decode {

// Called by every thread of the CTA after its partial rows are written (part_o: the item's [parts][16][D] fp32
// rows, part_lse: [parts][16]). Returns after the rank's last CTA has merged its `owned` rows rank + jC; emit(r, col,
// acc[1], lse) writes value col of row r (and lse with col 0). `flag`: a shared int of this CTA.
template <int D, typename Emit>
__device__ __forceinline__ void merge_parts(const float* part_o, const float* part_lse, uint32_t* counter, int parts,
                                            int rank, int C, int owned, int* flag, const Emit& emit) {
  __syncthreads();  // this CTA's partial rows are written
  if (threadIdx.x == 0) {  // release this CTA's rows, count them; acquire the others' (their writer did the same)
    __threadfence();
    const unsigned arrived = atomicAdd(counter, 1u);
    __threadfence();
    *flag = arrived == static_cast<unsigned>(parts - 1);
  }
  __syncthreads();
  if (*flag == 0) return;
  // merge_splits' arithmetic (split_merge.cuh): the max lse, weights exp(lse - max), their sum, in part order. Two
  // values a pass, every part's lse and value read at once (a value is used only where its part's lse is finite), so
  // that a pass costs one round trip to the L2, not two.
  constexpr int kPass = 2;
  for (int u0 = threadIdx.x; u0 < owned * D; u0 += kPass * kTokenThreads) {
    float ls[kPass][kTokenMaxParts], x[kPass][kTokenMaxParts];
#pragma unroll
    for (int v = 0; v < kPass; ++v) {
      const int u = u0 + v * kTokenThreads;
      const int r = rank + (u / D) * C, col = u % D;
      const bool here = u < owned * D;
#pragma unroll
      for (int s = 0; s < kTokenMaxParts; ++s) {
        ls[v][s] = here && s < parts ? __ldcg(part_lse + s * kTokenRows + r) : -INFINITY;
        x[v][s] = here && s < parts ? __ldcg(part_o + (s * kTokenRows + r) * D + col) : 0.f;
      }
    }
#pragma unroll
    for (int v = 0; v < kPass; ++v) {
      const int u = u0 + v * kTokenThreads;
      if (u >= owned * D) break;
      float m = -INFINITY;
#pragma unroll
      for (int s = 0; s < kTokenMaxParts; ++s) m = lse_fold_max(m, ls[v][s]);
      float acc[1] = {0.f}, lse = -INFINITY;
      if (m != -INFINITY) {
        float sum = 0.f;
#pragma unroll
        for (int s = 0; s < kTokenMaxParts; ++s) {
          if (ls[v][s] == -INFINITY) continue;
          const float wt = lse_weight(ls[v][s], m);
          sum += wt;
          acc[0] += wt * x[v][s];
        }
        acc[0] *= merge_inv(sum);
        lse = m + merge_log(sum);
      }
      emit(rank + (u / D) * C, u % D, acc, lse);
    }
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (graph replays reuse the plan)
}

}  // namespace msa::detail::cuda::decode
