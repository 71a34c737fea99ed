// select_topk (contract §4): one warp per (token, head) row, a CTA per row past kTopkMaxRegBlocks blocks.
//
// Each score becomes a 32-bit key whose unsigned order is the contract's order (NaN lowest, below -inf;
// -0 == +0), and 0 marks blocks that are not candidates (forced, past the row's valid blocks, or of a
// non-finite score with finite_only). The k'-th largest key (k' = topk - forced) is found by a bitwise
// search that starts below the bits all candidates share (the common prefix of the row's largest and
// smallest key: sign and leading exponent bits of same-sign scores) and stops as soon as the prefix
// isolates exactly k' keys; with k' or fewer candidates (finite_only) there is no search: all of them. A lane
// counts its keys >= a candidate as the population count of its compares packed into one word; decode rows
// resolve two bits per warp reduction (three candidates' counts in one redux.sync). One
// ascending pass over the blocks then takes the forced blocks and every key >= the threshold (or, when the
// search ended on equal keys, every key above it and the lowest-index keys equal to it), and writes them in
// order through ballot prefix counts, -1 after them: any output strides, no sort. block_map and out_scores
// are applied to the written row (RowSink::finish).
//
// The per-row work is proportional to the keys each lane holds, so a row is processed with the smallest
// power-of-two number of keys per lane that covers its valid blocks (P-32K rows hold 1..256 blocks).
#pragma once

#include <type_traits>

#include "cuda/arch/pdl.cuh"
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
  static constexpr bool kPackedCounts = 32 * C < 1024;  // a row's counts fit 10 bits
  uint32_t k[C];
  template <typename F>
  __device__ __forceinline__ void each(F&& f) const {
#pragma unroll
    for (int i = 0; i < C; ++i) f(i, k[i]);
  }
  // Up to 32 compares packed into one word (P2R) and counted by POPC: ~27 instructions per count at 16 keys a
  // lane, no dependent add chain (a select and an add per key took ~56).
  __device__ __forceinline__ uint32_t lane_count_at_least(uint32_t x) const {
    uint32_t c = 0;
#pragma unroll
    for (int j = 0; j < C; j += 32) {
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < 32 && j + i < C; ++i) m |= static_cast<uint32_t>(k[j + i] >= x) << i;
      c += __popc(m);
    }
    return c;
  }
  __device__ __forceinline__ void lane_count3_at_least(uint32_t c1, uint32_t c2, uint32_t c3, uint32_t* n) const {
    n[0] = lane_count_at_least(c1), n[1] = lane_count_at_least(c2), n[2] = lane_count_at_least(c3);
  }
};

// How a row's per-lane counts and extremes are combined. WarpRow: the row is one warp's. CtaRow: the row's
// blocks are spread over the CTA's kTopkRowWarps warps (rows longer than a warp holds in registers); each
// combination is a warp reduction, then the warps' values exchanged through shared memory, double-buffered so
// that one CTA barrier an exchange suffices (a buffer is written again only after the next exchange's barrier,
// which every reader of its previous values has passed).
struct WarpRow {
  static constexpr bool kMultiWarp = false;
  __device__ __forceinline__ uint32_t sum(uint32_t v) { return __reduce_add_sync(kFullMask, v); }
  __device__ __forceinline__ void sum3(uint32_t* v) {
#pragma unroll
    for (int j = 0; j < 3; ++j) v[j] = __reduce_add_sync(kFullMask, v[j]);
  }
  __device__ __forceinline__ void max_min(uint32_t& mx, uint32_t& mn) {
    mx = __reduce_max_sync(kFullMask, mx);
    mn = __reduce_min_sync(kFullMask, mn);
  }
};

