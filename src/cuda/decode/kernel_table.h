// The compiled instances of the paged kernel: (bf16, fp16) x head dim (64, 128, 256) x rows
// (16, 64, 128), one .cu file per (dtype, head dim) so that they compile in parallel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/params.h"

namespace msa::detail::cuda::decode {

// Defined in kernel.cuh; explicitly instantiated in kernel_<dtype>_d<D>.cu.
template <typename T, int D>
const void* kernel_for_rows(int rows);

extern template const void* kernel_for_rows<__nv_bfloat16, 64>(int);
extern template const void* kernel_for_rows<__nv_bfloat16, 128>(int);
extern template const void* kernel_for_rows<__nv_bfloat16, 256>(int);
extern template const void* kernel_for_rows<__half, 64>(int);
extern template const void* kernel_for_rows<__half, 128>(int);
extern template const void* kernel_for_rows<__half, 256>(int);

// The kernel for (dtype, head dim, rows); nullptr when there is none.
const void* kernel_entry(ScalarType dtype, int head_dim, int rows);

// The single-token decode kernel (token_kernel.cuh) for dtype, with the push split merge or without it
// (unsplit plans, and the pull merge of split_merge.cuh); nullptr when there is none.
const void* token_kernel_entry(ScalarType dtype, bool push_merge = false);

}  // namespace msa::detail::cuda::decode
