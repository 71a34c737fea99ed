// Run-time work lists of the Hopper prefill: every length and selection is read on the device,
// so run() stays launch-only and a captured graph replays correctly after the caller rewrites
// lengths, page table or block indexes in place (within the plan's tile count).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/params.h"

namespace msa::detail::cuda::prefill_sm90 {

// tile_cum[0..B] (prefix of ceil(qo_len / tile_tokens) * Hkv) and blk_cum[0..B] (prefix of
// ceil(kv_len / 128) * Hkv) from the device lengths, and zeroes counters[0..num_counters) (the
// kernels' dynamic work counters). One CTA.
void launch_tile_schedule(const SeqParams& seqs, int32_t tile_tokens, int32_t num_kv_heads, int32_t* tile_cum,
                          int32_t* blk_cum, int32_t* counters, int32_t num_counters, cudaStream_t stream);

// Which tiles go KV-major: never, always, or when the union of a tile's blocks exceeds
// TileListParams::union_ratio_x4 / 4 times its tokens' mean selection count (query-major would compute
// more block-steps per useful one than that; each family's config.h: kKvMajorUnionRatioX4).
enum class KvMajorRule : int32_t { kNever = 0, kAlways = 1, kWideUnion = 2 };

struct TileListParams {
  SeqParams seqs;
  TileSchedule sched;
  bool causal = true;
  const int32_t* block_idx = nullptr;
  int64_t bi_stride_token = 0, bi_stride_head = 0, bi_stride_k = 0;
  int32_t topk = 0;
  KvMajorRule rule = KvMajorRule::kNever;
  int32_t union_ratio_x4 = kKvMajorUnionRatioX4;  // kWideUnion's threshold, in quarters
  int2* entries = nullptr;    // [sched.num_tiles, capacity]
  int32_t* count = nullptr;   // [sched.num_tiles]
  int32_t* kv_major = nullptr;  // [sched.num_tiles]
  int32_t capacity = 0;       // tile_tokens * topk
  int32_t* window_kv_tiles = nullptr;  // [windows]: KV-major tiles counted per window (zeroed); null: none
  int32_t window_tiles = 1;            // tiles per KV-major window
  int32_t* qm_tiles = nullptr;         // [sched.num_tiles]: query-major tiles appended here; null: not listed
  int32_t* qm_count = nullptr;         // their count (zeroed by the schedule kernel)
  // fp8 K/V with the plan's 16-bit copy of the blocks (fp8_copy.h): every query-major tile sets the flag of
  // (copy page, KV head) of each block of its union; null: no copy this run.
  uint8_t* copy_flags = nullptr;       // [copy_pages * Hkv] flags of kCopyFlagBytes
  const int32_t* blk_cum = nullptr;    // [B + 1]: the schedule kernel's
  int32_t copy_pages = 0;
};

// For every tile: the sorted union of its tokens' valid selections (contributing_block) with the
// bitmask of tokens that chose each block (duplicates inside a row fold into one entry), the tile's
// path, the count of KV-major tiles per window, and (copy_flags) the fp8 copy's flags of query-major tiles. A
// warp per tile (a sort in registers) up to kListWarpMaxEntries entries per tile, a CTA per tile above.
// pdl: launched with programmatic dependent launch (right after the schedule kernel).
void launch_tile_lists(const TileListParams& p, bool pdl, cudaStream_t stream);

}  // namespace msa::detail::cuda::prefill_sm90
