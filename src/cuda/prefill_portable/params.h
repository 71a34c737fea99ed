// Kernel parameters of the portable KV-major prefill: a plain struct passed by value.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "cuda/prefill_sm90/params.h"

namespace msa::detail::cuda::prefill_portable {

// The work lists (keys, work items, {q row, window entry} pairs, partial outputs) are the Hopper KV-major
// path's, built by the same arch-neutral passes (prefill_sm90/kvmajor_lists.h).
using prefill_sm90::KvLists;
using prefill_sm90::KvWorkItem;

struct KvParams {
  const void* q = nullptr;                 // [total_q, Hq, D], q's dtype
  int64_t q_stride_token = 0, q_stride_head = 0;
  CacheParams k, v;                        // K/V in q's dtype or fp8 e4m3
  SeqParams seqs;
  PageTableParams pages;
  KvLists lists;
  int32_t window = 0;
  int32_t group_shift = 0;                 // log2(G), G >= kMinGroup
  int32_t page_blocks = 1;                 // page_size / 128
  bool causal = true;
  float scale_log2 = 0.f;                  // sm_scale * log2(e)
};

}  // namespace msa::detail::cuda::prefill_portable
