// The single-token kernel's split merge as a second kernel (dense plans of many splits without clusters:
// plan_token_dense_splits in plan.cu; the kernel in token_merge_kernel.cu).
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/kernel_params.cuh"

namespace msa::detail::cuda::decode {

// Merges the kp.num_splits partial rows per (token, KV head) that the single-token kernel wrote to kp.part_o /
// kp.part_lse into kp.a.o / kp.a.lse. Launched right after that kernel on the same stream; with pdl its CTAs are
// scheduled while the splits run and wait for them.
void launch_token_merge(const KernelParams& kp, unsigned num_tiles, unsigned num_kv_heads, bool pdl,
                        cudaStream_t stream);

}  // namespace msa::detail::cuda::decode
