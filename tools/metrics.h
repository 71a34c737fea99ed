// The figures of spec/benchmarks.md "Metrics", computed from a workload's selections.
#pragma once

#include "workload.h"

namespace msa::cli {

// Prefill: effective FLOPs = 4 * D * (attended (query head, key) pairs); masked work does not count.
// Pattern indexer adds the block scores: 2 * Di * (index heads) * (visible (token, key) pairs).
double effective_flops(const Workload& w);
// Decode: bytes of the selected K and V blocks, each counted once per request and KV head (the keys
// that exist), plus the q and o bytes. Pattern indexer adds the index-K keys each request sees once
// and the index q bytes.
double effective_bytes(const Workload& w);

}  // namespace msa::cli
