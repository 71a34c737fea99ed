// The single-token kernel's logits of one tile, shared by its 16-bit and fp8 tile loops: both give warp w keys
// 16w .. 16w + 15 of a 64-key tile in S = Q K^T's m16n8 layout (n-tile n, thread (g, t): rows g and g + 8, keys
// 8n + 2t + {0, 1}).
#pragma once

#include <cmath>

namespace msa::detail::cuda::decode {

// s in the exp2 domain (row scale logit_scale[row / 8]), keys at or past `visible` -inf; mx: the rows' maxima
// over the warp's 16 keys (the row's 4 threads exchange).
__device__ __forceinline__ void scale_logits_row_max(float (&s)[2][4], int warp, int lane, int visible,
                                                     const float (&logit_scale)[2], float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = warp * 16 + n * 8 + 2 * (lane & 3) + (e & 1);
      s[n][e] = key < visible ? s[n][e] * logit_scale[e >> 1] : -INFINITY;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
    }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
    mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
  }
}

}  // namespace msa::detail::cuda::decode
