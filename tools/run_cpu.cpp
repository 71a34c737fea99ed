#include <chrono>
#include <vector>

#include "bf16.h"
#include "runner.h"

namespace msa::cli {

RunResult run_on_cpu(const Workload& w, int repeat) {
  const Device cpu{};
  RunResult r;
  // NaN-filled, so a row the backend never writes fails the check.
  r.o.assign(static_cast<size_t>(w.total_q) * w.cfg.num_qo_heads * w.cfg.dv(), kBf16NaN);
  WorkloadBuffers buf;
  buf.q = w.q.data.get();
  buf.k = w.k.data();
  buf.v = w.v.data();
  buf.o = r.o.data();
  // TensorViews take mutable pointers; the inputs are only read.
  buf.page_table = const_cast<int32_t*>(w.page_table.data());
  buf.qo_indptr = const_cast<int32_t*>(w.qo_indptr.data());
  buf.kv_lens = const_cast<int32_t*>(w.kv_lens.data());
  buf.block_idx = w.block_idx.empty() ? nullptr : const_cast<int32_t*>(w.block_idx.data());
  std::vector<float> scores;
  if (w.indexer) {  // the layer writes its selections into the result, its scores into a workspace
    r.block_idx.assign(w.block_idx.size(), -1);
    buf.block_idx = r.block_idx.data();
    scores.resize(static_cast<size_t>(w.total_q) * w.cfg.num_kv_heads * w.max_blocks);
    buf.q_index = w.q_index.data.get();
    buf.k_index = w.k_index.data.get();
    buf.scores = scores.data();
  }
  const AttentionArgs a = attention_args(w, buf, cpu);
  const Plan plan = make_plan(w, cpu);
  r.plan = plan.describe();
  const RunOptions opts = run_options(w);  // on the CPU every call checks the page ids and block ids anyway
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run_call(w, plan, a, opts);
    const auto t1 = std::chrono::steady_clock::now();
    r.times_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return r;
}

}  // namespace msa::cli
