// Internal entry points of dispatch.cpp that the composed ops (layer.cpp) call; not public API.
#pragma once

#include "msa/ops.h"

namespace msa::detail {

// select_topk(scores, ..., plan.config().topk, ..., block_idx, plan.config().causal) then attention(plan, ...,
// block_idx, ...): one kernel where the CUDA plan's kernel selects the blocks itself (decode plans of the
// single-token kernel, rows of at most 512 blocks), else the two calls. Every argument is checked as the two
// calls check it, before anything is launched.
void select_topk_then_attention(const Plan& plan, const TensorView& q, const TensorView& k, const TensorView& v,
                                const PageTable& pages, const Sequences& seqs, const TensorView& scores,
                                ScoreLayout layout, int force_begin, int force_end, const TensorView& block_idx,
                                const TensorView& o, const TensorView& lse, const RunOptions& opts);

}  // namespace msa::detail
