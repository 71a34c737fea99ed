// Kernel launches with or without programmatic dependent launch (PDL; the device side, which such a
// kernel must call, is arch/pdl.cuh).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/backend.h"
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

// Whether kernels launched on `device` may use PDL: the code they run there is sm_90+ (compute_capability(),
// core/backend.h), so its arch::grid_dependency_wait() is compiled in. Not the device's own capability: sm_80 code
// JIT-compiled on a Hopper device has no wait, and launched with PDL it could read its inputs before the previous
// kernel's writes are visible.
inline bool pdl_supported(int device) { return compute_capability(device) >= 90; }

}  // namespace msa::detail::cuda
