// msa.merge_states on the GPU: o[t, h] = sum_s exp(lse_s - lse) v_s[t, h], lse = log(sum_s exp(lse_s)).
// One thread per output element (the parts are read once each; the S lse values of a row are
// re-read per element from L1). The weights are those of the split merge inside the paged kernel
// (cuda/decode/merge_math.cuh): empty parts are skipped, a single part passes through exactly.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/backend.h"
#include "cuda/runtime/check.cuh"
#include "cuda/decode/merge_math.cuh"

namespace msa::detail::cuda {

namespace {

__device__ __forceinline__ float load_float(const void* base, ScalarType t, int64_t i) {
  switch (t) {
    case ScalarType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case ScalarType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store_float(void* base, ScalarType t, int64_t i, float v) {
  switch (t) {
    case ScalarType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16(v); break;
    case ScalarType::kF16: static_cast<__half*>(base)[i] = __float2half(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

// Columns per (token, head): head_dim, or one that writes only lse_out when head_dim is 0 (parts of no
// values still merge their lse, as the CPU backend does; tests/python/fuzz/test_gpu_fuzz_ops.py draws
// head dim 0).
__host__ __device__ __forceinline__ int merge_columns(const MergeParams& p) {
  return p.head_dim > 0 ? p.head_dim : (p.lse_out != nullptr ? 1 : 0);
}

__global__ void merge_states_kernel(const MergeParams p) {
  const int cols = merge_columns(p);
  const int64_t n = p.num_tokens * p.num_heads * cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(idx % cols);
    const bool value = d < p.head_dim;  // false only in the lse-only column of head_dim 0
    const int64_t th = idx / cols;
    const int h = static_cast<int>(th % p.num_heads);
    const int64_t t = th / p.num_heads;
    const float* lse = p.lse + t * p.lse_stride_token + h * p.lse_stride_head;
    float m = -INFINITY;
    for (int s = 0; s < p.num_splits; ++s) m = decode::lse_fold_max(m, lse[s * p.lse_stride_split]);
    float out = 0.f, lse_out = -INFINITY;
    if (m != -INFINITY) {
      float sum = 0.f, acc = 0.f;
      const int64_t v0 = t * p.v_stride_token + h * p.v_stride_head + d;
      for (int s = 0; s < p.num_splits; ++s) {
        const float ls = lse[s * p.lse_stride_split];
        if (ls == -INFINITY) continue;
        const float w = decode::lse_weight(ls, m);
        sum += w;
        if (value) acc += w * load_float(p.v, p.v_dtype, v0 + s * p.v_stride_split);
      }
      out = acc / sum;
      lse_out = m + logf(sum);
    }
    if (value) store_float(p.o, p.o_dtype, t * p.o_stride_token + h * p.o_stride_head + d, out);
    if (p.lse_out && d == 0) p.lse_out[t * p.lse_out_stride_token + h * p.lse_out_stride_head] = lse_out;
  }
}

}  // namespace

void merge_states(const MergeParams& p, void* stream) {
  const int64_t n = p.num_tokens * p.num_heads * merge_columns(p);
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  merge_states_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::detail::cuda
