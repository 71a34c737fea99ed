// Reference page-table builder: out[b, p] = req_to_token[req, p * page_size] / page_size for the
// pages that hold the request's tokens, -1 elsewhere. Defensive: a pool row or token column outside
// its range gives -1 instead of a read out of bounds, and so does a negative slot.
#include <algorithm>
#include <cstdint>

#include "core/backend.h"

namespace msa::detail::reference {

namespace {

int64_t read_int(const void* base, bool is_i64, int64_t i) {
  return is_i64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
}

}  // namespace

void build_page_table(const PageTableBuildParams& p) {
  for (int32_t b = 0; b < p.batch_size; ++b) {
    const int64_t req = read_int(p.req_pool_indices, p.req_pool_indices_i64, b);
    const int64_t seq_len = read_int(p.seq_lens, p.seq_lens_i64, b);
    const bool row_ok = req >= 0 && req < p.num_reqs_pool;
    const int64_t pages = row_ok ? std::clamp<int64_t>((seq_len + p.page_size - 1) / p.page_size, 0, p.max_pages) : 0;
    int32_t* out = p.out + b * p.out_stride_b;
    for (int64_t pg = 0; pg < p.max_pages; ++pg) {
      int32_t page = -1;
      const int64_t token = pg * p.page_size;
      if (pg < pages && token < p.max_context) {
        const int64_t slot = p.req_to_token[req * p.r2t_stride_req + token * p.r2t_stride_token];
        if (slot >= 0) page = static_cast<int32_t>(slot / p.page_size);
      }
      out[pg] = page;
    }
  }
}

}  // namespace msa::detail::reference
