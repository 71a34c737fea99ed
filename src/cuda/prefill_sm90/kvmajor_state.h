// What a prefill plan holds for its tile lists and KV-major work lists, shared by the Hopper family
// (prefill_state.h) and the portable one (prefill_portable/state.h): both build the same lists with the
// same arch-neutral passes (schedule.h, kvmajor_lists.h) and merge the same partial outputs.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "cuda/prefill_sm90/kvmajor_lists.h"
#include "cuda/prefill_sm90/params.h"
#include "cuda/prefill_sm90/schedule.h"
#include "cuda/runtime/device_buffer.cuh"

namespace msa::detail::cuda::prefill_sm90 {

struct KvListState {
  int32_t num_kv_heads = 0;
  int32_t group_shift = 0;   // log2(G)
  int32_t tile_tokens = 0;   // 128 / G
  int32_t topk = 0;          // 0: dense
  bool causal = true;
  int32_t num_tiles = 0;     // canonical tiles of the plan's lengths
  KvMajorRule rule = KvMajorRule::kNever;
  int32_t union_ratio_x4 = kKvMajorUnionRatioX4;  // the family's kWideUnion threshold (config.h), in quarters

  DeviceBuffer tile_cum;  // [B + 1]
  DeviceBuffer blk_cum;   // [B + 1]
  DeviceBuffer counters;  // [2 + 2 * kv windows]: query-major tile counter, an item counter per window,
                          // the KV-major tile count per window, and the count of query-major tiles

  // Sparse: per-tile block unions (tile_lists) and the path of each tile.
  DeviceBuffer list_entries, list_count, kv_major;
  int32_t list_capacity = 0;

  // KV-major (rule != kNever).
  int32_t window_tiles = 0, num_windows = 0, subwindow_tiles = 0, block_keys = 0, key_span = 0, item_capacity = 0;
  int32_t key_stripes = 4;  // rank counters used per key (config.h kKeyStripesWideKeys)
  DeviceBuffer key_count, key_offset, entry_key, entry_rank, pairs, items, item_count, part_o, part_lse;
};

// Sizes the KV-major windows for `total_blocks` blocks of the plan and allocates the key arrays and the
// partial outputs (MSA_SM90_KV_WINDOW_TILES caps a window); false, allocating nothing, when the key arrays
// would be unreasonably large (a huge batch of long requests: the query-major path serves it).
bool plan_kv_windows(KvListState& s, int64_t total_blocks);

TileSchedule schedule_of(const KvListState& s);
KvLists kv_lists_of(const KvListState& s);
// The tile-list pass's parameters for a run (the caller adds the query-major tile list, if any).
TileListParams tile_list_params(const KvListState& s, const AttentionParams& p);
// The KV-major list passes' parameters for a run.
KvListParams kv_list_params(const KvListState& s, const AttentionParams& p);
// The LSE merge's parameters for a run (natural partial rows; the caller sets the window and the row order).
KvMergeParams kv_merge_params(const KvListState& s, const AttentionParams& p);

}  // namespace msa::detail::cuda::prefill_sm90
