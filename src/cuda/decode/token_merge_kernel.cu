// The split merge of a dense plan's splits without clusters (plan_token_dense_splits), as a second kernel: each
// split of the single-token kernel has written its normalized rows and their lse to the workspace, and this kernel,
// launched after it (PDL: its CTAs wait in grid_dependency_wait while the splits stream), merges them. One CTA per
// (token, KV head, row), 512 threads: 32 column quads x 16 part groups, each thread holding 4 columns of every
// 16th part. A thread's values and the row's lse are all in flight at once (one round trip to the L2 for up to
// 128 parts), the weights come from one warp, and the 16 groups' sums meet in shared memory in a fixed order
// (the result does not depend on timing). The weights and the sum are merge_math.cuh's, as in every split merge
// of the family: empty parts (lse = -inf) are skipped, a NaN part makes the row NaN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/arch/pdl.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/decode/kernel_params.cuh"
#include "cuda/decode/merge_math.cuh"
#include "cuda/decode/token_config.h"
#include "cuda/decode/token_merge_kernel.h"
#include "cuda/runtime/check.cuh"

namespace msa::detail::cuda::decode {

namespace {

constexpr int kMergeThreads = 512;
constexpr int kColQuads = kTokenHeadDim / 4;             // 32
constexpr int kPartGroups = kMergeThreads / kColQuads;   // 16
constexpr int kPartsPerThread = 8;                       // per pass: 16 groups x 8 = 128 parts
constexpr int kPartsPerPass = kPartGroups * kPartsPerThread;
static_assert(kTokenMaxMergeParts <= kMergeThreads, "one lse per thread");

template <typename T>
__global__ void __launch_bounds__(kMergeThreads) token_merge_kernel(const __grid_constant__ KernelParams kp) {
  constexpr int D = kTokenHeadDim;
  __shared__ float weight[kTokenMaxMergeParts];  // the parts' lse, then their weights (-1: an empty part)
  __shared__ float4 group_acc[kPartGroups][kColQuads];
  __shared__ float row_stat[2];                  // the max lse, the sum of the weights
  arch::grid_dependency_wait();  // the splits' rows are written
  arch::allow_dependent_launch();
  const AttentionParams& p = kp.a;
  const int g = blockIdx.y, r = blockIdx.z, G = p.group_size;
  if (r >= G) return;
  // The token as the attention kernel finds it (token_kernel.cuh): a CTA past its request's tokens wrote nothing.
  const int b = static_cast<int>(blockIdx.x >> kp.tq_shift), ti = static_cast<int>(blockIdx.x & ((1u << kp.tq_shift) - 1u));
  const int32_t total_q32 = static_cast<int32_t>(min(p.seqs.total_q, int64_t{INT32_MAX}));
  const int32_t q0i = min(max(p.seqs.qo_indptr[b], 0), total_q32);
  const int32_t q1i = min(max(p.seqs.qo_indptr[b + 1], q0i), total_q32);
  if (!(q1i - q0i > ti && ti < kp.spec_qo_len)) return;
  const int64_t q0 = static_cast<int64_t>(q0i) + ti;

  const int S = kp.num_splits, tid = threadIdx.x, quad = tid % kColQuads, group = tid / kColQuads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * gridDim.y + g;
  const float* item_o = kp.part_o + item * S * kTokenRows * D;  // [S][16][D]
  const float* item_lse = kp.part_lse + item * S * kTokenRows;  // [S][16]
  const auto load_pass = [&](int s0, float4 (&x)[kPartsPerThread]) {
#pragma unroll
    for (int i = 0; i < kPartsPerThread; ++i) {
      const int s = s0 + group + kPartGroups * i;
      const float4* row = reinterpret_cast<const float4*>(item_o + (static_cast<int64_t>(s) * kTokenRows + r) * D);
      x[i] = s < S ? __ldcg(row + quad) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  float4 x[kPartsPerThread];
  load_pass(0, x);
  if (tid < S) weight[tid] = __ldcg(item_lse + tid * kTokenRows + r);
  __syncthreads();
  if (tid < 32) {  // the max lse (a NaN lse makes its weight NaN, whatever the max), then the weights in part order
    float m = -INFINITY;
    for (int s = tid; s < S; s += 32) m = lse_fold_max(m, weight[s]);
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) m = lse_fold_max(m, __shfl_xor_sync(0xffffffffu, m, k));
    float sum = 0.f;
    for (int s = tid; s < S; s += 32) {
      const float ls = weight[s];
      if (ls == -INFINITY) {
        weight[s] = -1.f;
        continue;
      }
      const float w = lse_weight(ls, m);
      weight[s] = w;
      sum += w;
    }
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
    if (tid == 0) row_stat[0] = m, row_stat[1] = sum;
  }
  __syncthreads();
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0;;) {
#pragma unroll
    for (int i = 0; i < kPartsPerThread; ++i) {
      const int s = s0 + group + kPartGroups * i;
      if (s >= S) break;
      const float w = weight[s];
      if (w < 0.f) continue;  // an empty part: nothing of it is read (a NaN weight is not skipped)
      acc.x += w * x[i].x, acc.y += w * x[i].y, acc.z += w * x[i].z, acc.w += w * x[i].w;
    }
    s0 += kPartsPerPass;
    if (s0 >= S) break;
    load_pass(s0, x);
  }
  group_acc[group][quad] = acc;
  __syncthreads();
  if (group != 0) return;
  const float m = row_stat[0], sum = row_stat[1];
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  float lse = -INFINITY;
  if (m != -INFINITY) {
    for (int k = 0; k < kPartGroups; ++k) {
      const float4 a = group_acc[k][quad];
      o.x += a.x, o.y += a.y, o.z += a.z, o.w += a.w;
    }
    const float inv = merge_inv(sum);
    o.x *= inv, o.y *= inv, o.z *= inv, o.w *= inv;
    lse = m + merge_log(sum);
  }
  const int64_t head = static_cast<int64_t>(g) * G + r;
  T* dst = static_cast<T*>(p.o) + q0 * p.o_stride_token + head * p.o_stride_head + 4 * quad;
  *reinterpret_cast<uint2*>(dst) = make_uint2(arch::pack2<T>(o.x, o.y), arch::pack2<T>(o.z, o.w));
  if (p.lse && quad == 0) p.lse[q0 * p.lse_stride_token + head * p.lse_stride_head] = lse;
}

}  // namespace

void launch_token_merge(const KernelParams& kp, unsigned num_tiles, unsigned num_kv_heads, bool pdl,
                        cudaStream_t stream) {
  const void* fn = kp.a.dtype == ScalarType::kF16 ? reinterpret_cast<const void*>(&token_merge_kernel<__half>)
                                                  : reinterpret_cast<const void*>(&token_merge_kernel<__nv_bfloat16>);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(num_tiles, num_kv_heads, kTokenRows);
  cfg.blockDim = dim3(kMergeThreads);
  cfg.stream = stream;
  cfg.attrs = pdl ? &attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  KernelParams args_kp = kp;
  void* args[] = {&args_kp};
  MSA_CUDA_CHECK(cudaLaunchKernelExC(&cfg, fn, args));
}

}  // namespace msa::detail::cuda::decode
