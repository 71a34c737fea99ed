// Query-major prefill kernels, bf16 instantiation.
#include "cuda/prefill_sm90/qmajor_launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {
template void launch_qmajor<true>(bool, const QMajorParams&, int, bool, cudaStream_t);
template bool configure_qmajor<true>();
}  // namespace msa::detail::cuda::prefill_sm90
