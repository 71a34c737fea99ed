// Programmatic dependent launch (PDL, sm_90+; no-ops before). A grid launched with the programmatic
// stream-serialization attribute may be scheduled while the previous kernel of the stream still runs,
// which hides its launch latency behind that kernel's tail (~0.5-1 us per kernel of a decode step).
#pragma once

#include <cuda_runtime.h>

namespace msa::detail::cuda {

// Returns once the previous kernel of the stream has completed and its writes are visible. A kernel
// launched with PDL must call it before its first read of anything an earlier kernel may write.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next PDL grid of the stream be scheduled once every CTA of this one has called it (that grid
// still waits for this one's completion in its own grid_dependency_wait()).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether `device` can launch with PDL (compute capability 9.0 or newer).
inline bool pdl_supported(int device) {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
}

}  // namespace msa::detail::cuda
