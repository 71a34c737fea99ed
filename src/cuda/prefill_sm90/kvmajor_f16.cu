// KV-major sparse prefill kernel, fp16 instantiation.
#include "cuda/prefill_sm90/kvmajor_launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {
template void launch_kvmajor<false>(const KvMajorParams&, int, bool, cudaStream_t);
template bool configure_kvmajor<false>();
}  // namespace msa::detail::cuda::prefill_sm90
