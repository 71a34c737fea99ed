#include "cuda/decode/kernel_table.h"

#include <type_traits>

namespace msa::detail::cuda::decode {

namespace {
template <typename T, typename KV>
const void* for_cache(int head_dim, int rows, int keys, int mtiles) {
  switch (head_dim) {
    case 64: return kernel_for_rows<T, KV, 64>(rows, keys, mtiles);
    case 128: return kernel_for_rows<T, KV, 128>(rows, keys, mtiles);
    case 256: return kernel_for_rows<T, KV, 256>(rows, keys, mtiles);
    default: return nullptr;
  }
}
template <typename T>
constexpr ScalarType scalar_type_of() {
  return std::is_same_v<T, __half> ? ScalarType::kF16 : ScalarType::kBF16;
}
template <typename T>
const void* for_dtype(ScalarType kv_dtype, int head_dim, int rows, int keys, int mtiles) {
  if (kv_dtype == ScalarType::kF8E4M3) return for_cache<T, E4M3>(head_dim, rows, keys, mtiles);
  return kv_dtype == scalar_type_of<T>() ? for_cache<T, T>(head_dim, rows, keys, mtiles) : nullptr;
}
}  // namespace

const void* kernel_entry(ScalarType dtype, ScalarType kv_dtype, int head_dim, int rows, int keys, int mtiles) {
  switch (dtype) {
    case ScalarType::kBF16: return for_dtype<__nv_bfloat16>(kv_dtype, head_dim, rows, keys, mtiles);
    case ScalarType::kF16: return for_dtype<__half>(kv_dtype, head_dim, rows, keys, mtiles);
    default: return nullptr;
  }
}

}  // namespace msa::detail::cuda::decode