struct CtaRow {
  static constexpr bool kMultiWarp = true;
  uint32_t (*xchg)[kTopkRowWarps][3];  // [2][warps][values]
  int parity = 0;
  // v: this warp's values (warp-uniform) -> every warp's, lane l < kTopkRowWarps holding warp l's.
  template <int N>
  __device__ __forceinline__ void exchange(uint32_t* v, const uint32_t* fill) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < N; ++j) xchg[parity][warp][j] = v[j];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = lane < kTopkRowWarps ? xchg[parity][lane][j] : fill[j];
    parity ^= 1;
  }
  __device__ __forceinline__ uint32_t sum(uint32_t x) {
    uint32_t v[1] = {__reduce_add_sync(kFullMask, x)};
    const uint32_t zero[1] = {0};
    exchange<1>(v, zero);
    return __reduce_add_sync(kFullMask, v[0]);
  }
  __device__ __forceinline__ void sum3(uint32_t* v) {
    const uint32_t zero[3] = {0, 0, 0};
#pragma unroll
    for (int j = 0; j < 3; ++j) v[j] = __reduce_add_sync(kFullMask, v[j]);
    exchange<3>(v, zero);
#pragma unroll
    for (int j = 0; j < 3; ++j) v[j] = __reduce_add_sync(kFullMask, v[j]);
  }
  __device__ __forceinline__ void max_min(uint32_t& mx, uint32_t& mn) {
    uint32_t v[2] = {__reduce_max_sync(kFullMask, mx), __reduce_min_sync(kFullMask, mn)};
    const uint32_t fill[2] = {0u, 0xFFFFFFFFu};
    exchange<2>(v, fill);
    mx = __reduce_max_sync(kFullMask, v[0]);
    mn = __reduce_min_sync(kFullMask, v[1]);
  }
  // Exclusive prefix over the row's earlier warps and the row's total, of two warp-uniform values.
  __device__ __forceinline__ void scan2(uint32_t a, uint32_t b, uint32_t* pre, uint32_t* tot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t v[2] = {a, b};
    const uint32_t zero[2] = {0, 0};
    exchange<2>(v, zero);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      pre[j] = __reduce_add_sync(kFullMask, lane < warp ? v[j] : 0u);
      tot[j] = __reduce_add_sync(kFullMask, v[j]);
    }
  }
};

template <typename Keys, typename Row>
__device__ __forceinline__ int count_at_least(const Keys& keys, uint32_t x, Row& row) {
  return static_cast<int>(row.sum(keys.lane_count_at_least(x)));
}

// The counts of keys >= c1, c2, c3: three 10-bit fields of one warp reduction where a row's counts fit.
template <typename Keys, typename Row>
__device__ __forceinline__ void count3_at_least(const Keys& keys, uint32_t c1, uint32_t c2, uint32_t c3, int* n,
                                                Row& row) {
  if constexpr (Keys::kPackedCounts && !Row::kMultiWarp) {
    const uint32_t s = row.sum(keys.lane_count_at_least(c1) | keys.lane_count_at_least(c2) << 10 |
                               keys.lane_count_at_least(c3) << 20);
    n[0] = static_cast<int>(s & 1023u), n[1] = static_cast<int>(s >> 10 & 1023u), n[2] = static_cast<int>(s >> 20);
  } else {
    uint32_t a[3];
    keys.lane_count3_at_least(c1, c2, c3, a);
    row.sum3(a);
#pragma unroll
    for (int j = 0; j < 3; ++j) n[j] = static_cast<int>(a[j]);
  }
}

// The token and head of warp row `row`: token-fastest rows take consecutive tokens of one head.
template <typename I>
__device__ __forceinline__ void row_token_head(I row, I num_tokens, I num_heads, bool token_fastest, I* t, I* h) {
  *t = token_fastest ? row % num_tokens : row / num_heads;
  *h = token_fastest ? row / num_tokens : row % num_heads;
}

// Where a row's selection goes. The selection writes block ids into out; finish() then maps them through
// the request's block_map row and writes out_scores, reading the row back after the warp's writes (one more
// round trip, only with those options). Lookups at the write instead, inside the unrolled pass over the keys,
// took 32 registers to 52-64 at 1 key per lane and spilled at 64 keys per lane; finish() recomputes the row's
// token and head (32-bit: rows < 2^31) rather than keeping them live through the selection.
struct RowSink {
  const SelectTopkParams& p;
  int32_t* out;
  int b;  // request
  bool token_fastest;
  __device__ __forceinline__ void put(int j, int blk) const { out[j * p.out_stride_k] = blk; }
  __device__ __forceinline__ void empty(int j) const { out[j * p.out_stride_k] = -1; }
  // A row of at most topk valid blocks (without a finite_only choice): every block, then -1. One warp.
  template <bool kOptions>
  __device__ __forceinline__ void take_all(int n, unsigned row) const {
    for (int j = threadIdx.x & 31; j < p.topk; j += 32) {
      if (j < n)
        put(j, j);
      else
        empty(j);
    }
    if constexpr (kOptions) finish(row);
  }
  // row: the warp's row (one warp per row), or the CTA's (the caller has passed a CTA barrier).
  __device__ __forceinline__ void finish(unsigned row) const {
    if (!p.block_map && !p.out_scores) return;
    __syncwarp();  // the row's ids, written by any lane, visible to every lane
    unsigned t, h;
    row_token_head<unsigned>(row, static_cast<unsigned>(p.seqs.total_q), static_cast<unsigned>(p.num_heads),
                             token_fastest, &t, &h);
    const int32_t* map = p.block_map ? p.block_map + b * p.bm_stride_req : nullptr;
    float* os = p.out_scores ? p.out_scores + t * p.os_stride_token + h * p.os_stride_head : nullptr;
    const float* srow = p.scores + t * p.s_stride_token + h * p.s_stride_head;
#pragma unroll 1
    for (int j = threadIdx.x & 31; j < p.topk; j += 32) {
      const int blk = out[j * p.out_stride_k];
      if (map && blk >= 0) out[j * p.out_stride_k] = __ldg(map + blk * p.bm_stride_block);
      if (os) os[j * p.os_stride_k] = blk >= 0 ? __ldg(srow + blk * p.s_stride_block) : __uint_as_float(0x7FC00000u);
    }
  }
};

