// Instances of the single-token decode kernel (bf16, fp16).
#include "cuda/paged/kernel_table.h"
#include "cuda/paged/token_kernel.cuh"

namespace msa::detail::cuda::paged {

const void* token_kernel_entry(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::kBF16: return reinterpret_cast<const void*>(&token_decode_kernel<__nv_bfloat16>);
    case ScalarType::kF16: return reinterpret_cast<const void*>(&token_decode_kernel<__half>);
    default: return nullptr;
  }
}

}  // namespace msa::detail::cuda::paged
