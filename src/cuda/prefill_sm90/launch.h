// Host-side launchers of the Hopper prefill kernels (one translation unit per kernel and dtype so
// that the instantiations compile in parallel). Each launcher only enqueues work on `stream`.
#pragma once

#include <cuda_runtime.h>

#include "cuda/prefill_sm90/params.h"

namespace msa::detail::cuda::prefill_sm90 {

// Query-major prefill kernel (dense or sparse); grid = persistent CTAs (<= SM count). pdl (both):
// launched with programmatic dependent launch (PrefillState::pdl).
template <bool kBf16>
void launch_qmajor(bool sparse, const QMajorParams& p, int grid, bool pdl, cudaStream_t stream);

// KV-major sparse kernel over one window's work items; grid = persistent CTAs.
template <bool kBf16>
void launch_kvmajor(const KvMajorParams& p, int grid, bool pdl, cudaStream_t stream);

// Raise the dynamic shared-memory limit of the kernels of this dtype on the current device; false
// when this binary holds no sm_90a code for them (they would not run here).
template <bool kBf16>
bool configure_qmajor();
template <bool kBf16>
bool configure_kvmajor();

// A kernel compiled without sm_90a features has an empty body and a handful of registers; the real
// ones are pinned at 168 by __launch_bounds__(384, 1) and setmaxnreg.
inline bool kernel_has_sm90a_body(const void* kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.numRegs >= 128;
}

}  // namespace msa::detail::cuda::prefill_sm90
