// What a prefill plan holds for the Hopper kernels: the decomposition chosen from the host lengths
// (tile shape, tile count, KV-major windows) and every workspace the run-time passes write.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/runtime/device_buffer.cuh"
#include "cuda/runtime/stream_fork.h"
#include "cuda/plan_state.h"
#include "cuda/prefill_sm90/schedule.h"

namespace msa::detail::cuda::prefill_sm90 {

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
  bool f8_ready = false;     // the fp8 K/V kernels of the plan's paths hold sm_90a code and are configured

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
  int32_t key_stripes = 4;  // rank counters used per key (config.h kKeyStripesWideKeys)
  DeviceBuffer key_count, key_offset, entry_key, entry_rank, pairs, items, item_count, part_o, part_lse;
  // The TMA map of part_o for bf16 and fp16 q, encoded at plan time: part_o is the plan's, so a run need not
  // encode it (~1-2 us of host time a map on the H200 machine, bench/run_host.py).
  CUtensorMap part_map_bf16{}, part_map_f16{};
  // The KV-major launches on a side stream beside the query-major kernel (both read the tile lists and
  // write disjoint rows of o / lse); empty when the plan has no KV-major path.
  StreamFork fork;
};

}  // namespace msa::detail::cuda::prefill_sm90
