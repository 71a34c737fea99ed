// Checks of the values in the index and length tensors: the lengths, the page table's entries, the
// block indexes. They run where those values are host-readable (CPU tensors: always; CUDA tensors:
// with RunOptions::validate, which copies them to the host and so synchronizes).
#pragma once

#include <cstdint>

#include "core/checks.h"
#include "core/params.h"
#include "msa/ops.h"
#include "msa/plan.h"

namespace msa::detail {

// Host copies of the sequence tensors (views on the CPU, copies on CUDA).
struct HostSeqs {
  HostInts qo_indptr, kv_lens, qo_offset;
  int64_t qo_start(int64_t b) const { return qo_indptr.at(b); }
  int64_t qo_len(int64_t b) const { return qo_indptr.at(b + 1) - qo_indptr.at(b); }
  int64_t kv_len(int64_t b) const { return kv_lens.at(b); }
  int64_t offset(int64_t b) const { return qo_offset.empty() ? kv_len(b) - qo_len(b) : qo_offset.at(b); }
};
HostSeqs host_seqs(const Sequences& s, void* stream);

// qo_indptr monotone and within the tokens of `tokens_arg` (total_q of them), kv_lens >= 0, causal
// offsets; with a plan, the lengths within its limits (decode) or equal to its lengths (prefill).
void check_seq_values(const char* fn, const HostSeqs& h, int64_t B, int64_t total_q, bool causal, const Plan* plan,
                      const char* tokens_arg = "q");

// Page-table extent (every existing key has a row entry) and, when `entries`, every entry a page of the pool.
void check_page_values(const char* fn, const PageTable& pt, const PageTableParams& p, const HostSeqs& h, int64_t B,
                       int64_t page_size, bool entries, void* stream);

// Every non-negative block index below ceil(kv_len / 128), none twice in a row.
void check_block_idx_values(const char* fn, const TensorView& bi, const HostSeqs& h, int64_t B, void* stream);

}  // namespace msa::detail
