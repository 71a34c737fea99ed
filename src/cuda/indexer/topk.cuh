// select_topk (contract §4): one warp per (token, head) row.
//
// Each score becomes a 32-bit key whose unsigned order is the contract's order (NaN lowest, below -inf;
// -0 == +0), and 0 marks blocks that are not candidates (forced, or past the row's valid blocks). The
// k'-th largest key (k' = topk - forced) is found by a bitwise search from the top bit: per bit one
// compare per key and one warp reduction, stopping as soon as the prefix isolates exactly k' keys
// (~18 of 32 bits on random scores). One ascending pass over the blocks then takes the forced blocks,
// every key above the threshold and the lowest-index keys equal to it (ties to the lower index), and
// writes them in order through ballot prefix counts, -1 after them: any output strides, no sort.
#pragma once

#include "cuda/indexer/device.cuh"

namespace msa::detail::cuda::indexer {

__device__ __forceinline__ uint32_t score_key(float s) {
  if (s != s) return 1u;                                       // NaN: lowest of all candidates
  const uint32_t u = __float_as_uint(s == 0.f ? 0.f : s);      // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);           // -inf -> 0x007FFFFF >= 2
}

// Keys of one row held in registers: lane l has blocks l, l+32, ..., CAP of them.
template <int CAP>
struct RegKeys {
  uint32_t k[CAP];
  int nch;  // chunks of 32 blocks in use
  template <typename F>
  __device__ __forceinline__ void each(F&& f) const {
#pragma unroll
    for (int i = 0; i < CAP; ++i)
      if (i < nch) f(i, k[i]);
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

// Selects and writes one row; n > topk valid blocks, keys built for blocks [fb, n - fe).
template <typename Keys>
__device__ __forceinline__ void select_row(const Keys& keys, int n, const SelectTopkParams& p, int32_t* out) {
  const int lane = threadIdx.x & 31;
  const unsigned lt = (1u << lane) - 1u;
  const int kp = p.topk - p.force_begin - p.force_end;  // blocks chosen by score
  uint32_t thr = 0xFFFFFFFFu;                            // above every key: nothing by score
  int need_eq = 0;
  if (kp > 0) {
    thr = 0;
    int cnt = n - p.force_begin - p.force_end;  // keys >= thr, counting candidates only (keys >= 1)
    for (int bit = 31; bit >= 0 && cnt != kp; --bit) {
      const uint32_t cand = thr | (1u << bit);
      int c = 0;
      keys.each([&](int, uint32_t k) { c += k >= cand; });
      c = __reduce_add_sync(kFullMask, c);
      if (c >= kp) thr = cand, cnt = c;
    }
    if (cnt == kp) {  // exactly k' keys >= thr: the smallest of them is the k'-th largest
      const uint32_t lo = thr > 1u ? thr : 1u;
      uint32_t mn = 0xFFFFFFFFu;
      keys.each([&](int, uint32_t k) { mn = k >= lo && k < mn ? k : mn; });
      thr = __reduce_min_sync(kFullMask, mn);
    }
    int gt = 0;
    keys.each([&](int, uint32_t k) { gt += k > thr; });
    need_eq = kp - __reduce_add_sync(kFullMask, gt);
  }
  int pos = 0, eq_seen = 0;
  keys.each([&](int i, uint32_t k) {
    const int blk = 32 * i + lane;
    const bool forced = blk < n && (blk < p.force_begin || blk >= n - p.force_end);
    const bool eq = k == thr;
    const unsigned eqm = __ballot_sync(kFullMask, eq);
    const bool sel = forced || k > thr || (eq && eq_seen + __popc(eqm & lt) < need_eq);
    const unsigned selm = __ballot_sync(kFullMask, sel);
    if (sel) out[(pos + __popc(selm & lt)) * p.out_stride_k] = blk;
    pos += __popc(selm);
    eq_seen += __popc(eqm);
  });
  for (int j = pos + lane; j < p.topk; j += 32) out[j * p.out_stride_k] = -1;
}

// CAP > 0: keys in registers, CAP per lane. CAP == 0: keys in dynamic shared memory, one warp per CTA.
template <int CAP>
__global__ void __launch_bounds__(512) select_topk_kernel(const SelectTopkParams p, bool token_fastest) {
  extern __shared__ uint32_t smem_keys[];
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  const int64_t T = p.seqs.total_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
  if (row >= T * p.num_heads) return;
  const int64_t t = token_fastest ? row % T : row / p.num_heads;
  const int h = static_cast<int>(token_fastest ? row / T : row % p.num_heads);

  const int b = warp_last_le(p.seqs.batch_size, t,
                             [&](int i) { return clamp_to<int64_t>(p.seqs.qo_indptr[i], 0, T); });
  if (b < 0) return;
  const Request rq = load_request(p.seqs, b);
  if (t >= rq.q_begin + rq.q_len) return;  // not a token of the batch
  const int64_t pos = rq.offset + (t - rq.q_begin);
  const int64_t nkv = min64((rq.kv_len + kBlock - 1) / kBlock, p.max_blocks);
  const int n = static_cast<int>(p.causal ? (pos < 0 ? 0 : min64(pos / kBlock + 1, nkv)) : nkv);

  int32_t* out = p.out + t * p.out_stride_token + h * p.out_stride_head;
  if (n <= p.topk) {  // every valid block
    for (int j = lane; j < p.topk; j += 32) out[j * p.out_stride_k] = j < n ? j : -1;
    return;
  }
  const float* srow = p.scores + t * p.s_stride_token + h * p.s_stride_head;
  const int lo = p.force_begin, hi = n - p.force_end;  // candidates by score
  const int nch = (n + 31) / 32;
  if constexpr (CAP > 0) {
    RegKeys<CAP> keys;
    keys.nch = nch;
    // All loads first (unconditional, address clamped to block 0) so they are in flight together.
    float v[CAP];
#pragma unroll
    for (int i = 0; i < CAP; ++i) {
      const int blk = 32 * i + lane;
      v[i] = __ldg(srow + (i < nch && blk >= lo && blk < hi ? blk * p.s_stride_block : 0));
    }
#pragma unroll
    for (int i = 0; i < CAP; ++i) {
      const int blk = 32 * i + lane;
      keys.k[i] = i < nch && blk >= lo && blk < hi ? score_key(v[i]) : 0u;
    }
    select_row(keys, n, p, out);
  } else {
    uint32_t* buf = smem_keys + (threadIdx.x >> 5) * ((p.max_blocks + 31) / 32 * 32);
    for (int i = 0; i < nch; ++i) {
      const int blk = 32 * i + lane;
      buf[i * 32 + lane] = blk >= lo && blk < hi ? score_key(__ldg(srow + blk * p.s_stride_block)) : 0u;
    }
    __syncwarp();
    select_row(SmemKeys{buf, nch}, n, p, out);
  }
}

}  // namespace msa::detail::cuda::indexer
