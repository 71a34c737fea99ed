// Device reads of a request's query rows and page-table row, clamped: nothing read from the device is
// trusted (shared by the paged kernels).
#pragma once

#include <climits>
#include <cstdint>

#include "core/params.h"

namespace msa::detail::cuda::paged {

__device__ __forceinline__ int clamp_pos(int64_t pos) {
  return static_cast<int>(pos < -1 ? -1 : (pos > INT_MAX ? INT_MAX : pos));
}

// Request b's query rows [q0, q1), clamped into [0, total_q).
__device__ __forceinline__ void request_rows(const SeqParams& s, int b, int64_t& q0, int64_t& q1) {
  int64_t a = s.qo_indptr[b], c = s.qo_indptr[b + 1];
  a = a < 0 ? 0 : (a > s.total_q ? s.total_q : a);
  c = c < a ? a : (c > s.total_q ? s.total_q : c);
  q0 = a;
  q1 = c;
}

// Request b's page-table row: entries [base, base + len) of pages.table (the flat form's indptr clamped
// into the table).
__device__ __forceinline__ void page_row(const PageTableParams& t, int b, int64_t& base, int64_t& len) {
  if (t.indptr) {
    int64_t a = t.indptr[b], c = t.indptr[b + 1];
    a = a < 0 ? 0 : (a > t.row_capacity ? t.row_capacity : a);
    c = c < a ? a : (c > t.row_capacity ? t.row_capacity : c);
    base = a;
    len = c - a;
  } else {
    base = static_cast<int64_t>(b) * t.row_stride;
    len = t.row_capacity;
  }
}

}  // namespace msa::detail::cuda::paged
