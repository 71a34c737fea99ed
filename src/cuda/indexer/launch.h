// Host-side launchers of the indexer kernels (one translation unit per kernel family so that they
// compile in parallel). Each only enqueues work on `stream`: no allocation, no synchronization.
#pragma once

#include <cuda_runtime.h>

#include "core/params.h"

namespace msa::detail::cuda::indexer {

// log2(page_size) when it is a power of two, else -1 (the kernels then divide).
int page_shift(int page_size);

// Decode-shaped batches (few tokens per request): keys streamed once, any dtype, any head grouping.
void launch_scores_stream(const BlockScoresParams& p, cudaStream_t stream);

// Decode-shaped batches on sm_90a (TMA ring), head group <= kRingMaxGroup. ring_scores_available: whether
// this binary holds the sm_90a bodies. launch_scores_ring returns false, launching nothing, when the
// cache cannot be read by TMA (key_map.h); the caller then takes launch_scores_stream.
bool ring_scores_available(int device);
bool launch_scores_ring(const BlockScoresParams& p, int device, cudaStream_t stream);

// Prefill on sm_90a (wgmma), bf16/fp16 index keys, head group <= kSm90Rows. False when this binary
// holds no sm_90a code for the kernel (nothing is launched then).
bool sm90_scores_available(int device);
void launch_scores_sm90(const BlockScoresParams& p, cudaStream_t stream);

// Prefill on sm_90a with fp8 index keys on fp8 wgmma (queries quantized to e4m3 per row), head group
// <= kSm90Rows. False when this binary holds no sm_90a code for the kernel.
bool sm90_fp8_scores_available(int device);
void launch_scores_sm90_fp8(const BlockScoresParams& p, cudaStream_t stream);

// Prefill on any sm_80+ device (mma.sync), bf16/fp16/fp8 index keys, head group <= kPortableRows; for fp8
// keys the exact path (keys converted to fp16, queries rescaled by a power of two).
void launch_scores_portable(const BlockScoresParams& p, cudaStream_t stream);

void launch_select_topk(const SelectTopkParams& p, cudaStream_t stream);
void launch_merge_candidates(const MergeCandidatesParams& p, cudaStream_t stream);

// Calls f(QT*, KT*) (null pointers as type tags) with the (query, index-key) element types of p:
// QT = __nv_bfloat16 or __half; KT = QT, or Fp8Tag (scores_stream.cuh) for fp8 e4m3 keys.
template <typename Fp8, typename Bf16, typename F16, typename F>
void with_score_types(const BlockScoresParams& p, F&& f) {
  const bool q_bf16 = p.q_dtype == ScalarType::kBF16;
  if (p.k_dtype == ScalarType::kF8E4M3) {
    if (q_bf16)
      f(static_cast<Bf16*>(nullptr), static_cast<Fp8*>(nullptr));
    else
      f(static_cast<F16*>(nullptr), static_cast<Fp8*>(nullptr));
  } else if (q_bf16) {
    f(static_cast<Bf16*>(nullptr), static_cast<Bf16*>(nullptr));
  } else {
    f(static_cast<F16*>(nullptr), static_cast<F16*>(nullptr));
  }
}

}  // namespace msa::detail::cuda::indexer
