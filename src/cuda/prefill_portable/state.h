// What a prefill plan holds for the portable KV-major path: the decomposition chosen from the host
// lengths (tiles, windows, the K/V stages of the device) and every workspace its run-time passes write.
// The tile lists, key lists and partial outputs have the Hopper KV-major path's layout
// (prefill_sm90/params.h: TileSchedule, KvLists), built by the same arch-neutral passes.
#pragma once

#include <cstdint>

#include "cuda/prefill_sm90/kvmajor_state.h"
#include "cuda/prefill_sm90/schedule.h"
#include "cuda/runtime/device_buffer.cuh"

namespace msa::detail::cuda::prefill_portable {

// The tile lists and KV-major lists (prefill_sm90::KvListState: G >= kMinGroup, tile_tokens = 128 / G, the
// paged state's too; of `counters`, the query-major slots are unused), and what only this path needs.
struct PortableState : prefill_sm90::KvListState {
  int sm_count = 0;
  bool pdl = false;          // programmatic dependent launch (sm_90+)
  int kv_stages = 0;         // 1 or 2 (config.h), from the device's shared-memory opt-in
  int32_t batch_size = 0;
  int32_t page_blocks = 1;   // page_size / 128
  int64_t paged_items = 0;   // the paged kernel's grid items (its tiles x KV heads)
  bool f8_ready = false;     // the fp8 K/V instances are configured too
  DeviceBuffer skip_items;   // [paged_items]: nonzero for the paged items of KV-major tiles
};

// skip_items[item of tile t] = kv_major[t] for every live tile t (the paged kernel's item of request b,
// chunk c, KV head h is (tile_cum[b] / Hkv + c) * Hkv + h: its tiles are the canonical tiles in request
// and chunk order, same tile_tokens). Every live item is rewritten at every run, since a tile's path
// follows its selections; items past the live tiles are past the device lengths, where the paged kernel
// has no tile whatever the flag.
void launch_item_flags(const SeqParams& seqs, const prefill_sm90::TileSchedule& sched, const int32_t* kv_major,
                       int32_t* skip_items, int64_t paged_items, bool pdl, cudaStream_t stream);

}  // namespace msa::detail::cuda::prefill_portable
