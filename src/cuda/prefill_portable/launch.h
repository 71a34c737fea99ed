// Host-side entry of the portable KV-major kernel: one translation unit per (q dtype, K/V dtype) so that
// the instances compile in parallel (kernel_<dtype>[_e4m3].cu). Each launcher only enqueues work.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/prefill_portable/params.h"

namespace msa::detail::cuda::prefill_portable {

// T: q's (and o's, and the partial outputs') type; kF8: K/V are fp8 e4m3. kv_stages: 1 or 2 (config.h).
// grid: persistent CTAs, one per SM. pdl: launched with programmatic dependent launch (sm_90+).
template <typename T, bool kF8>
void launch_kvmajor(const KvParams& p, int kv_stages, int grid, bool pdl, cudaStream_t stream);

// Raises the dynamic shared-memory limit of the instance on the current device; false when the device
// cannot give it (or the binary holds no code for the device).
template <typename T, bool kF8>
bool configure_kvmajor(int kv_stages);

#define MSA_PORTABLE_KVMAJOR_EXTERN(T, F8)                                                            \
  extern template void launch_kvmajor<T, F8>(const KvParams&, int, int, bool, cudaStream_t); \
  extern template bool configure_kvmajor<T, F8>(int);
MSA_PORTABLE_KVMAJOR_EXTERN(__nv_bfloat16, false)
MSA_PORTABLE_KVMAJOR_EXTERN(__half, false)
MSA_PORTABLE_KVMAJOR_EXTERN(__nv_bfloat16, true)
MSA_PORTABLE_KVMAJOR_EXTERN(__half, true)
#undef MSA_PORTABLE_KVMAJOR_EXTERN

}  // namespace msa::detail::cuda::prefill_portable
