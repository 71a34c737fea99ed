// The plan and run halves of the tile lists and KV-major work lists (kvmajor_state.h).
#include "cuda/prefill_sm90/kvmajor_state.h"

#include <algorithm>

#include "core/knobs.h"
#include "cuda/prefill_sm90/config.h"

namespace msa::detail::cuda::prefill_sm90 {

namespace {

template <typename T>
T* ptr(const DeviceBuffer& b) {
  return static_cast<T*>(b.get());
}

// Rank counters per KV-major key: 8 for a window of at most kKeyStripesWideKeys keys, else 4.
int32_t key_stripes_for(int32_t key_span) { return key_span <= kKeyStripesWideKeys ? 8 : 4; }

}  // namespace

bool plan_kv_windows(KvListState& s, int64_t total_blocks) {
  const int32_t group = 1 << s.group_shift;
  const int64_t part_bytes_per_tile = static_cast<int64_t>(s.list_capacity) * group * kHeadDim * 2;
  int64_t window = std::max<int64_t>(1, std::min<int64_t>(s.num_tiles, kKvPartialBudgetBytes / part_bytes_per_tile));
  // MSA_SM90_KV_WINDOW_TILES caps it (tests: several windows on a small problem).
  if (const int64_t w = knobs::kv_window_tiles("msa.plan_prefill")) window = std::min(window, w);
  const int64_t sub = std::min<int64_t>(kKvSubwindowTiles, window);
  const int64_t windows = (s.num_tiles + window - 1) / window;
  const int64_t subs = (window + sub - 1) / sub;
  constexpr int64_t kMaxKeys = int64_t(1) << 24;
  if (windows * subs * total_blocks > kMaxKeys || total_blocks == 0) return false;
  s.window_tiles = static_cast<int32_t>(window);
  s.num_windows = static_cast<int32_t>(windows);
  s.subwindow_tiles = static_cast<int32_t>(sub);
  s.block_keys = static_cast<int32_t>(total_blocks);
  s.key_span = static_cast<int32_t>(subs * total_blocks);
  s.key_stripes = key_stripes_for(s.key_span);
  // Items of a window: at most one partial item per key plus one per kKvItemTokens entries.
  s.item_capacity = static_cast<int32_t>(window * s.list_capacity / kKvItemTokens + s.key_span + 1);
  const size_t entries = static_cast<size_t>(s.num_tiles) * s.list_capacity;
  const size_t keys = static_cast<size_t>(windows) * s.key_span;
  s.key_count = DeviceBuffer(keys * s.key_stripes * sizeof(int32_t));
  s.key_offset = DeviceBuffer(keys * sizeof(int32_t));
  s.entry_key = DeviceBuffer(entries * sizeof(int32_t));
  s.entry_rank = DeviceBuffer(entries * sizeof(int32_t));
  s.pairs = DeviceBuffer(entries * sizeof(int2));
  s.items = DeviceBuffer(static_cast<size_t>(windows) * s.item_capacity * sizeof(KvWorkItem));
  s.item_count = DeviceBuffer(static_cast<size_t>(windows) * sizeof(int32_t));
  s.part_o = DeviceBuffer(static_cast<size_t>(window * part_bytes_per_tile));
  s.part_lse = DeviceBuffer(static_cast<size_t>(window) * s.list_capacity * group * sizeof(float));
  return true;
}

TileSchedule schedule_of(const KvListState& s) {
  TileSchedule t;
  t.tile_cum = ptr<int32_t>(s.tile_cum);
  t.num_tiles = s.num_tiles;
  t.num_kv_heads = s.num_kv_heads;
  t.tile_tokens = s.tile_tokens;
  return t;
}

KvLists kv_lists_of(const KvListState& s) {
  KvLists L;
  L.window_tiles = s.window_tiles;
  L.num_windows = s.num_windows;
  L.list_capacity = s.list_capacity;
  L.topk = s.topk;
  L.blk_cum = ptr<int32_t>(s.blk_cum);
  L.subwindow_tiles = s.subwindow_tiles;
  L.block_keys = s.block_keys;
  L.key_span = s.key_span;
  L.key_stripes = s.key_stripes;
  L.key_count = ptr<int32_t>(s.key_count);
  L.key_offset = ptr<int32_t>(s.key_offset);
  L.entry_key = ptr<int32_t>(s.entry_key);
  L.entry_rank = ptr<int32_t>(s.entry_rank);
  L.pairs = ptr<int2>(s.pairs);
  L.items = ptr<KvWorkItem>(s.items);
  L.item_count = ptr<int32_t>(s.item_count);
  L.item_counter = ptr<int32_t>(s.counters) + 1;
  L.window_kv_tiles = ptr<int32_t>(s.counters) + 1 + s.num_windows;
  L.item_capacity = s.item_capacity;
  L.part_o = s.part_o.get();
  L.part_lse = ptr<float>(s.part_lse);
  return L;
}

namespace {
// The fields the tile-list and key-list passes share: lengths, schedule, the selection and the per-tile path.
template <typename Params>
void fill_selection(Params& q, const KvListState& s, const AttentionParams& p) {
  q.seqs = p.seqs;
  q.sched = schedule_of(s);
  q.causal = s.causal;
  q.block_idx = p.block_idx;
  q.bi_stride_token = p.bi_stride_token;
  q.bi_stride_head = p.bi_stride_head;
  q.bi_stride_k = p.bi_stride_k;
  q.kv_major = ptr<int32_t>(s.kv_major);
}
}  // namespace

TileListParams tile_list_params(const KvListState& s, const AttentionParams& p) {
  TileListParams tl;
  fill_selection(tl, s, p);
  tl.topk = s.topk;
  tl.rule = s.rule;
  tl.union_ratio_x4 = s.union_ratio_x4;
  tl.entries = ptr<int2>(s.list_entries);
  tl.count = ptr<int32_t>(s.list_count);
  tl.capacity = s.list_capacity;
  if (s.num_windows > 0) {
    tl.window_kv_tiles = ptr<int32_t>(s.counters) + 1 + s.num_windows;
    tl.window_tiles = s.window_tiles;
  }
  return tl;
}

KvListParams kv_list_params(const KvListState& s, const AttentionParams& p) {
  KvListParams lp;
  fill_selection(lp, s, p);
  lp.lists = kv_lists_of(s);
  return lp;
}

KvMergeParams kv_merge_params(const KvListState& s, const AttentionParams& p) {
  KvMergeParams mp;
  mp.seqs = p.seqs;
  mp.sched = schedule_of(s);
  mp.kv_major = ptr<int32_t>(s.kv_major);
  mp.lists = kv_lists_of(s);
  mp.group_shift = s.group_shift;
  mp.dtype = p.dtype;
  mp.o = p.o;
  mp.o_stride_token = p.o_stride_token;
  mp.o_stride_head = p.o_stride_head;
  mp.lse = p.lse;
  mp.lse_stride_token = p.lse_stride_token;
  mp.lse_stride_head = p.lse_stride_head;
  mp.v_scale = p.v_scale;  // the partials are unscaled: v_scale enters once, in the merge
  return mp;
}

}  // namespace msa::detail::cuda::prefill_sm90
