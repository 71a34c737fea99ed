// The figures of spec/benchmarks.md "Metrics", computed from a workload's selections.
#pragma once

#include "workload.h"

namespace msa::cli {

// A phase's effective work, split between the layer's parts (the indexer's is 0 unless pattern indexer).
struct PhaseWork {
  double attention = 0.0;
  double indexer = 0.0;
  double total() const { return attention + indexer; }
};

// Prefill: effective FLOPs = 4 * D * (attended (query head, key) pairs); masked work does not count.
// Pattern indexer adds the block scores: 2 * Di * (index heads) * (visible (token, key) pairs).
// The selections must be the ones that ran (pattern indexer: the layer's own, in w.block_idx).
PhaseWork effective_flops(const Workload& w);
// Decode: bytes of the selected K and V blocks (1 per element for fp8, 2 for bf16), each counted once per
// request and KV head (the keys that exist), plus the q and o bytes. Pattern indexer adds the index-K keys
// each request sees once and the index q bytes (the fp32 scores workspace, under 1% of those at the demo's
// sizes, is left out).
PhaseWork effective_bytes(const Workload& w);

}  // namespace msa::cli
