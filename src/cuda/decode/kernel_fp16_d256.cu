// Instances of the paged kernel for fp16, head dim 256 (rows 16, 64, 128).
#include "cuda/decode/kernel.cuh"

namespace msa::detail::cuda::decode {
template const void* kernel_for_rows<__half, __half, 256>(int, int, int);
}  // namespace msa::detail::cuda::decode
