// The warp-wide top-k selection of one row (contract §4), shared by select_topk, merge_candidates and the
// decode attention's fused selection (decode/token_select.cuh).
//
// Each score becomes a 32-bit key whose unsigned order is the contract's order (NaN lowest, below -inf;
// -0 == +0), and 0 marks blocks that are not candidates (forced, past the row's valid blocks, or of a
// non-finite score with finite_only). The k'-th largest key (k' = topk - forced) is found by a bitwise
// search that starts below the bits all candidates share (the common prefix of the row's largest and
// smallest key: sign and leading exponent bits of same-sign scores) and stops as soon as the prefix
// isolates exactly k' keys; with k' or fewer candidates (finite_only) there is no search: all of them. One
// ascending pass over the blocks then takes the forced blocks and every key >= the threshold (or, when the
// search ended on equal keys, every key above it and the lowest-index keys equal to it), and writes them in
// order through ballot prefix counts, -1 after them: any output strides, no sort.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/indexer/device.cuh"

namespace msa::detail::cuda::indexer {

__device__ __forceinline__ uint32_t score_key(float s, bool finite_only) {
  if (s != s) return finite_only ? 0u : 1u;                    // NaN: lowest of all candidates, or none
  const uint32_t u = __float_as_uint(s == 0.f ? 0.f : s);      // -0 ties with +0
  const uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // -inf -> 0x007FFFFF >= 2
  // Finite scores have keys in [0x00800000, 0xFF7FFFFF] (-FLT_MAX .. FLT_MAX).
  return finite_only && k - 0x00800000u >= 0xFF000000u ? 0u : k;
}

// Keys of one row held in registers: lane l has blocks l, l+32, ..., C of them.
template <int C>
struct RegKeys {
  uint32_t k[C];
  template <typename F>
  __device__ __forceinline__ void each(F&& f) const {
#pragma unroll
    for (int i = 0; i < C; ++i) f(i, k[i]);
  }
};

// Keys of one row in shared memory (rows longer than the register capacity).
struct SmemKeys {
  const uint32_t* buf;
  int nch;
  template <typename F>
  __device__ __forceinline__ void each(F&& f) const {
    const int lane = threadIdx.x & 31;
    for (int i = 0; i < nch; ++i) f(i, buf[i * 32 + lane]);
  }
};

template <typename Keys>
__device__ __forceinline__ int count_at_least(const Keys& keys, uint32_t x) {
  int c0 = 0, c1 = 0;  // two chains: half the add latency on the search's critical path
  keys.each([&](int i, uint32_t k) { (i & 1 ? c1 : c0) += k >= x; });
  return __reduce_add_sync(kFullMask, c0 + c1);
}

// Selects and writes one row; keys built for the candidates among blocks [fb, n - fe). Without finite_only
// n > topk (shorter rows take every valid block, in the caller). Rule: .topk, .force_begin, .force_end
// (SelectTopkParams); Sink: .put(j, block) writes entry j, .empty(j) writes -1 there.
template <typename Keys, typename Rule, typename Sink>
__device__ __forceinline__ void select_row(const Keys& keys, int n, const Rule& p, bool finite_only, const Sink& sink) {
  const int lane = threadIdx.x & 31;
  const unsigned lt = (1u << lane) - 1u;
  const int kp = p.topk - p.force_begin - p.force_end;  // blocks chosen by score
  uint32_t thr = 0xFFFFFFFFu;                            // above every key: nothing by score
  int need_eq = 0;                                       // > 0: take thr's lowest-index keys, this many
  // Candidates (keys >= 1): every block of [fb, n - fe) unless finite_only drops some.
  const int ncand = kp <= 0 ? 0 : finite_only ? count_at_least(keys, 1u) : n - p.force_begin - p.force_end;
  if (finite_only && kp > 0 && ncand <= kp) {
    thr = 1u;  // all of them: k' or fewer finite candidates (without finite_only n > topk: never)
  } else if (kp > 0) {
    uint32_t mx = 0, mn = 0xFFFFFFFFu;
    keys.each([&](int, uint32_t k) {
      mx = max(mx, k);
      mn = k ? min(mn, k) : mn;
    });
    mx = __reduce_max_sync(kFullMask, mx);
    mn = __reduce_min_sync(kFullMask, mn);
    // Every candidate lies in [mn, mx], so all share the bits above the highest bit where mx and mn
    // differ: start there, with the count of keys >= thr = all candidates.
    const uint32_t diff = mx ^ mn;
    thr = diff ? (mx & ~(0xFFFFFFFFu >> __clz(diff))) : mx;
    int cnt = ncand;
    for (int bit = 31 - __clz(diff); bit >= 0 && cnt != kp; --bit) {
      const uint32_t cand = thr | (1u << bit);
      const int c = count_at_least(keys, cand);
      if (c >= kp) thr = cand, cnt = c;
    }
    // Every bit resolved and still more than k' keys >= thr: thr is the k'-th largest key and has ties;
    // take the keys above it and the lowest-index ones equal to it (need_eq >= 1).
    if (cnt != kp) need_eq = kp - count_at_least(keys, thr + 1);
  }
  int pos = 0, eq_seen = 0;
  keys.each([&](int i, uint32_t k) {
    const int blk = 32 * i + lane;
    const bool forced = blk < n && (blk < p.force_begin || blk >= n - p.force_end);
    bool sel;
    if (need_eq > 0) {  // warp-uniform
      const bool eq = k == thr;
      const unsigned eqm = __ballot_sync(kFullMask, eq);
      sel = forced || k > thr || (eq && eq_seen + __popc(eqm & lt) < need_eq);
      eq_seen += __popc(eqm);
    } else {
      sel = forced || k >= thr;
    }
    const unsigned selm = __ballot_sync(kFullMask, sel);
    if (sel) sink.put(pos + __popc(selm & lt), blk);
    pos += __popc(selm);
  });
  for (int j = pos + lane; j < p.topk; j += 32) sink.empty(j);
}

// Calls f(std::integral_constant<int, C>) with the smallest power of two C >= nch, C <= CAP.
template <int C, int CAP, typename F>
__device__ __forceinline__ void with_keys_per_lane(int nch, F&& f) {
  if constexpr (C >= CAP) {
    f(std::integral_constant<int, CAP>{});
  } else {
    if (nch <= C)
      f(std::integral_constant<int, C>{});
    else
      with_keys_per_lane<2 * C, CAP>(nch, f);
  }
}

}  // namespace msa::detail::cuda::indexer
