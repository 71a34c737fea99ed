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
  // Programmatic dependent launch (PDL, MSA_SM90_PDL=1; off by default, measured below) where a launch
  // follows a kernel of this run on the same stream: the lists after the schedule, the query-major kernel
  // right after the lists (or the schedule) on the caller's stream (not when forked: its predecessor there
  // is an event wait). Every kernel of the run waits for its predecessor (grid_dependency_wait) before
  // anything else, so either launch is correct. pdl_kv (MSA_SM90_PDL_KV=1) adds scan, fill and the KV-major
  // kernel. H200, in one process each: with every launch after the first under PDL (the merge included),
  // the merge took 77 -> 87 us at M3-TP4 P-chunk and 277 -> 315 us at M3-TP1 P-chunk (its CTAs waiting on
  // the SMs the KV-major kernel left); without the merge (prefill-20261130-f8af4b0-pdl-ab.md) M3-TP4 P-chunk
  // `random` went 263.6-264.4 -> 268.3-269.2 us (timed calls bimodal, 259-262 and 268-270), M3-TP1 P-32K
  // 6652-6867 -> 6534-6553, the others equal; with the lists alone (ab08373, prefill-20261130-ab08373-pdl-
  // front-ab.md) M3-TP4 P-chunk `random` 265.1 -> 272.7 us, `shared` 133.8 -> 133.0, M3-TP1 P-chunk `random`
  // 914.3 -> 910.5. The row nearest its bar loses, so plain stream order stays the default.
  bool pdl = false;
  bool pdl_kv = false;

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
