// Kernel launches with or without programmatic dependent launch (PDL; the device side, which such a
// kernel must call, is arch/pdl.cuh).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/runtime/check.cuh"

namespace msa::detail::cuda {

// kernel<<<grid, block, smem, stream>>>(args...), launched with programmatic stream serialization when
// `pdl` (the kernel must then call arch::grid_dependency_wait() before it reads what an earlier kernel
// wrote, on every path, so that its completion implies its predecessors'). Errors surface as
// MSA_CUDA_CHECK's.
template <typename... Params, typename... Args>
void launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = pdl ? &attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  MSA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Whether `device` can launch with PDL (compute capability 9.0 or newer).
inline bool pdl_supported(int device) {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
}

}  // namespace msa::detail::cuda
