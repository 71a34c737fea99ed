// Instances of the single-token decode kernel selecting its blocks from index scores (sparse_attention_layer,
// token_select.cuh): (bf16, fp16) q x (16-bit, fp8 e4m3) cache x (pull merge, push merge).
#include "cuda/decode/kernel_table.h"
#include "cuda/decode/token_kernel.cuh"

namespace msa::detail::cuda::decode {

const void* token_select_kernel_entry(ScalarType dtype, ScalarType kv_dtype, bool push_merge) {
  return token_kernel_instance<true>(dtype, kv_dtype, push_merge);
}

}  // namespace msa::detail::cuda::decode
