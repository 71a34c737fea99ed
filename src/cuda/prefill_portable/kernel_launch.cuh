// The launch and configuration templates of launch.h, included by the per-dtype translation units.
#pragma once

#include "cuda/prefill_portable/config.h"
#include "cuda/prefill_portable/kernel.cuh"
#include "cuda/prefill_portable/launch.h"
#include "cuda/runtime/launch.cuh"

namespace msa::detail::cuda::prefill_portable {

template <typename T, bool kF8>
void launch_kvmajor(const KvParams& p, int kv_stages, int grid, bool pdl, cudaStream_t stream) {
  const auto kernel = kv_stages == 2 ? kvmajor_kernel<T, kF8, 2> : kvmajor_kernel<T, kF8, 1>;
  launch_kernel(pdl, kernel, dim3(grid), dim3(kThreads), smem_bytes(kv_stages), stream, p);
}

template <typename T, bool kF8>
bool configure_kvmajor(int kv_stages) {
  const auto kernel = kv_stages == 2 ? kvmajor_kernel<T, kF8, 2> : kvmajor_kernel<T, kF8, 1>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem_bytes(kv_stages))) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace msa::detail::cuda::prefill_portable
