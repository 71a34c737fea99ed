// Device reads of a request's lengths, clamped: nothing read from the device is trusted (shared by
// the paged kernels).
#pragma once

#include <climits>
#include <cstdint>

#include "core/params.h"

namespace msa::detail::cuda::decode {

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

}  // namespace msa::detail::cuda::decode
