// merge_candidates (docs/sharding.md): select_topk over rows built from N ranks' candidate lists. A row's keys are
// written into shared memory -- the NaN key (1) at every block that can be chosen by score, 0 at the others, then
// each candidate's key at its block id (atomicMax: a block proposed twice keeps the higher key) -- and selected
// with select_topk's search and ascending pass (topk.cuh), the keys taken into registers: one warp per (token,
// head) row of up to kTopkMaxRegBlocks blocks, a CTA of kTopkRowWarps warps per longer row (as select_topk).
// The result is select_topk's over the scattered score row, with no [T, H, max_blocks] tensor in memory and one
// launch instead of a fill, a scatter and a selection.
#pragma once

#include "cuda/indexer/topk.cuh"

namespace msa::detail::cuda::indexer {

inline constexpr int kMergePreloaded = 4;  // candidates per lane loaded before the request lookup resolves

// Candidate c (rank c / per_rank) of token t, head h: its global block id and score.
__device__ __forceinline__ void load_candidate(const MergeCandidatesParams& mp, int64_t t, int h, int c, int32_t* id,
                                               float* s) {
  const int r = c / mp.per_rank, k = c - r * mp.per_rank;
  *id = __ldg(mp.ids + r * mp.i_stride_rank + t * mp.i_stride_token + h * mp.i_stride_head + k * mp.i_stride_k);
  *s = __ldg(mp.scores + r * mp.s_stride_rank + t * mp.s_stride_token + h * mp.s_stride_head + k * mp.s_stride_k);
}

// Launched with PDL on sm_90 (the candidates come from the exchange or the scan just before).
__global__ void __launch_bounds__(256) merge_candidates_kernel(const MergeCandidatesParams mp, int row_words) {
  extern __shared__ uint32_t smem_keys[];
  arch::grid_dependency_wait();
  arch::allow_dependent_launch();
  const SelectTopkParams& p = mp.select;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t T = p.seqs.total_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (row >= T * p.num_heads) return;
  const int64_t t = row / p.num_heads;
  const int h = static_cast<int>(row - t * p.num_heads);
  const int m = mp.num_ranks * mp.per_rank;
  const auto cand = [&](int c, int32_t* id, float* s) { load_candidate(mp, t, h, c, id, s); };
  // The first candidates and the guessed request's lengths are loaded together (one round trip, as select_topk's
  // decode form: the request of token t is guessed as t * B / T, exact for uniform batches, searched otherwise).
  int32_t pre_id[kMergePreloaded];
  float pre_s[kMergePreloaded];
#pragma unroll
  for (int j = 0; j < kMergePreloaded; ++j) {
    pre_id[j] = -1;
    if (lane + 32 * j < m) cand(lane + 32 * j, &pre_id[j], &pre_s[j]);
  }
  int b;
  Request rq;
  if (!find_request(p.seqs, t, true, &b, &rq)) return;  // not a token of the batch (as select_topk)
  const RowSink sink{p, p.out + t * p.out_stride_token + h * p.out_stride_head, b, false};
  const int n = row_blocks(p, rq, t);
  if (n <= p.topk) {  // every valid block, whatever the candidates
    sink.take_all<false>(n, static_cast<unsigned>(row));
    return;
  }
  const int lo = p.force_begin, hi = n - p.force_end;  // blocks chosen by score
  const int nch = (n + 31) / 32;
  uint32_t* buf = smem_keys + warp * row_words;
  for (int i = 0; i < nch; ++i) {
    const int blk = 32 * i + lane;
    buf[blk] = blk >= lo && blk < hi ? 1u : 0u;
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kMergePreloaded; ++j)
    if (pre_id[j] >= lo && pre_id[j] < hi) atomicMax(buf + pre_id[j], score_key(pre_s[j], false));
  for (int c = lane + 32 * kMergePreloaded; c < m; c += 32) {
    int32_t id;
    float s;
    cand(c, &id, &s);
    if (id >= lo && id < hi) atomicMax(buf + id, score_key(s, false));
  }
  __syncwarp();
  // The search reads every key once per bit: from registers, not from shared memory (LDS-bound otherwise).
  with_keys_per_lane<1, kTopkMaxRegBlocks / 32>(nch, [&](auto c) {
    constexpr int C = decltype(c)::value;
    RegKeys<C> keys;
#pragma unroll
    for (int i = 0; i < C; ++i) keys.k[i] = i < nch ? buf[32 * i + lane] : 0u;
    WarpRow warp_row;
    select_row<false>(keys, n, p, false, sink, warp_row, 0);
  });
}

// Rows longer than kTopkMaxRegBlocks blocks (1M-token contexts): a CTA of kTopkRowWarps warps per row builds the
// row's keys in shared memory (row_words of them), then warp w takes blocks [32 C w, 32 C (w + 1)) into registers
// and the warps search together (select_topk_row_cta_kernel, topk.cuh). One warp per such row, searching its keys
// in shared memory, is what select_topk's long rows measured 9x slower at 1M tokens (docs/indexer.md).
template <int C>
__global__ void __launch_bounds__(kTopkRowWarps * 32) merge_candidates_row_cta_kernel(const MergeCandidatesParams mp) {
  extern __shared__ uint32_t buf[];
  __shared__ uint32_t xchg[2][kTopkRowWarps][3];
  arch::grid_dependency_wait();
  arch::allow_dependent_launch();
  const SelectTopkParams& p = mp.select;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x;  // the grid is the rows
  const int64_t t = row / p.num_heads;
  const int h = static_cast<int>(row - t * p.num_heads);
  int b;
  Request rq;
  if (!find_request(p.seqs, t, true, &b, &rq)) return;  // the same for every warp of the row
  const RowSink sink{p, p.out + t * p.out_stride_token + h * p.out_stride_head, b, false};
  const int n = row_blocks(p, rq, t);
  if (n <= p.topk) {  // every valid block, whatever the candidates
    if (warp == 0) sink.take_all<false>(n, static_cast<unsigned>(row));
    return;
  }
  const int lo = p.force_begin, hi = n - p.force_end;  // blocks chosen by score
  for (int blk = threadIdx.x; blk < n; blk += blockDim.x) buf[blk] = blk >= lo && blk < hi ? 1u : 0u;
  __syncthreads();
  for (int c = threadIdx.x; c < mp.num_ranks * mp.per_rank; c += blockDim.x) {
    int32_t id;
    float s;
    load_candidate(mp, t, h, c, &id, &s);
    if (id >= lo && id < hi) atomicMax(buf + id, score_key(s, false));
  }
  __syncthreads();
  const int base = warp * 32 * C;
  RegKeys<C> keys;
#pragma unroll
  for (int i = 0; i < C; ++i) {
    const int blk = base + 32 * i + lane;
    keys.k[i] = blk < n ? buf[blk] : 0u;
  }
  CtaRow cta_row{xchg};
  select_row<true>(keys, n, p, false, sink, cta_row, base);
}

}  // namespace msa::detail::cuda::indexer
