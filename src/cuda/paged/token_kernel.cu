// Instances of the single-token decode kernel: (bf16, fp16) x (3, 4) stages.
#include "cuda/paged/kernel_table.h"
#include "cuda/paged/token_kernel.cuh"

namespace msa::detail::cuda::paged {

namespace {
template <typename T>
const void* for_stages(int stages) {
  return stages == kTokenMaxStages ? reinterpret_cast<const void*>(&token_decode_kernel<T, kTokenMaxStages>)
                                   : reinterpret_cast<const void*>(&token_decode_kernel<T, kTokenMinStages>);
}
}  // namespace

const void* token_kernel_entry(ScalarType dtype, int stages) {
  switch (dtype) {
    case ScalarType::kBF16: return for_stages<__nv_bfloat16>(stages);
    case ScalarType::kF16: return for_stages<__half>(stages);
    default: return nullptr;
  }
}

}  // namespace msa::detail::cuda::paged
