// KV-major sparse prefill kernel: fp16 q and partials, fp8 e4m3 K/V.
#include "cuda/prefill_sm90/kvmajor_launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {
template void launch_kvmajor<false, true>(const KvMajorParams&, int, bool, cudaStream_t);
template bool configure_kvmajor<false, true>();
}  // namespace msa::detail::cuda::prefill_sm90
