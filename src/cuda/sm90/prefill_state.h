// What a prefill plan holds for the Hopper kernels: the decomposition chosen from the host lengths
// (tile shape, tile count, KV-major windows) and every workspace the run-time passes write.
#pragma once

#include <cstdint>

#include "cuda/common/device_buffer.cuh"
#include "cuda/common/stream_fork.h"
#include "cuda/plan_state.h"
#include "cuda/sm90/schedule.h"

namespace msa::detail::cuda::sm90 {

struct PrefillState {
  int sm_count = 0;
  int32_t batch_size = 0;
  int32_t num_kv_heads = 0;
  int32_t group_shift = 0;   // log2(G)
  int32_t tile_tokens = 0;   // 128 / G
  int32_t page_blocks = 1;   // page_size / 128
  int32_t topk = 0;          // 0: dense
  bool causal = true;
  int32_t num_tiles = 0;     // canonical tiles of the plan's lengths
  KvMajorRule rule = KvMajorRule::kNever;
  bool kv_tma_store = false;  // KV-major partials through TMA stores (config.h kKvTmaStore)
  int32_t kv_tail_items = 0, kv_tail_sub_tiles = 0;  // KvMajorParams::tail_items / tail_sub_tiles
  // The run's kernels after the first launch with programmatic dependent launch where the previous
  // launch of the stream is one of ours: lists after schedule, scan / fill / KV-major kernel / merge after
  // the kernel before them, the query-major kernel when it follows lists or schedule on the caller's
  // stream. Not rank (after a memset) nor the forked query-major kernel (behind an event), and not the
  // schedule kernel, whose predecessor is the caller's. Each of those kernels waits for its predecessor
  // (grid_dependency_wait) before anything else. MSA_SM90_PDL=0: plain stream order.
  bool pdl = true;
  bool pdl_merge = false;  // the merge too (MSA_SM90_PDL_MERGE=1; under measurement)

  DeviceBuffer tile_cum;  // [B + 1]
  DeviceBuffer blk_cum;   // [B + 1]
  DeviceBuffer counters;  // [2 + 2 * kv windows]: query-major tile counter, an item counter per window,
                          // the KV-major tile count per window, and the count of qm_tiles

  // Sparse: per-tile block unions (tile_lists) and the path of each tile.
  DeviceBuffer list_entries, list_count, kv_major;
  DeviceBuffer qm_tiles;  // [num_tiles] with a KV-major path: the query-major tiles, compacted
  int32_t list_capacity = 0;

  // KV-major (rule != kNever).
  int32_t window_tiles = 0, num_windows = 0, subwindow_tiles = 0, block_keys = 0, key_span = 0, item_capacity = 0;
  int32_t key_stripes = 4;  // rank counters used per key (config.h kKeyStripesWideKeys; MSA_SM90_KEY_STRIPES)
  DeviceBuffer key_count, key_offset, entry_key, entry_rank, pairs, items, item_count, part_o, part_lse;
  // The query-major kernel on a side stream beside the KV-major launches (both read the tile lists and
  // write disjoint rows of o / lse); empty when the plan has no KV-major path or MSA_SM90_KV_CONCURRENT=0.
  StreamFork fork;
};

}  // namespace msa::detail::cuda::sm90
