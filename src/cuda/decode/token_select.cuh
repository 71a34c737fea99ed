// sparse_attention_layer's top-k inside the single-token decode kernel (its kSelect instances): warp 0 of
// each CTA selects its token's blocks from the scores row by select_topk's rule (indexer/select_row.cuh,
// contract §4) where the other instances read the block indexes a select_topk kernel wrote. A decode layer
// step then runs two kernels, scores and attention, instead of three: the selection costs each CTA one
// threshold search on its way to the page reads, at the attention's start, in every CTA at once, instead of
// a kernel between the two streams (docs/decode.md, "The layer step"). Split 0 of each token writes the row
// to the layer's block_idx, as select_topk would have.
#pragma once

#include <cstdint>

#include "cuda/decode/kernel_params.cuh"
#include "cuda/decode/token_config.h"
#include "cuda/indexer/select_row.cuh"

namespace msa::detail::cuda::decode {

using TokenSelectRow = float[kTokenSelectKeysPerLane];

// Lane l: the scores of blocks l + 32 i of token t, KV head g (0 past the scores' extent, never a candidate).
// Issued early, with the request's lengths: the row is used only after they arrive.
__device__ __forceinline__ void load_select_row(const TokenSelect& s, int64_t t, int g, TokenSelectRow& v) {
  const int lane = threadIdx.x & 31;
  const float* row = s.scores + t * s.stride_token + static_cast<int64_t>(g) * s.stride_head;
#pragma unroll
  for (int i = 0; i < kTokenSelectKeysPerLane; ++i) {
    const int blk = 32 * i + lane;
    v[i] = blk < s.max_blocks ? __ldg(row + blk * s.stride_block) : 0.f;
  }
}

struct TokenSelectRule {
  int topk, force_begin, force_end;
};

// Writes entry j to the CTA's shared copy of the row and, for split 0, to the output row.
struct TokenSelectSink {
  int32_t* sel;
  int32_t* out;  // null: not this CTA's to write
  int64_t stride_k;
  __device__ __forceinline__ void put(int j, int blk) const {
    sel[j] = blk;
    if (out) out[j * stride_k] = blk;
  }
  __device__ __forceinline__ void empty(int j) const { put(j, -1); }
};

// The token's top-k among its n valid blocks (select_topk's count: causal, the lengths, the scores' extent),
// by warp 0; sel: topk ints of shared memory. Returns lane's entry (lane < topk), else -1.
__device__ __forceinline__ int32_t select_token_blocks(const TokenSelect& s, const TokenSelectRow& v, int n, int topk,
                                                       int32_t* sel, int32_t* out) {
  namespace ix = indexer;
  const int lane = threadIdx.x & 31;
  const TokenSelectSink sink{sel, out, s.out_stride_k};
  if (n <= topk) {  // every valid block
    for (int j = lane; j < topk; j += 32) {
      if (j < n)
        sink.put(j, j);
      else
        sink.empty(j);
    }
  } else {
    const int lo = s.force_begin, hi = n - s.force_end;  // candidates by score
    ix::RegKeys<kTokenSelectKeysPerLane> keys;
#pragma unroll
    for (int i = 0; i < kTokenSelectKeysPerLane; ++i) {
      const int blk = 32 * i + lane;
      keys.k[i] = blk >= lo && blk < hi ? ix::score_key(v[i], false) : 0u;
    }
    ix::select_row(keys, n, TokenSelectRule{topk, s.force_begin, s.force_end}, false, sink);
  }
  __syncwarp();
  const int32_t e = lane < topk ? sel[lane] : -1;
  __syncwarp();  // read before warp 0 reuses the bytes
  return e;
}

}  // namespace msa::detail::cuda::decode
