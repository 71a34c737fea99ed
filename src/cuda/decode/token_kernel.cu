// Instances of the single-token decode kernel: (bf16, fp16) q x (16-bit, fp8 e4m3) cache x (pull merge, push merge;
// the pull instance also writes the splits of the dense plans' merge kernel).
#include "cuda/decode/kernel_table.h"
#include "cuda/decode/token_kernel.cuh"

namespace msa::detail::cuda::decode {

namespace {
template <typename T, typename KV>
const void* for_merge(bool push) {
  return push ? reinterpret_cast<const void*>(&token_decode_kernel<T, KV, true>)
              : reinterpret_cast<const void*>(&token_decode_kernel<T, KV, false>);
}
template <typename T>
const void* for_cache(ScalarType dtype, ScalarType kv_dtype, bool push) {
  if (kv_dtype == ScalarType::kF8E4M3) return for_merge<T, E4M3>(push);
  return kv_dtype == dtype ? for_merge<T, T>(push) : nullptr;
}
}  // namespace

const void* token_kernel_entry(ScalarType dtype, ScalarType kv_dtype, bool push_merge) {
  switch (dtype) {
    case ScalarType::kBF16: return for_cache<__nv_bfloat16>(dtype, kv_dtype, push_merge);
    case ScalarType::kF16: return for_cache<__half>(dtype, kv_dtype, push_merge);
    default: return nullptr;
  }
}

}  // namespace msa::detail::cuda::decode
