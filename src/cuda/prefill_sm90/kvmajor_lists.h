// The KV-major path's run-time lists (see params.h, KvLists): for the tiles flagged KV-major by the
// tile-list pass, group every contributing (token, slot) entry by key = (window, sub-window, request,
// KV head, block), cut each key's list into work items, and after the attention kernel merge the partial
// outputs of each (token, head) by their LSEs.
#pragma once

#include <cuda_runtime.h>

#include "core/params.h"
#include "cuda/prefill_sm90/params.h"

namespace msa::detail::cuda::prefill_sm90 {

struct KvListParams {
  SeqParams seqs;
  TileSchedule sched;
  bool causal = true;
  const int32_t* block_idx = nullptr;
  int64_t bi_stride_token = 0, bi_stride_head = 0, bi_stride_k = 0;
  const int32_t* kv_major = nullptr;  // per tile, from launch_tile_lists
  KvLists lists;
};

// entry_key / entry_rank of every entry of the KV-major tiles (rank by atomics on the key_stripes (4 or 8)
// counters of its key in key_count, which must be zero; the rank is the place in the tile's stripe).
// Order inside a key's list is arbitrary; each entry's result does not depend on it.
// pdl (here and below): launched with programmatic dependent launch (launch.h).
void launch_kv_rank(const KvListParams& p, bool pdl, cudaStream_t stream);
// Per window: key_offset = exclusive scan of the keys' counts (stripes summed), work items of <=
// kKvItemTokens tokens.
void launch_kv_scan(const KvListParams& p, bool pdl, cudaStream_t stream);
// pairs[key_offset[key] + (the key's lower stripes) + rank] = {q token, window entry}.
void launch_kv_fill(const KvListParams& p, bool pdl, cudaStream_t stream);

struct KvMergeParams {
  SeqParams seqs;
  TileSchedule sched;
  const int32_t* kv_major = nullptr;
  KvLists lists;
  int32_t window = 0;
  int32_t group_shift = 0;
  ScalarType dtype = ScalarType::kBF16;
  void* o = nullptr;
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;
  int64_t lse_stride_token = 0, lse_stride_head = 0;
  float v_scale = 1.f;  // multiplies o, once, here: the partials are unscaled
  // The dim order of a partial row: false natural; true quad-major (the portable KV-major kernel's: bytes
  // 64q + 16m + 4i hold dims 32m + 8i + 2q, +1, i.e. what lane q of an mma.sync quad holds, stored whole).
  bool quad_major_partials = false;
};

// o / lse of every token of the window's KV-major tiles from its slots' partials (a slot without a
// partial, or with lse = -inf, weighs nothing; no partial at all gives o = 0, lse = -inf).
void launch_kv_merge(const KvMergeParams& p, bool pdl, cudaStream_t stream);

}  // namespace msa::detail::cuda::prefill_sm90
