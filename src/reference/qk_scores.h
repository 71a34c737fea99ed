// s[j] = q . k_j for keys stored transposed (kt[d * n + j]): the inner loop runs over keys with unit
// stride, so it vectorizes without reassociating a dot product. Shared by attention and block scores.
#pragma once

#include <algorithm>
#include <cstdint>

namespace msa::detail::reference {

inline void qk_scores(const float* q, const float* kt, int32_t D, int64_t n, float* s) {
  std::fill(s, s + n, 0.f);
  for (int32_t d = 0; d < D; ++d) {
    const float qd = q[d];
    const float* kd = kt + int64_t(d) * n;
    for (int64_t j = 0; j < n; ++j) s[j] += qd * kd[j];
  }
}

}  // namespace msa::detail::reference
