#include "runner.h"

#include <algorithm>

namespace msa::cli {

double RunResult::median_ms() const {
  if (times_ms.empty()) return 0.0;
  std::vector<double> t = times_ms;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

AttentionArgs attention_args(const Workload& w, const WorkloadBuffers& buf, Device dev) {
  const AttentionConfig& c = w.cfg;
  const int64_t B = w.batch();
  AttentionArgs a;
  a.q = TensorView(buf.q, DType::kBF16, {w.total_q, c.num_qo_heads, c.head_dim}, {}, dev);
  const DType kv = w.k.dtype == KvDtype::kFp8 ? DType::kF8E4M3 : DType::kBF16;
  a.k = TensorView(buf.k, kv, {w.num_pages, c.num_kv_heads, c.page_size, c.head_dim}, {}, dev);
  a.v = TensorView(buf.v, kv, {w.num_pages, c.num_kv_heads, c.page_size, c.dv()}, {}, dev);
  a.o = TensorView(buf.o, DType::kBF16, {w.total_q, c.num_qo_heads, c.dv()}, {}, dev);
  if (c.topk > 0) a.block_idx = TensorView(buf.block_idx, DType::kI32, {w.total_q, c.num_kv_heads, c.topk}, {}, dev);
  a.pages.table = TensorView(buf.page_table, DType::kI32, {B, w.max_pages}, {}, dev);
  a.seqs.qo_indptr = TensorView(buf.qo_indptr, DType::kI32, {B + 1}, {}, dev);
  a.seqs.kv_lens = TensorView(buf.kv_lens, DType::kI32, {B}, {}, dev);
  if (w.indexer) {
    a.index.q = TensorView(buf.q_index, DType::kBF16, {w.total_q, c.num_kv_heads, kIndexHeadDim}, {}, dev);
    a.index.k = TensorView(buf.k_index, DType::kBF16, {w.num_pages, kIndexKHeads, c.page_size, kIndexHeadDim}, {}, dev);
    a.scores = TensorView(buf.scores, DType::kF32, {w.total_q, c.num_kv_heads, w.max_blocks}, {}, dev);
  }
  return a;
}

RunOptions run_options(const Workload& w) {
  RunOptions opts;
  opts.k_scale = w.k.scale;
  opts.v_scale = w.v.scale;
  return opts;
}

void run_call(const Workload& w, const Plan& plan, const AttentionArgs& a, const RunOptions& opts) {
  if (w.indexer)
    sparse_attention_layer(plan, a.q, a.k, a.v, a.index, a.pages, a.seqs, kForceBegin, kForceEnd, a.scores,
                           ScoreLayout::kTHK, a.block_idx, a.o, {}, opts);
  else
    attention(plan, a.q, a.k, a.v, a.pages, a.seqs, a.block_idx, a.o, {}, opts);
}

Plan make_plan(const Workload& w, Device dev) {
  if (w.phase == Phase::kPrefill) return plan_prefill(w.cfg, dev, w.qo_lens, w.kv_lens);
  const int max_qo = *std::max_element(w.qo_lens.begin(), w.qo_lens.end());
  const int64_t max_kv = *std::max_element(w.kv_lens.begin(), w.kv_lens.end());
  return plan_decode(w.cfg, dev, static_cast<int>(w.batch()), max_qo, max_kv);
}

}  // namespace msa::cli
