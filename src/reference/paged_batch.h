// Where a query token sits in the ragged batch, and where a key sits in the paged pool (contract §1-§2).
// Both are written defensively: whatever the lengths and page ids, nothing outside the tensors is read.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/params.h"

namespace msa::detail::reference {

// A query token's request and absolute position; request < 0 for tokens outside every request
// (the padding rows of a decode batch), which see no key.
struct TokenPlace {
  int32_t request = -1;
  int64_t kv_len = 0;
  int64_t pos = 0;  // qo_offset + index within the request
};

class BatchMap {
 public:
  explicit BatchMap(const SeqParams& s)
      : seqs_(s), request_of_(static_cast<size_t>(std::max<int64_t>(s.total_q, 0)), -1) {
    for (int32_t b = 0; b < s.batch_size; ++b) {
      const int64_t begin = std::max<int64_t>(s.qo_indptr[b], 0);
      const int64_t end = std::min<int64_t>(s.qo_indptr[b + 1], s.total_q);
      for (int64_t t = begin; t < end; ++t) request_of_[t] = b;
    }
  }

  TokenPlace place(int64_t t) const {
    TokenPlace pl;
    const int32_t b = request_of_[t];
    if (b < 0) return pl;
    pl.request = b;
    pl.kv_len = std::max<int64_t>(seqs_.kv_lens[b], 0);
    const int64_t qo_len = int64_t(seqs_.qo_indptr[b + 1]) - seqs_.qo_indptr[b];
    const int64_t offset = seqs_.qo_offset ? int64_t(seqs_.qo_offset[b]) : pl.kv_len - qo_len;
    pl.pos = offset + (t - seqs_.qo_indptr[b]);
    return pl;
  }

  // Keys [0, visible_end) pass the dense mask: j < kv_len, and j <= pos when causal.
  static int64_t visible_end(const TokenPlace& pl, bool causal) {
    if (pl.request < 0) return 0;
    return causal ? std::clamp<int64_t>(pl.pos + 1, 0, pl.kv_len) : pl.kv_len;
  }

 private:
  SeqParams seqs_;
  std::vector<int32_t> request_of_;
};

// Physical page of request b's logical page lp, or -1 when the row has no such entry or the entry
// is not a page of the pool.
inline int64_t physical_page(const PageTableParams& pt, int32_t b, int64_t lp) {
  int64_t at;
  if (pt.indptr) {
    const int64_t begin = pt.indptr[b], end = std::min<int64_t>(pt.indptr[b + 1], pt.row_capacity);
    at = begin + lp;
    if (begin < 0 || at >= end) return -1;
  } else {
    if (lp >= pt.row_capacity) return -1;
    at = int64_t(b) * pt.row_stride + lp;
  }
  const int64_t page = pt.table[at];
  return page >= 0 && page < pt.num_pages ? page : -1;
}

}  // namespace msa::detail::reference
