// sparse_attention_layer: the indexer's two steps and the sparse attention, composed. Each step
// validates its own arguments; this adds only the checks that tie them together.
#include "core/checks.h"
#include "core/value_checks.h"
#include "msa/error.h"
#include "msa/ops.h"

namespace msa {

void sparse_attention_layer(const Plan& plan, const TensorView& q, const TensorView& k, const TensorView& v,
                            const IndexerInputs& index, const PageTable& pages, const Sequences& seqs, int force_begin,
                            int force_end, const TensorView& scores, ScoreLayout layout, const TensorView& block_idx,
                            const TensorView& o, const TensorView& lse, const RunOptions& opts) {
  const char* fn = "msa.sparse_attention_layer";
  MSA_CHECK(plan.valid(), kValue, fn, ": argument 'plan': expected a plan from plan_prefill or plan_decode");
  const AttentionConfig& c = plan.config();
  MSA_CHECK(c.topk > 0, kValue, fn, ": argument 'plan': expected a sparse plan (topk > 0), got topk = 0");
  MSA_CHECK(index.q.defined() && index.q.ndim() == 3 && index.q.size(1) == c.num_kv_heads, kValue, fn,
            ": argument 'q_index': expected [total_q, num_kv_heads = ", c.num_kv_heads,
            ", index_head_dim] (one index head per KV head), got shape ",
            index.q.defined() ? index.q.shape_str() : std::string("None"));
  MSA_CHECK(index.k.defined() && index.k.ndim() == 4 && index.k.size(2) == c.page_size, kValue, fn,
            ": argument 'k_index': expected [num_pages, num_k_heads, page_size = ", c.page_size,
            ", index_head_dim] (it shares the page table of k and v), got shape ",
            index.k.defined() ? index.k.shape_str() : std::string("None"));
  // The attention's scales before the indexer steps launch.
  detail::check_scales(fn, opts);
  // The lengths against the plan first (where they are host-readable, as in each step): lengths past a
  // decode plan's limits are reported as such, not as a scores workspace too small for them.
  if (!plan.device().is_cuda() || opts.validate) {
    detail::seq_params(fn, seqs, plan.batch_size(), plan.device(), index.q.size(0));
    detail::check_seq_values(fn, detail::host_seqs(seqs, opts.stream), plan.batch_size(), index.q.size(0), c.causal,
                             &plan, "q_index");
  }
  block_scores(index.q, index.k, index.k_scale, pages, seqs, scores, layout, c.causal, opts);
  select_topk(scores, layout, seqs, c.topk, force_begin, force_end, block_idx, c.causal, opts);
  attention(plan, q, k, v, pages, seqs, block_idx, o, lse, opts);
}

}  // namespace msa
