// Kernel parameters of the Hopper prefill family: plain structs passed by value
// (__grid_constant__), so the TMA descriptors live in parameter space as cp.async.bulk.tensor wants.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/params.h"

namespace msa::detail::cuda::prefill_sm90 {

// Where the canonical work tiles are: tile ids [tile_cum[b], tile_cum[b+1]) belong to request b,
// (chunks of tile_tokens tokens) x (KV heads), the last chunk first so that a single causal request
// is walked longest-first. tile_cum is rebuilt on the device at every run from qo_indptr.
struct TileSchedule {
  const int32_t* tile_cum = nullptr;  // [batch_size + 1]
  int32_t num_tiles = 0;              // the plan's count (workspace extent); tiles past it are not run
  int32_t num_kv_heads = 0;
  int32_t tile_tokens = 0;            // 128 / G
};

// The sorted union of the valid selections of one tile: entry i = (block, token bitmask).
struct TileBlockLists {
  const int2* entries = nullptr;   // [num_tiles, capacity]
  const int32_t* count = nullptr;  // [num_tiles]
  const int32_t* kv_major = nullptr;  // [num_tiles]: 1 = the tile is served by the KV-major path
  int32_t capacity = 0;            // tile_tokens * topk
  // With a KV-major path: the query-major tiles, compacted (qm_tiles[0 .. *qm_count), in the order the
  // tile-list pass finished them). null: claim tile indexes and skip flagged ones.
  const int32_t* qm_tiles = nullptr;
  const int32_t* qm_count = nullptr;
};

struct QMajorParams {
  CUtensorMap q_map;  // [total_q, Hq, D] as {D, Hq, total_q}; box {64, G, tile_tokens}
  CUtensorMap k_map;  // [pages, Hkv, P, D] as {D, P, Hkv, pages}; box {64, 128, 1, 1}
                      // (fp8: 16-bit pseudo-elements {D / 2, ...}, one box a block)
  CUtensorMap v_map;
  SeqParams seqs;
  PageTableParams pages;
  TileSchedule sched;
  TileBlockLists lists;  // sparse only
  int32_t* tile_counter = nullptr;  // dynamic tile fetch, zeroed by the schedule kernel
  int32_t group_shift = 0;          // log2(G)
  int32_t page_blocks = 1;          // page_size / 128
  bool causal = true;
  float scale_log2 = 0.f;           // sm_scale * log2(e)
  void* o = nullptr;
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;
  int64_t lse_stride_token = 0, lse_stride_head = 0;
  float v_scale = 1.f;  // multiplies o (V's dequantization scale), not lse
};

// ---- KV-major path (sparse tiles whose union of blocks is too wide for query-major) ----------
//
// A window is a range of canonical tiles processed together; the (token, slot) selections of its
// KV-major tiles are grouped by key = (request, KV head, block) and every key's tokens attend to
// that block once, writing one partial (o, lse) per (token, slot, head), merged afterwards.

// Up to kKvItemTokens tokens of one key's list.
struct KvWorkItem {
  int32_t request, kv_head, block, start, count;
  int32_t unused[3];
};

// The KV-major lists of all windows. Window w covers canonical tiles [w * window_tiles, +window_tiles),
// cut into sub-windows of subwindow_tiles tiles. A key is (window, sub-window, request, KV head, block):
//   w * key_span + sub * block_keys + blk_cum[b] + kv_head * ceil(kv_len_b / 128) + block,
// so that the work items, written in key order and fetched in that order, walk one sub-window's
// tokens at a time (their Q stays in the L2 while every block they selected passes by). A (token,
// slot) entry of tile t is entry t * list_capacity + i * topk + slot; its index relative to its
// window's first entry is also its partial row group (rows entry * G + head).
struct KvLists {
  int32_t window_tiles = 0;
  int32_t num_windows = 0;
  int32_t list_capacity = 0;        // tile_tokens * topk entries per tile
  int32_t topk = 0;
  int32_t subwindow_tiles = 0;
  const int32_t* blk_cum = nullptr;  // [batch_size + 1]: prefix of ceil(kv_len / 128) * Hkv
  int32_t block_keys = 0;           // keys per sub-window: the plan's blk_cum[B]
  int32_t key_span = 0;             // keys per window: sub-windows * block_keys
  int32_t* key_count = nullptr;     // [num_windows * key_span * key_stripes], zeroed at every run
  int32_t key_stripes = 4;          // counters per key, and their pitch: 4 or 8 (config.h, kKeyStripesWideKeys)
  int32_t* key_offset = nullptr;    // [num_windows * key_span]: start of a key's list in its window
  int32_t* entry_key = nullptr;     // [num_tiles * list_capacity]
  int32_t* entry_rank = nullptr;    // [num_tiles * list_capacity]: place in the key's list, -1: none
  int2* pairs = nullptr;            // [num_tiles * list_capacity]: {q token, window entry}, by key
  KvWorkItem* items = nullptr;      // [num_windows * item_capacity]
  int32_t* item_count = nullptr;    // [num_windows]
  int32_t* item_counter = nullptr;  // [num_windows], zeroed by the schedule kernel
  int32_t* window_kv_tiles = nullptr;  // [num_windows]: KV-major tiles of each window (tile lists), zeroed likewise
  int32_t item_capacity = 0;        // per window
  void* part_o = nullptr;           // one window: [window_tiles * list_capacity * G, D], q's dtype
  float* part_lse = nullptr;        // [window_tiles * list_capacity * G], log2 domain
};

struct KvMajorParams {
  CUtensorMap q_map;  // box {64, G, 1}: one token's group of heads
  CUtensorMap k_map;  // QMajorParams::k_map / v_map, copied (the same maps)
  CUtensorMap v_map;
  CUtensorMap part_map;  // part_o as [rows, D]: box {64, min(G, 16)} (one warp's rows of one token)
  SeqParams seqs;
  PageTableParams pages;
  KvLists lists;
  int32_t window = 0;
  int32_t group_shift = 0;
  int32_t page_blocks = 1;
  bool causal = true;
  float scale_log2 = 0.f;
  // The last tail_items (kKvTailItemsPerSm x SM count) work items of a window are claimed in parts of
  // kKvTailSubTiles Q tiles, so that the CTAs finish together (config.h).
  int32_t tail_items = 0;
};

}  // namespace msa::detail::cuda::prefill_sm90
