// Device helpers shared by the Hopper prefill kernels: request lengths read defensively, the
// canonical tile decode, and the page-table lookup. Device values are never trusted: whatever they
// hold, nothing here reads outside the tensors the params describe.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "cuda/arch/sm90.cuh"
#include "cuda/prefill_sm90/params.h"

namespace msa::detail::cuda::prefill_sm90 {

// The Q, K and V descriptors of a kernel's params into the descriptor cache (both prefill kernels load
// through these three).
template <class Params>
__device__ __forceinline__ void tma_prefetch_qkv_maps(const Params& p) {
  arch::tma_prefetch_descriptor(&p.q_map);
  arch::tma_prefetch_descriptor(&p.k_map);
  arch::tma_prefetch_descriptor(&p.v_map);
}

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// One request's lengths, clamped so that every derived index stays in bounds.
struct SeqView {
  int32_t qo_start = 0;  // first token in q, in [0, total_q]
  int32_t qo_len = 0;    // tokens, qo_start + qo_len <= total_q
  int32_t kv_len = 0;    // >= 0
  int32_t offset = 0;    // position of the first query token
};

__device__ __forceinline__ SeqView load_seq(const SeqParams& s, int b) {
  SeqView v;
  const int64_t start = clamp64(s.qo_indptr[b], 0, s.total_q);
  const int64_t end = clamp64(s.qo_indptr[b + 1], start, s.total_q);
  v.qo_start = static_cast<int32_t>(start);
  v.qo_len = static_cast<int32_t>(end - start);
  v.kv_len = max(s.kv_lens[b], 0);
  v.offset = s.qo_offset ? s.qo_offset[b] : v.kv_len - v.qo_len;
  return v;
}

// Keys [0, kv_hi) are visible to the query at index i of the request (before block selection):
// min(kv_len, max(offset + i + 1, 0)) in 32 bits, offset + i + 1 formed only below kv_len (kv_len >= 0
// and 0 <= i, so kv_len - i - 1 cannot overflow; per job and row in the portable KV-major kernel, where
// the 64-bit clamp took ~20 instructions a row).
__device__ __forceinline__ int32_t visible_key_end(const SeqView& v, int32_t i, bool causal) {
  if (i < 0 || i >= v.qo_len) return 0;
  if (!causal) return v.kv_len;
  return v.offset >= v.kv_len - i - 1 ? v.kv_len : max(v.offset + i + 1, 0);
}

__device__ __forceinline__ int32_t num_kv_blocks(int32_t kv_len) {
  return static_cast<int32_t>((static_cast<int64_t>(kv_len) + 127) / 128);
}

struct TileCoord {
  int32_t request = 0;
  int32_t chunk = 0;    // token chunk of the request: tokens [chunk * tile_tokens, +tile_tokens)
  int32_t kv_head = 0;
};

// Number of canonical tiles this run serves: the plan's count, or fewer if the device lengths say so.
__device__ __forceinline__ int32_t live_tiles(const TileSchedule& t, int batch_size) {
  return max(0, min(t.num_tiles, t.tile_cum[batch_size]));
}

// Tile id (< live_tiles) -> (request, chunk, KV head). Requests in order; within one, the last
// chunk first and the KV heads innermost.
__device__ __forceinline__ TileCoord decode_tile(const TileSchedule& t, int batch_size, int32_t tile) {
  int lo = 0, hi = batch_size;  // find the last b with tile_cum[b] <= tile
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (t.tile_cum[mid] <= tile) lo = mid; else hi = mid;
  }
  const int32_t local = tile - t.tile_cum[lo];
  const int32_t chunks = (t.tile_cum[lo + 1] - t.tile_cum[lo]) / t.num_kv_heads;
  TileCoord c;
  c.request = lo;
  c.chunk = chunks - 1 - local / t.num_kv_heads;
  c.kv_head = local % t.num_kv_heads;
  return c;
}

// The block that slot `slot` of query token i (index in the request) of tile chunk contributes
// for KV head g, or -1: entries outside [0, ceil(kv_len / 128)) are empty (and caller errors when
// >= the bound), and a block past the causal frontier has no visible key for this token.
// One definition for every pass that enumerates selections (the union lists, the KV-major lists),
// so that they agree on which (token, slot) pairs exist.
__device__ __forceinline__ int32_t contributing_block(const int32_t* block_idx, int64_t stride_token,
                                                      int64_t stride_head, int64_t stride_k, const SeqView& v,
                                                      int32_t i, int32_t kv_head, int32_t slot, bool causal) {
  if (i < 0 || i >= v.qo_len) return -1;
  const int64_t tok = static_cast<int64_t>(v.qo_start) + i;
  const int32_t e = block_idx[tok * stride_token + kv_head * stride_head + slot * stride_k];
  if (e < 0 || e >= num_kv_blocks(v.kv_len)) return -1;
  return static_cast<int64_t>(e) * 128 < visible_key_end(v, i, causal) ? e : -1;
}

// Physical page holding logical page lp of request b, or -1 when the table has no valid entry
// there (past the row, or a page id outside [0, num_pages)): such keys are invisible.
__device__ __forceinline__ int32_t physical_page(const PageTableParams& pt, int b, int32_t lp) {
  if (lp < 0) return -1;
  int64_t idx;
  if (pt.indptr) {
    const int64_t start = pt.indptr[b], end = pt.indptr[b + 1];
    if (start < 0 || lp >= end - start) return -1;
    idx = start + lp;
    if (idx >= pt.row_capacity) return -1;  // row_capacity: entries of the flat table
  } else {
    if (lp >= pt.row_capacity) return -1;
    idx = b * pt.row_stride + lp;
  }
  const int32_t page = pt.table[idx];
  return (page >= 0 && page < pt.num_pages) ? page : -1;
}

}  // namespace msa::detail::cuda::prefill_sm90
