#include "cuda/decode/kernel_table.h"

namespace msa::detail::cuda::decode {

namespace {
template <typename T>
const void* for_dtype(int head_dim, int rows) {
  switch (head_dim) {
    case 64: return kernel_for_rows<T, 64>(rows);
    case 128: return kernel_for_rows<T, 128>(rows);
    case 256: return kernel_for_rows<T, 256>(rows);
    default: return nullptr;
  }
}
}  // namespace

const void* kernel_entry(ScalarType dtype, int head_dim, int rows) {
  switch (dtype) {
    case ScalarType::kBF16: return for_dtype<__nv_bfloat16>(head_dim, rows);
    case ScalarType::kF16: return for_dtype<__half>(head_dim, rows);
    default: return nullptr;
  }
}

}  // namespace msa::detail::cuda::decode
