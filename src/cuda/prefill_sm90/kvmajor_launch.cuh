// Template definitions behind launch.h for the KV-major kernel; included once per dtype.
#pragma once

#include "cuda/prefill_sm90/kvmajor_kernel.cuh"
#include "cuda/prefill_sm90/launch.h"
#include "cuda/runtime/check.cuh"
#include "cuda/runtime/launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {

template <bool kBf16, bool kF8>
void launch_kvmajor(const KvMajorParams& p, int grid, bool pdl, cudaStream_t stream) {
  launch_kernel(pdl, kvmajor_prefill_kernel<kBf16, kF8>, dim3(grid), dim3(kThreads), kKvMajorSmemBytes, stream, p);
}

template <bool kBf16, bool kF8>
bool configure_kvmajor() {
  const void* k = reinterpret_cast<const void*>(kvmajor_prefill_kernel<kBf16, kF8>);
  if (!kernel_has_sm90a_body(k)) return false;
  MSA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kKvMajorSmemBytes));
  return true;
}

}  // namespace msa::detail::cuda::prefill_sm90
