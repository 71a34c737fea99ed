// The demo's independent check: for a sample of (token, query head) rows, attention recomputed in
// float64 straight from the definition (gather the selected keys through the page table, causal
// mask, softmax), compared with the backend's bf16 output. An fp8 cache enters as its dequantized
// values (e4m3 value x scale), so the contract's tolerance holds unchanged. Shares no code with src/reference.
#pragma once

#include <cstdint>
#include <vector>

#include "workload.h"

namespace msa::cli {

struct CheckRow {
  int64_t token = 0;
  int head = 0;
};

// `count` distinct rows (all of them when count >= total): the first query token (the sparsest
// causal edge of its own block) and the last one, head 0 and the last head, then uniform draws.
std::vector<CheckRow> sample_rows(const Workload& w, int64_t count, uint64_t seed);

struct CheckResult {
  int64_t rows = 0;
  int64_t nan_values = 0;  // NaN or inf in the backend's output rows
  double max_abs = 0.0;    // max |o - ref| over the rows
  double rel_l2 = 0.0;     // ||o - ref|| / ||ref|| over the rows
  bool pass() const;       // no NaN, rel_l2 < kMaxRelL2, max_abs < kMaxAbs
};

// o: the backend's output [total_q, Hq, D] in bf16.
CheckResult check_rows(const Workload& w, const uint16_t* o, const std::vector<CheckRow>& rows);

// Pattern indexer: the selections of the (token, KV head) rows behind `rows` (w.block_idx, as the layer
// wrote it) against float64 block scores (max over the block's visible keys of index q . index k):
// ascending with -1 at the tail, min(top-k, valid blocks) entries, the own block in, and no block left
// out that scores above a chosen non-forced one by more than a relative 1e-3 (the fp32 accumulation of
// a 128-term dot product; ties may go either way). Returns how many rows fail.
int64_t check_selections(const Workload& w, const std::vector<CheckRow>& rows);

}  // namespace msa::cli
