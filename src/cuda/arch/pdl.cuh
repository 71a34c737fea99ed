// Programmatic dependent launch (PDL, sm_90+; no-ops before), device side. A grid launched with the
// programmatic stream-serialization attribute (runtime/launch.cuh) may be scheduled while the previous
// kernel of the stream still runs, which hides its launch latency behind that kernel's tail (~0.5-1 us
// per kernel of a decode step).
#pragma once

namespace msa::detail::cuda::arch {

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

// A hint that brings the 128-byte line of `p` into the L2; nothing reaches registers or the L1, so it may be
// issued before grid_dependency_wait() on lines an earlier kernel still writes (the L2 is the device's point
// of coherence: a later write updates the line, a load after the wait sees it).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

}  // namespace msa::detail::cuda::arch
