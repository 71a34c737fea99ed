// Portable KV-major kernel instances: q in __half, K/V in q's dtype.
#include "cuda/prefill_portable/kernel_launch.cuh"

namespace msa::detail::cuda::prefill_portable {
template void launch_kvmajor<__half, false>(const KvParams&, int, int, bool, cudaStream_t);
template bool configure_kvmajor<__half, false>(int);
}  // namespace msa::detail::cuda::prefill_portable
