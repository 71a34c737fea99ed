// Template definitions behind launch.h for the query-major kernel; included once per dtype.
#pragma once

#include "cuda/prefill_sm90/launch.h"
#include "cuda/prefill_sm90/qmajor_kernel.cuh"
#include "cuda/runtime/check.cuh"
#include "cuda/runtime/launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {

template <bool kBf16, bool kF8>
void launch_qmajor(bool sparse, const QMajorParams& p, int grid, bool pdl, cudaStream_t stream) {
  if (sparse)
    launch_kernel(pdl, qmajor_prefill_kernel<kBf16, true, kF8>, dim3(grid), dim3(kThreads), kQMajorSmemBytes, stream,
                  p);
  else
    launch_kernel(pdl, qmajor_prefill_kernel<kBf16, false, kF8>, dim3(grid), dim3(kThreads), kQMajorSmemBytes, stream,
                  p);
#ifdef MSA_QMAJOR_TRACE
  qmajor_trace_print_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned>(grid));
#endif
}

template <bool kBf16, bool kF8>
bool configure_qmajor() {
  const void* kernels[] = {reinterpret_cast<const void*>(qmajor_prefill_kernel<kBf16, false, kF8>),
                           reinterpret_cast<const void*>(qmajor_prefill_kernel<kBf16, true, kF8>)};
  for (const void* k : kernels) {
    if (!kernel_has_sm90a_body(k)) return false;
    MSA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kQMajorSmemBytes));
  }
  return true;
}

}  // namespace msa::detail::cuda::prefill_sm90