// Selects and writes one row; keys built for the candidates among blocks [fb, n - fe). Without finite_only
// n > topk (shorter rows take every valid block, in the kernel). kTwoBitsPerStep: the search resolves two bits
// per redux.sync (three counts), which pays where a row's warp is alone on its scheduler (decode: latency-bound)
// and where a row's warps exchange every count through shared memory (CtaRow), and costs where many rows share an
// SM (prefill: bound by the instructions issued). The lane's key i is block base + 32 i + lane (base:
// the warp's first block of a CtaRow row, 0 otherwise).
template <bool kTwoBitsPerStep, typename Keys, typename Row>
__device__ __forceinline__ void select_row(const Keys& keys, int n, const SelectTopkParams& p, bool finite_only,
                                           const RowSink& sink, Row& row, int base) {
  const int lane = threadIdx.x & 31;
  const unsigned lt = (1u << lane) - 1u;
  const int kp = p.topk - p.force_begin - p.force_end;  // blocks chosen by score
  uint32_t thr = 0xFFFFFFFFu;                            // above every key: nothing by score
  int need_eq = 0;                                       // > 0: take thr's lowest-index keys, this many
  // Candidates (keys >= 1): every block of [fb, n - fe) unless finite_only drops some.
  const int ncand = kp <= 0 ? 0 : finite_only ? count_at_least(keys, 1u, row) : n - p.force_begin - p.force_end;
  if (finite_only && kp > 0 && ncand <= kp) {
    thr = 1u;  // all of them: k' or fewer finite candidates (without finite_only n > topk: never)
  } else if (kp > 0) {
    uint32_t mx = 0, mn = 0xFFFFFFFFu;
    keys.each([&](int, uint32_t k) {
      mx = max(mx, k);
      mn = k ? min(mn, k) : mn;
    });
    row.max_min(mx, mn);
    // Every candidate lies in [mn, mx], so all share the bits above the highest bit where mx and mn
    // differ: start there, with the count of keys >= thr = all candidates.
    const uint32_t diff = mx ^ mn;
    thr = diff ? (mx & ~(0xFFFFFFFFu >> __clz(diff))) : mx;
    int cnt = ncand;
    int bit = 31 - __clz(diff);
    if constexpr (kTwoBitsPerStep) {  // bits (bit, bit - 1) at once: the largest of 3 candidates with >= k' keys
      for (; bit >= 1 && cnt != kp; bit -= 2) {
        const uint32_t lo = 1u << (bit - 1), c2 = thr | lo << 1;
        int n[3];
        count3_at_least(keys, thr | lo, c2, c2 | lo, n, row);
        if (n[2] >= kp)
          thr = c2 | lo, cnt = n[2];
        else if (n[1] >= kp)
          thr = c2, cnt = n[1];
        else if (n[0] >= kp)
          thr |= lo, cnt = n[0];
      }
    }
    for (; bit >= 0 && cnt != kp; --bit) {
      const uint32_t cand = thr | (1u << bit);
      const int c = count_at_least(keys, cand, row);
      if (c >= kp) thr = cand, cnt = c;
    }
    // Every bit resolved and still more than k' keys >= thr: thr is the k'-th largest key and has ties;
    // take the keys above it and the lowest-index ones equal to it (need_eq >= 1).
    if (cnt != kp) need_eq = kp - count_at_least(keys, thr + 1, row);
  }
  int pos = 0, eq_seen = 0, total = 0;
  if constexpr (Row::kMultiWarp) {  // where this warp's blocks start in the row's output, and the row's total
    uint32_t c[2] = {0, 0};           // by the rule (forced, above / at the threshold); equal to it
    keys.each([&](int i, uint32_t k) {
      const int blk = base + 32 * i + lane;
      const bool forced = blk < n && (blk < p.force_begin || blk >= n - p.force_end);
      c[0] += forced || (need_eq > 0 ? k > thr : k >= thr);
      c[1] += need_eq > 0 && k == thr;
    });
    uint32_t pre[2], tot[2];
    row.scan2(__reduce_add_sync(kFullMask, c[0]), __reduce_add_sync(kFullMask, c[1]), pre, tot);
    pos = static_cast<int>(pre[0]) + min(static_cast<int>(pre[1]), need_eq);
    eq_seen = static_cast<int>(pre[1]);
    total = static_cast<int>(tot[0]) + min(static_cast<int>(tot[1]), need_eq);
  }
  keys.each([&](int i, uint32_t k) {
    const int blk = base + 32 * i + lane;
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
  if constexpr (!Row::kMultiWarp) total = pos;
  if (!Row::kMultiWarp || threadIdx.x < 32)
    for (int j = total + lane; j < p.topk; j += 32) sink.empty(j);
}

// Calls f(std::integral_constant<int, C>) with the smallest power of two C >= nch, C <= CAP (on the host: the
// launch's choice of instance).
template <int C, int CAP, typename F>
__host__ __device__ __forceinline__ void with_keys_per_lane(int nch, F&& f) {
  if constexpr (C >= CAP) {
    f(std::integral_constant<int, CAP>{});
  } else {
    if (nch <= C)
      f(std::integral_constant<int, C>{});
    else
      with_keys_per_lane<2 * C, CAP>(nch, f);
  }
}

// The request of token t: guessed as t * B / T first when `guess` (exact for uniform batches; its loads issue
// together), else (or when wrong) searched. False when t is no token of the batch.
__device__ __forceinline__ bool find_request(const SeqParams& s, int64_t t, bool guess, int* b, Request* rq) {
  const int64_t T = s.total_q;
  if (guess) {
    *b = static_cast<int>(t * s.batch_size / T);
    *rq = load_request(s, *b);
    if (rq->q_begin <= t && t < rq->q_begin + rq->q_len) return true;
  }
  *b = warp_last_le(s.batch_size, t, [&](int i) { return clamp_to<int64_t>(s.qo_indptr[i], 0, T); });
  if (*b < 0) return false;
  *rq = load_request(s, *b);
  return t < rq->q_begin + rq->q_len;
}

// The row's valid blocks: [0, n) (causal: up to the token's own block).
__device__ __forceinline__ int row_blocks(const SelectTopkParams& p, const Request& rq, int64_t t) {
  const int64_t pos = rq.offset + (t - rq.q_begin);
  const int64_t nkv = min64((rq.kv_len + kBlock - 1) / kBlock, p.max_blocks);
  return static_cast<int>(p.causal ? (pos < 0 ? 0 : min64(pos / kBlock + 1, nkv)) : nkv);
}

// One warp per row, its keys in registers, up to CAP per lane (rows up to kTopkMaxRegBlocks blocks).
// kDecode (few tokens per request, host-known): the request of token t is guessed as t * B / T (exact
// for uniform batches, checked, searched otherwise) and the row's scores and the guessed request's
// lengths are loaded together, so a row costs one round trip to memory instead of three.
// kOptions: any of finite_only, block_map, out_scores is given. A plain call runs an instance without
// their code, so that the options do not change its register allocation (one instance serving both spilled
// 4-20 bytes at 8, 16 or 64 keys per lane depending on how the options were written).
// Launched with PDL on sm_90 (launch_select_topk): nothing is read before arch::grid_dependency_wait().
template <int CAP, bool kDecode, bool kOptions>
__global__ void __launch_bounds__(512) select_topk_kernel(const SelectTopkParams p, bool token_fastest) {
  arch::grid_dependency_wait();
  arch::allow_dependent_launch();
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  const int64_t T = p.seqs.total_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
  if (row >= T * p.num_heads) return;
  int64_t t, h64;
  row_token_head<int64_t>(row, T, p.num_heads, token_fastest, &t, &h64);
  const int h = static_cast<int>(h64);
  const float* srow = p.scores + t * p.s_stride_token + h * p.s_stride_head;

  float v[kDecode ? CAP : 1];
  if constexpr (kDecode) {
#pragma unroll
    for (int i = 0; i < CAP; ++i) {
      const int blk = 32 * i + lane;
      v[i] = __ldg(srow + (blk < p.max_blocks ? blk * p.s_stride_block : 0));
    }
  }
  int b;
  Request rq;
  if (!find_request(p.seqs, t, kDecode, &b, &rq)) return;
  const RowSink sink{p, p.out + t * p.out_stride_token + h * p.out_stride_head, b, token_fastest};
  const int n = row_blocks(p, rq, t);

  const bool finite_only = kOptions && p.finite_only;
  if (n <= p.topk && (!finite_only || n == 0)) {  // every valid block
    sink.take_all<kOptions>(n, static_cast<unsigned>(row));
    return;
  }
  const int lo = p.force_begin, hi = n - p.force_end;  // candidates by score
  const int nch = (n + 31) / 32;
  with_keys_per_lane<1, CAP>(nch, [&](auto c) {
    constexpr int C = decltype(c)::value;
    RegKeys<C> keys;
    if constexpr (kDecode) {
#pragma unroll
      for (int i = 0; i < C; ++i) {
        const int blk = 32 * i + lane;
        keys.k[i] = blk >= lo && blk < hi ? score_key(v[i], finite_only) : 0u;
      }
    } else {
      // All loads first (address clamped to block 0) so that they are in flight together.
      float w[C];
#pragma unroll
      for (int i = 0; i < C; ++i) {
        const int blk = 32 * i + lane;
        w[i] = __ldg(srow + (blk >= lo && blk < hi ? blk * p.s_stride_block : 0));
      }
#pragma unroll
      for (int i = 0; i < C; ++i) {
        const int blk = 32 * i + lane;
        keys.k[i] = blk >= lo && blk < hi ? score_key(w[i], finite_only) : 0u;
      }
    }
    WarpRow warp_row;
    select_row<kDecode>(keys, n, p, finite_only, sink, warp_row, 0);
  });
  if constexpr (kOptions) sink.finish(static_cast<unsigned>(row));
}

// One CTA of kTopkRowWarps warps per row (rows longer than kTopkMaxRegBlocks blocks: 8192 at 1M tokens), C keys
// per lane in registers, warp w holding blocks [w * 32 C, (w + 1) * 32 C). A warp alone on such a row (its keys in
// shared memory, read once per bit of the search) took ~116 us at 1M tokens x 32 rows, against ~12.7 here,
// where every count is 16 warps' population counts and one exchange. `guess`: the decode form's request guess
// (select_topk_kernel).
// (The minimum of one CTA per SM lets ptxas give C = 32 more than 64 registers, where it spilled 8 bytes; at C = 64
// the same hint made it spill 60 bytes at 128 registers, without it none.)
template <int C, bool kOptions>
__global__ void __launch_bounds__(kTopkRowWarps * 32, C == 32 ? 1 : 0) select_topk_row_cta_kernel(const SelectTopkParams p,
                                                                                 bool token_fastest, bool guess) {
  __shared__ uint32_t xchg[2][kTopkRowWarps][3];
  arch::grid_dependency_wait();
  arch::allow_dependent_launch();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x;  // the grid is the rows
  int64_t t, h64;
  row_token_head<int64_t>(row, p.seqs.total_q, p.num_heads, token_fastest, &t, &h64);
  const int h = static_cast<int>(h64);
  const float* srow = p.scores + t * p.s_stride_token + h * p.s_stride_head;
  const int base = warp * 32 * C;
  float w[C];  // all loads first, in flight with the request's (blocks past the scores' extent: block 0's)
#pragma unroll
  for (int i = 0; i < C; ++i) {
    const int blk = base + 32 * i + lane;
    w[i] = __ldg(srow + (blk < p.max_blocks ? blk * p.s_stride_block : 0));
  }
  int b;
  Request rq;
  if (!find_request(p.seqs, t, guess, &b, &rq)) return;  // the same for every warp of the row
  const RowSink sink{p, p.out + t * p.out_stride_token + h * p.out_stride_head, b, token_fastest};
  const int n = row_blocks(p, rq, t);
  const bool finite_only = kOptions && p.finite_only;
  if (n <= p.topk && (!finite_only || n == 0)) {  // every valid block
    if (warp == 0) sink.take_all<kOptions>(n, static_cast<unsigned>(row));
    return;
  }
  const int lo = p.force_begin, hi = n - p.force_end;  // candidates by score
  RegKeys<C> keys;
#pragma unroll
  for (int i = 0; i < C; ++i) {
    const int blk = base + 32 * i + lane;
    keys.k[i] = blk >= lo && blk < hi ? score_key(w[i], finite_only) : 0u;
  }
  CtaRow cta_row{xchg};
  select_row<true>(keys, n, p, finite_only, sink, cta_row, base);
  if constexpr (kOptions) {
    __syncthreads();  // every warp's ids written
    if (warp == 0) sink.finish(static_cast<unsigned>(row));
  }
}

}  // namespace msa::detail::cuda::indexer
