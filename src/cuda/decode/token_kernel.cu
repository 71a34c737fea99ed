// Instances of the single-token decode kernel: (bf16, fp16) x (pull merge, push merge).
#include "cuda/decode/kernel_table.h"
#include "cuda/decode/token_kernel.cuh"

namespace msa::detail::cuda::decode {

namespace {
template <typename T>
const void* for_merge(bool push) {
  return push ? reinterpret_cast<const void*>(&token_decode_kernel<T, true>)
              : reinterpret_cast<const void*>(&token_decode_kernel<T, false>);
}
}  // namespace

const void* token_kernel_entry(ScalarType dtype, bool push_merge) {
  switch (dtype) {
    case ScalarType::kBF16: return for_merge<__nv_bfloat16>(push_merge);
    case ScalarType::kF16: return for_merge<__half>(push_merge);
    default: return nullptr;
  }
}

}  // namespace msa::detail::cuda::decode
