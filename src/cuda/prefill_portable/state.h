// What a prefill plan holds for the portable KV-major path: the decomposition chosen from the host
// lengths (tiles, windows, the K/V stages of the device) and every workspace its run-time passes write.
// The tile lists, key lists and partial outputs have the Hopper KV-major path's layout
// (prefill_sm90/params.h: TileSchedule, KvLists), built by the same arch-neutral passes.
#pragma once

#include <cstdint>

#include "cuda/prefill_sm90/schedule.h"
#include "cuda/runtime/device_buffer.cuh"

namespace msa::detail::cuda::prefill_portable {

struct PortableState {
  int sm_count = 0;
  bool pdl = false;          // programmatic dependent launch (sm_90+)
  int kv_stages = 0;         // 1 or 2 (config.h), from the device's shared-memory opt-in
  int32_t batch_size = 0;
  int32_t num_kv_heads = 0;
  int32_t group_shift = 0;   // log2(G), G >= kMinGroup
  int32_t tile_tokens = 0;   // 128 / G: the paged state's tile_tokens too
  int32_t page_blocks = 1;   // page_size / 128
  int32_t topk = 0;
  bool causal = true;
  int32_t num_tiles = 0;     // canonical tiles (prefill_sm90 numbering) of the plan's lengths
  int64_t paged_items = 0;   // the paged kernel's grid items (its tiles x KV heads)
  prefill_sm90::KvMajorRule rule = prefill_sm90::KvMajorRule::kWideUnion;
  bool f8_ready = false;     // the fp8 K/V instances are configured too

  DeviceBuffer tile_cum, blk_cum;  // [B + 1]
  DeviceBuffer counters;           // [2 + 2 * windows]: unused, an item counter per window, the KV-major
                                   // tile count per window, unused (prefill_sm90's counter layout)
  DeviceBuffer list_entries, list_count, kv_major;  // the tile-list pass's outputs
  DeviceBuffer skip_items;         // [paged_items]: nonzero for the paged items of KV-major tiles

  int32_t list_capacity = 0;
  int32_t window_tiles = 0, num_windows = 0, subwindow_tiles = 0, block_keys = 0, key_span = 0, item_capacity = 0;
  int32_t key_stripes = 4;
  DeviceBuffer key_count, key_offset, entry_key, entry_rank, pairs, items, item_count, part_o, part_lse;
};

// skip_items[item of tile t] = kv_major[t] for every live tile t (the paged kernel's item of request b,
// chunk c, KV head h is (tile_cum[b] / Hkv + c) * Hkv + h: its tiles are the canonical tiles in request
// and chunk order, same tile_tokens). Every live item is rewritten at every run, since a tile's path
// follows its selections; items past the live tiles are past the device lengths, where the paged kernel
// has no tile whatever the flag.
void launch_item_flags(const SeqParams& seqs, const prefill_sm90::TileSchedule& sched, const int32_t* kv_major,
                       int32_t* skip_items, int64_t paged_items, bool pdl, cudaStream_t stream);

}  // namespace msa::detail::cuda::prefill_portable
