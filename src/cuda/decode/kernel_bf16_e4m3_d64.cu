// Instances of the paged kernel for bf16 q with an fp8 e4m3 K/V cache, head dim 64 (rows 16, 64, 128).
#include "cuda/decode/kernel.cuh"

namespace msa::detail::cuda::decode {
template const void* kernel_for_rows<__nv_bfloat16, E4M3, 64>(int, int, int);
}  // namespace msa::detail::cuda::decode
