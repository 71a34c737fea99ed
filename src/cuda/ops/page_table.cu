// msa.build_page_table on the GPU: out[b, p] = req_to_token[req_pool_indices[b], p * page_size] /
// page_size for p < ceil(seq_lens[b] / page_size), -1 for the rest of the fixed-capacity row.
// Reads lengths and pool rows on the device only (no host synchronization: capturable in a CUDA
// graph) and clamps them like the reference: a bad pool row gives an all -1 row, a token column
// past max_context or a negative slot gives -1.
#include <algorithm>

#include "core/backend.h"
#include "cuda/runtime/check.cuh"

namespace msa::detail::cuda {

namespace {

__device__ __forceinline__ int64_t load_int(const void* base, bool is_i64, int64_t i) {
  return is_i64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
}

__global__ void build_page_table_kernel(const PageTableBuildParams p) {
  const int64_t n = static_cast<int64_t>(p.batch_size) * p.max_pages;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = idx / p.max_pages, pg = idx % p.max_pages;
    const int64_t req = load_int(p.req_pool_indices, p.req_pool_indices_i64, b);
    const int64_t len = load_int(p.seq_lens, p.seq_lens_i64, b);
    const bool row_ok = req >= 0 && req < p.num_reqs_pool;
    const int64_t pages = row_ok && len > 0 ? std::min<int64_t>((len - 1) / p.page_size + 1, p.max_pages) : 0;
    const int64_t token = pg * p.page_size;
    int32_t page = -1;
    if (pg < pages && token < p.max_context) {
      const int64_t slot = p.req_to_token[req * p.r2t_stride_req + token * p.r2t_stride_token];
      if (slot >= 0) page = static_cast<int32_t>(slot / p.page_size);
    }
    p.out[b * p.out_stride_b + pg] = page;
  }
}

}  // namespace

void build_page_table(const PageTableBuildParams& p, void* stream) {
  const int64_t n = static_cast<int64_t>(p.batch_size) * p.max_pages;
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  build_page_table_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::detail::cuda
