// Portable KV-major kernel instances: q in __nv_bfloat16, K/V in fp8 e4m3.
#include "cuda/prefill_portable/kernel_launch.cuh"

namespace msa::detail::cuda::prefill_portable {
template void launch_kvmajor<__nv_bfloat16, true>(const KvParams&, int, int, bool, cudaStream_t);
template bool configure_kvmajor<__nv_bfloat16, true>(int);
}  // namespace msa::detail::cuda::prefill_portable
