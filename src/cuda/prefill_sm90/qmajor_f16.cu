// Query-major prefill kernels, fp16 instantiation.
#include "cuda/prefill_sm90/qmajor_launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {
template void launch_qmajor<false>(bool, const QMajorParams&, int, bool, cudaStream_t);
template bool configure_qmajor<false>();
}  // namespace msa::detail::cuda::prefill_sm90
