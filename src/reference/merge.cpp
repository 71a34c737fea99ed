// Reference merge of split attention states (contract §5): the parts are softmax-normalized over
// disjoint key sets, so o = sum_s exp(lse_s - lse) * v_s with lse = log(sum_s exp(lse_s)).
#include <cmath>
#include <limits>
#include <vector>

#include "core/backend.h"
#include "reference/parallel.h"
#include "reference/scalar.h"

namespace msa::detail::reference {

namespace {

void merge_item(const MergeParams& p, int64_t t, int32_t h, std::vector<double>& acc) {
  const auto lse_of = [&](int32_t s) {
    return p.lse[s * p.lse_stride_split + t * p.lse_stride_token + h * p.lse_stride_head];
  };
  // The largest part sets the exponent base. A part at -inf holds no key and is never read (its v
  // may be uninitialized); if every part is -inf the row is empty. A NaN lse propagates to the output.
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  bool any = false;
  float m = kNegInf;
  for (int32_t s = 0; s < p.num_splits; ++s) {
    const float l = lse_of(s);
    if (l == kNegInf) continue;
    any = true;
    if (!(l <= m)) m = l;
  }
  const int64_t o_base = t * p.o_stride_token + h * p.o_stride_head;
  float* lse_out = p.lse_out ? p.lse_out + t * p.lse_out_stride_token + h * p.lse_out_stride_head : nullptr;
  if (!any) {
    for (int32_t d = 0; d < p.head_dim; ++d) store_scalar(p.o, p.o_dtype, o_base + d, 0.f);
    if (lse_out) *lse_out = kNegInf;
    return;
  }
  acc.assign(p.head_dim, 0.0);
  double sum = 0.0;
  for (int32_t s = 0; s < p.num_splits; ++s) {
    const float l = lse_of(s);
    if (l == kNegInf) continue;
    const double w = std::exp(double(l) - m);
    sum += w;
    const int64_t base = s * p.v_stride_split + t * p.v_stride_token + h * p.v_stride_head;
    for (int32_t d = 0; d < p.head_dim; ++d) acc[d] += w * load_scalar(p.v, p.v_dtype, base + d);
  }
  for (int32_t d = 0; d < p.head_dim; ++d) store_scalar(p.o, p.o_dtype, o_base + d, static_cast<float>(acc[d] / sum));
  if (lse_out) *lse_out = static_cast<float>(m + std::log(sum));
}

}  // namespace

void merge_states(const MergeParams& p) {
  const int64_t items = p.num_tokens * p.num_heads;
  std::vector<std::vector<double>> scratch(worker_count(items));
  parallel_for(items, [&](int64_t i, int worker) {
    merge_item(p, i / p.num_heads, static_cast<int32_t>(i % p.num_heads), scratch[worker]);
  });
}

}  // namespace msa::detail::reference
