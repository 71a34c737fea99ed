// What one launch of the paged attention kernel needs: the validated call (AttentionParams), the
// plan's decomposition and its workspaces. Passed by value (kernel parameter space).
#pragma once

#include <cstdint>

#include "core/params.h"

namespace msa::detail::cuda::decode {

// At most how many page-table entries a decode CTA prefetches into the L2 before its PDL wait
// (KernelParams::prewait_prefetch; 64 lines of 128 bytes, two per lane of warp 0: a request of up to 262144
// tokens at 128-token pages).
constexpr int kPrefetchPageEntries = 2048;

struct KernelParams {
  AttentionParams a;
  float scale_log2 = 0.f;  // sm_scale * log2(e): logits live in the exp2 domain

  // Tiles of a request's query tokens.
  int32_t group_pad = 1;        // GP: the GQA group padded to a power of two; rows per token
  int32_t tile_tokens = 1;      // T <= ROWS / GP
  int32_t tiles_per_req = 1;    // decode: grid.x = batch_size * tiles_per_req, tile = x % tiles_per_req
  bool scan_tiles = false;      // prefill: grid.x = sum_b ceil(qo_len_b / T), tile found by a scan of qo_indptr

  // Splits of a tile's block list.
  int32_t num_splits = 1;       // S = gridDim.z
  uint32_t split_magic = 1;     // ceil(2^16 / S): the token kernel's x / S for x <= 47 and S <= 16 (token_kernel.cuh)
  int32_t fixed_split_blocks = 0;  // > 0: split s covers list entries [s*F, (s+1)*F), the last runs to the end
  int32_t num_stages = 3;
  int32_t list_cap = 0;         // sort capacity (power of two >= T * topk); 0 for dense plans

  // Decode: request b's tokens are guessed to start at b * spec_qo_len (a full batch), so that the
  // block indexes are read together with qo_indptr instead of after it (checked, reread on a miss).
  // 0: no guess (prefill, dense).
  int32_t spec_qo_len = 0;
  // The token kernel: grid.x = batch << tq_shift, 2^tq_shift >= spec_qo_len (CTA x: request x >> tq_shift).
  int32_t tq_shift = 0;
  // log2(page_size) when it is a power of two (the page of key j is j >> page_shift), else -1.
  int32_t page_shift = -1;

  // Decode, before the PDL wait: the L2 prefetch of the first trip's lines (index rows, lengths) and of the
  // first prefetch_page_entries entries of the request's page-table row (dense form: those up to the plan's
  // max_kv_len, at most kPrefetchPageEntries; 0 for the flat form, whose row base is itself a device read).
  bool prewait_prefetch = false;
  int32_t prefetch_page_entries = 0;

  // S > 1 on sm_90: the S splits of an item form one thread-block cluster and merge through
  // distributed shared memory (split_merge.cuh); the workspaces below are then unused. S > 1 without it: the
  // general kernel's workspace merge, or the single-token kernel's splits merged by token_merge_kernel.cu.
  bool cluster_merge = false;
  // With cluster_merge: the splits per cluster (S: one level). Below S (the general kernel's two levels: dense decode
  // of few items at long context, where clusters of at most 16 would leave most SMs idle), each cluster's merged
  // rows go to the workspace as one of S / cluster_size partials, which the last CTA of the item merges.
  int32_t cluster_size = 0;

  // Workspaces (S > 1): per item (tile, KV head) and split, fp32 o of ROWS rows and their lse, and
  // one arrival counter per item (zero between launches: the last CTA resets it; the single-token kernel's
  // splits take none).
  float* part_o = nullptr;
  float* part_lse = nullptr;
  uint32_t* counters = nullptr;

  // Prefill with a KV-major path (src/cuda/prefill_portable/): per item (tile x, KV head), at
  // x * gridDim.y + head, nonzero when the KV-major path computes the item's rows; every split of such
  // an item returns at once, writing nothing. null: no item is skipped.
  const int32_t* skip_items = nullptr;
};

}  // namespace msa::detail::cuda::decode
