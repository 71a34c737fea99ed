// The compiled instances of the paged kernel: (bf16, fp16) q x (16-bit, fp8 e4m3) cache x head dim (64, 128,
// 256) x rows (16, 64, 128); 128 rows at head dim <= 128 in two shapes (4 warps of 32 rows, 8 warps of 16),
// the first also with 32-key stages at head dim 128 (config.cuh); one .cu file per (dtype, cache, head dim) so
// that they compile in parallel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/params.h"
#include "cuda/decode/fp8_tile.cuh"

namespace msa::detail::cuda::decode {

// Defined in kernel.cuh; explicitly instantiated in kernel_<dtype>[_e4m3]_d<D>.cu.
template <typename T, typename KV, int D>
const void* kernel_for_rows(int rows, int keys, int mtiles);

extern template const void* kernel_for_rows<__nv_bfloat16, __nv_bfloat16, 64>(int, int, int);
extern template const void* kernel_for_rows<__nv_bfloat16, __nv_bfloat16, 128>(int, int, int);
extern template const void* kernel_for_rows<__nv_bfloat16, __nv_bfloat16, 256>(int, int, int);
extern template const void* kernel_for_rows<__half, __half, 64>(int, int, int);
extern template const void* kernel_for_rows<__half, __half, 128>(int, int, int);
extern template const void* kernel_for_rows<__half, __half, 256>(int, int, int);
extern template const void* kernel_for_rows<__nv_bfloat16, E4M3, 64>(int, int, int);
extern template const void* kernel_for_rows<__nv_bfloat16, E4M3, 128>(int, int, int);
extern template const void* kernel_for_rows<__nv_bfloat16, E4M3, 256>(int, int, int);
extern template const void* kernel_for_rows<__half, E4M3, 64>(int, int, int);
extern template const void* kernel_for_rows<__half, E4M3, 128>(int, int, int);
extern template const void* kernel_for_rows<__half, E4M3, 256>(int, int, int);

// The kernel for (q's dtype, the cache's dtype, head dim, rows, keys per stage, m-tiles per warp; 0: the
// defaults); nullptr when there is none.
const void* kernel_entry(ScalarType dtype, ScalarType kv_dtype, int head_dim, int rows, int keys = 0, int mtiles = 0);

// The single-token decode kernel (token_kernel.cuh) for dtype, with the push split merge or without it
// (unsplit plans, the pull merge of split_merge.cuh, and the splits token_merge_kernel.cu merges); nullptr when
// there is none.
const void* token_kernel_entry(ScalarType dtype, ScalarType kv_dtype, bool push_merge = false);

}  // namespace msa::detail::cuda::decode
