// Query-major prefill kernels: bf16 q and o, fp8 e4m3 K/V.
#include "cuda/prefill_sm90/qmajor_launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {
template void launch_qmajor<true, true>(bool, const QMajorParams&, int, bool, cudaStream_t);
template bool configure_qmajor<true, true>();
}  // namespace msa::detail::cuda::prefill_sm90
