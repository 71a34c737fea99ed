// Host-side launchers of the Hopper prefill kernels (one translation unit per kernel and dtype so
// that the instantiations compile in parallel). Each launcher only enqueues work on `stream`.
//
// pdl (here, schedule.h, kvmajor_lists.h): launched with programmatic dependent launch (PDL), so that the
// grid may start while the previous kernel of the stream finishes. A run launches so every kernel that
// follows a kernel of the run on the same stream: the lists after the schedule, the query-major kernel
// after the lists (or the schedule), scan, fill and the KV-major kernel after the kernel before them. Every
// kernel waits for its predecessor (grid_dependency_wait) before anything else, so either launch is
// correct. The merge is never launched so: with PDL it took 77 -> 87 us at M3-TP4 P-chunk `random` and
// 277 -> 315 us at M3-TP1 (its CTAs sit waiting on the SMs the KV-major kernel leaves). H200, M3-TP4
// P-chunk `random`: plain stream order 263.5-265.4 us, PDL for the lists and the query-major kernel
// 262.6-263.1, also for scan, fill and the KV-major kernel 260.8-261.1; M3-TP1 P-chunk equal within 0.5%.
#pragma once

#include <cuda_runtime.h>

#include "cuda/prefill_sm90/params.h"

namespace msa::detail::cuda::prefill_sm90 {

// kBf16: q, o (and K/V unless kF8) are bf16, else fp16. kF8: K/V are fp8 e4m3 (one TMA box of 128 keys x 128
// bytes a block), widened in shared memory: to fp16 by the query-major kernel (which rescales bf16 Q rows into
// fp16 and runs both products on fp16), to q's type by the KV-major kernel.

// Query-major prefill kernel (dense or sparse); grid = persistent CTAs (<= SM count).
template <bool kBf16, bool kF8 = false>
void launch_qmajor(bool sparse, const QMajorParams& p, int grid, bool pdl, cudaStream_t stream);

// KV-major sparse kernel over one window's work items; grid = persistent CTAs.
template <bool kBf16, bool kF8 = false>
void launch_kvmajor(const KvMajorParams& p, int grid, bool pdl, cudaStream_t stream);

// Raise the dynamic shared-memory limit of the kernels of this dtype on the current device; false
// when this binary holds no sm_90a code for them (they would not run here).
template <bool kBf16, bool kF8 = false>
bool configure_qmajor();
template <bool kBf16, bool kF8 = false>
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
