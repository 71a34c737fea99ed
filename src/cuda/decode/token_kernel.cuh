// The single-token sparse decode kernel (plan_token_kernel picks it). Its split plans are sm_90 only (cluster
// merges; the dense plans' merge kernel), so below sm_90 code (no push merge compiled) it serves only the plans it
// runs unsplit. It sits
// beside the general paged kernel (kernel.cuh, sm_80+) because it serves the same decode plans: one query
// token per CTA (or cluster of splits), head dim 128, a GQA group of at most 16 heads (M3: 16), top-k <= 32
// blocks, pages of a multiple of 64 tokens; one token per request, or MTP (up to kTokenMaxQoLen tokens per
// request, a CTA per token, each causal at its own position) when the group takes 16 rows per token. It
// computes what the general kernel computes for such plans, with less machinery on the critical path of
// small batches (M3-TP4 D-mtp: 39.3 us on the general kernel, 34.1 here; docs/decode.md).
//
// Why a second kernel: at D-B1 (M3-TP1, 16 splits of one block each) the general kernel runs ~13 us,
// a chain of latency-bound steps, 2224 instructions per warp at 10 cycles each (ncu): the sorted
// list build for a tile of tokens, a page-table read per key one tile ahead, the combine of four
// warps' softmax states (~480 instructions per warp, the largest part), then the cluster merge.
// Here (one token, one list per CTA):
//  * warp 0 reads the token's block indexes (row b guessed, as the general kernel does) and at once
//    the page of each selected block (one read per 64-key tile, not per key), then sorts the blocks in
//    registers while those reads are in flight: index -> page -> K/V are the only dependent reads;
//  * the 4 warps split each 64-key tile 16 keys apiece for S = Q K^T, exchange row maxima and sums
//    through shared memory (two barriers), and split the head dim 32 columns apiece for O += P V: the
//    softmax state is the same in every warp, so there is no combine at the end (fp8 K/V: each warp takes
//    its 16 keys of a tile for both products with its own softmax state, and the warps merge once at the
//    end: token_fp8_loop.cuh);
//  * splits (<= 16) merge inside a thread-block cluster through distributed shared memory
//    by pushing (kPushMerge, where the plan's clusters fit: see push_merge_receive below), else
//    through split_merge.cuh (the general kernel's pull merge; bitwise the same); a dense plan of more splits
//    than a cluster holds writes each split's rows to the workspace, merged by a second kernel
//    (token_merge_kernel.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/arch/fast_math.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/arch/sm90.cuh"
#include "cuda/arch/sm90_cluster.cuh"
#include "cuda/decode/config.cuh"
#include "cuda/decode/fp8_tile.cuh"
#include "cuda/decode/kernel_params.cuh"
#include "cuda/decode/merge_math.cuh"
#include "cuda/decode/prewait_prefetch.cuh"
#include "cuda/decode/request.cuh"
#include "cuda/decode/split_merge.cuh"
#include "cuda/decode/token_config.h"
#include "cuda/decode/token_fp8_loop.cuh"
#include "cuda/decode/token_logits.cuh"
#include "cuda/decode/token_trace.cuh"

namespace msa::detail::cuda::decode {

// The push merge (kPushMerge, S > 1; D-B1 10.24 -> 8.42 us against the pull merge, same run). The pull
// merge of split_merge.cuh costs two cluster barriers: every CTA waits for the slowest split, reads the
// other splits' rows through distributed shared memory, and then waits until every CTA is done reading
// its own rows before it may exit (D-B1: 52% of the warp samples sat at those barriers under ncu). Here
// each CTA owns rows r = rank + jS as in the pull merge, but the other splits send it those rows with
// st.async, which completes bytes on the owner's mbarrier: a sender exits as soon as its stores are
// issued (they read registers, not its shared memory), and an owner merges as soon as its own rows have
// arrived, from its own shared memory. One cluster barrier remains, split into an arrive at the start
// (after the mbarrier's init) and a wait before the first send, by which time every CTA of the cluster
// has long arrived. The merge arithmetic is merge_splits_in_cluster's, in the same split order, so the
// result is bitwise the pull merge's.
//
// The owner merges in two steps. (A) One warp per owned row takes the max of the split lse values
// (a butterfly; merge_splits_in_cluster's fold in split order gives the same value, see below) and
// lane s takes split s's weight;
// the weights and the max go to shared memory. (B) Every thread takes W = 1, 2, 4 or 8 consecutive
// values of an owned row (S = 16: one row, one value per thread) and sums the splits' values with
// those weights, the sum of the weights in split order beside it. Per value this is
// merge_splits_in_cluster's arithmetic in its order, so the bits are the pull merge's: a skipped split
// (lse = -inf, or s >= S) has weight 0 and value 0 (a sender with no key sends zeros), and adds
// fmaf(0, 0, acc) = acc (acc starts at +0 and is never -0). Written as one loop per thread, with the
// weights under a branch, this merge took ~1800 cycles at D-B1 (token_trace): 16 divergence
// regions in a row around the exp2s, ~470 dependent instructions per thread.
template <int D, int W, typename RealRow, typename Emit>
__device__ __forceinline__ void push_merge_receive(const float* recv_o, const float* recv_lse, float* merge_w, int S,
                                                   int rank, int rows_per_split, int owned, const RealRow& real,
                                                   const Emit& emit) {
  static_assert(W == 1 || W == 2 || W == 4 || W == 8, "W values per thread: one vector load or two");
  constexpr int kGroups = D / W;
  // The splits a W variant can see: it serves owned = ceil(G / S) rows (the caller's dispatch) with G <= 16, so
  // owned >= 5 (W = 8) means S <= 3, owned 3..4 (W = 4) S <= 7, owned 2 (W = 2) S <= 15. (B) runs that many
  // split steps instead of 16: the ones it leaves out added fmaf(0, 0, acc) = acc and sum + 0, so the bits
  // are the same (M3-TP4 D-B64's merge at S = 2 took ~1850 cycles with 16 steps, token_trace).
  static_assert(kTokenRows <= 16 && kMaxClusterSplits == 16, "the split bounds below assume G <= 16");
  constexpr int kSplitSteps = W == 8 ? 4 : W == 4 ? 8 : 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int jj = warp; jj < owned; jj += kTokenThreads / 32) {  // (A)
    // The max by a butterfly over the lanes (lane s: split s) instead of a fold in split order: the
    // same value whenever no lse is NaN (max picks one of its inputs; -inf is the identity; a +0 / -0
    // tie gives weight 1 and the same lse either way); a NaN lse makes its weight, the sum and so
    // the row NaN with either max. fmaxf passes over a NaN: where every other split is empty the max stays -inf,
    // and (B) finds the NaN split by its weight, exp2(NaN) (a vote for a NaN max here cost D-B1 0.12 us).
    const float ls = lane < S ? recv_lse[lane * rows_per_split + jj] : -INFINITY;
    float m = ls;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane < kMaxClusterSplits) {
      const float w = lse_weight_eager(ls, m);
      merge_w[jj * kTokenMergeWStride + lane] = ls == -INFINITY ? 0.f : w;
    }
    if (lane == 0) merge_w[jj * kTokenMergeWStride + kMaxClusterSplits] = m;
  }
  __syncthreads();
  for (int u = threadIdx.x; u < owned * kGroups; u += kTokenThreads) {  // (B)
    const int jj = u / kGroups, c = u - jj * kGroups, r = rank + jj * S;
    if (!real(r)) continue;
    const float* wrow = merge_w + jj * kTokenMergeWStride;
    const float m = wrow[kMaxClusterSplits];
    float acc[W];
#pragma unroll
    for (int e = 0; e < W; ++e) acc[e] = 0.f;
    float lse = -INFINITY;
    if (m != -INFINITY) {
      float sum = 0.f;
#pragma unroll
      for (int s = 0; s < kSplitSteps; ++s) {
        const float wt = wrow[s];
        sum += wt;
        float x[W];
        const float* row = recv_o + (s * rows_per_split + jj) * D + c * W;
#pragma unroll
        for (int e = 0; e < W; e += 4 > W ? W : 4) {
          if constexpr (W == 1) {
            x[0] = s < S ? row[0] : 0.f;
          } else if constexpr (W == 2) {
            const float2 v = s < S ? *reinterpret_cast<const float2*>(row) : make_float2(0.f, 0.f);
            x[0] = v.x, x[1] = v.y;
          } else {
            const float4 v = s < S ? *reinterpret_cast<const float4*>(row + e) : make_float4(0.f, 0.f, 0.f, 0.f);
            x[e] = v.x, x[e + 1] = v.y, x[e + 2] = v.z, x[e + 3] = v.w;
          }
        }
#pragma unroll
        for (int e = 0; e < W; ++e) acc[e] = fmaf(wt, x[e], acc[e]);
      }
      const float inv = merge_inv(sum);
#pragma unroll
      for (int e = 0; e < W; ++e) acc[e] *= inv;
      lse = m + merge_log(sum);
    } else {  // no split with a finite lse: 0 and -inf, or NaN where a split met a NaN (its weight is NaN)
      float nan = 0.f;
#pragma unroll
      for (int s = 0; s < kSplitSteps; ++s) nan += wrow[s];
#pragma unroll
      for (int e = 0; e < W; ++e) acc[e] = nan;
      if (nan != 0.f) lse = nan;
    }
    emit(r, c * W, acc, lse);
  }
}

// T: q's and o's type; KV: the cache's (T, or E4M3: the tile loop of token_fp8_loop.cuh, K and V fragments
// read straight from the fp8 rows).
template <typename T, typename KV, bool kPushMerge>
__global__ void __launch_bounds__(kTokenThreads, 2) token_decode_kernel(const __grid_constant__ KernelParams kp) {
  constexpr int D = kTokenHeadDim;
  constexpr bool kF8 = kIsFp8<KV>;
  using PT = PvType<T, KV>;                                   // P V's MMA type
  constexpr uint32_t kRowBytes = D * 2;                       // one 16-bit K / V / Q row
  constexpr uint32_t kTileBytes = kTokenTileKeys * kRowBytes;  // K (or V) of one 16-bit tile: 16 KB
  [[maybe_unused]] constexpr uint32_t kStageBytes = 2 * kTileBytes;  // 16-bit stages only
  // The ring: kTokenStages 16-bit stages, or kTokenStagesFp8 fp8 stages in the same bytes.
  constexpr int kStages = kF8 ? kTokenStagesFp8 : kTokenStages;
  constexpr uint32_t kLoadRowBytes = D * sizeof(KV);
  constexpr uint32_t kLoadStageBytes = 2 * kTokenTileKeys * kLoadRowBytes;
  constexpr unsigned kFull = 0xffffffffu;

  extern __shared__ __align__(128) unsigned char smem[];
  const AttentionParams& p = kp.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = blockIdx.y, split = blockIdx.z, S = gridDim.z;
  // Dense (no block indexes): every block of the token's visible range, split s taking a contiguous share.
  const bool dense = p.block_idx == nullptr;
  // CTA x serves token ti of request b: x = (b << tq_shift) + ti, 2^tq_shift = TQ rounded up to a power of
  // two (TQ = the plan's tokens per request: 1 for plain decode, up to kTokenMaxQoLen for MTP). A shift,
  // not a division by TQ: b addresses the first trip's reads (a division there cost D-B1 ~0.02 us).
  const int TQ = kp.spec_qo_len;
  const int b = static_cast<int>(blockIdx.x >> kp.tq_shift),
            ti = static_cast<int>(blockIdx.x & ((1u << kp.tq_shift) - 1u));
  // A full batch of TQ tokens per request has request b's token ti at row x_cta.
  const int64_t x_cta = static_cast<int64_t>(b) * TQ + ti;
  const uint32_t s_stages = arch::smem_addr(smem) + kTokenSmemStages;
  const uint32_t s_q = arch::smem_addr(smem) + kTokenSmemQ;
  const uint32_t s_p = arch::smem_addr(smem) + kTokenSmemP;
  float* red_max = reinterpret_cast<float*>(smem + kTokenSmemRedMax);  // [warp][row]
  float* red_sum = reinterpret_cast<float*>(smem + kTokenSmemRedSum);  // [warp][row]
  TokenTile* tiles = reinterpret_cast<TokenTile*>(smem + kTokenSmemTiles);
  int* n_tiles_smem = reinterpret_cast<int*>(smem + kTokenSmemCount);

  // Before the wait (PDL: the grid is resident while the previous kernel runs): the first trips' lines into
  // the L2 (prewait_prefetch.cuh).
  if (kp.prewait_prefetch != 0 && warp == 0) prefetch_first_trips(kp, lane, b, g, x_cta, 1);
  arch::grid_dependency_wait();   // nothing the previous kernel wrote is read before this (PDL)
  MSA_TRACE_DECL;
  arch::allow_dependent_launch();

  // ---- 1. the request, and (warp 0) the block indexes of the guessed token row x -------------------
  // A full batch has request b's token ti at row x = b * TQ + ti: reading the indexes now overlaps the
  // qo_indptr read that would otherwise come first; a wrong guess (a ragged batch) reads again.
  const int topk = p.topk;
  const auto read_entry = [&](int64_t tok) {
    return p.block_idx[tok * p.bi_stride_token + static_cast<int64_t>(g) * p.bi_stride_head +
                       static_cast<int64_t>(lane) * p.bi_stride_k];
  };
  int32_t entry = -1;
  if (warp == 0 && lane < topk && x_cta < p.seqs.total_q) entry = read_entry(x_cta);
  // The request's rows, lengths and page-row bounds, read in the same round trip as the guessed index
  // row, so that the page reads below leave after one round trip. Every one of them is used before the
  // early return of an empty token: otherwise ptxas sinks the length loads past that return and the
  // page reads leave after three round trips.
  const int32_t qo_a = p.seqs.qo_indptr[b], qo_c = p.seqs.qo_indptr[b + 1];
  const int32_t pg_a = p.pages.indptr ? p.pages.indptr[b] : 0, pg_c = p.pages.indptr ? p.pages.indptr[b + 1] : 0;
  // request_rows' clamp in 32 bits (qo_indptr holds int32, so total_q past INT32_MAX clamps nothing more):
  // these and the lengths below sit between the first trip and the page reads on warp 0's path.
  const int32_t total_q32 = static_cast<int32_t>(min(p.seqs.total_q, int64_t{INT32_MAX}));
  const int32_t q0i = min(max(qo_a, 0), total_q32), q1i = min(max(qo_c, q0i), total_q32);
  // q0: this CTA's token row (request b's row q0i + ti); tokens past the request's qo_len have no CTA work.
  const int64_t q0 = static_cast<int64_t>(q0i) + ti;
  MSA_TRACE_MARK(1, qo_a + qo_c + pg_a + pg_c + entry);  // the first round trip
  const bool has_token = q1i - q0i > ti && ti < TQ;  // the plan's limit (CTAs past TQ pad the power of two)
  const int kv_len = max(p.seqs.kv_lens[b], 0);
  // The token's position (contract: qo_offset[b] + ti, by default kv_len - qo_len + ti), in 64 bits.
  const int64_t pos = static_cast<int64_t>(p.seqs.qo_offset ? p.seqs.qo_offset[b] : kv_len - (q1i - q0i)) + ti;
  // Keys [0, kv_hi) are visible to the token (causal: up to its position): max(0, min(kv_len, pos + 1)).
  const int kv_hi = p.causal ? (pos >= kv_len ? kv_len : static_cast<int>(max(pos + 1, int64_t{0}))) : kv_len;
  int64_t row_base, row_len;
  if (p.pages.indptr) {
    const int64_t cap = p.pages.row_capacity;
    const int64_t a = min(max(static_cast<int64_t>(pg_a), int64_t{0}), cap);
    row_base = a;
    row_len = min(max(static_cast<int64_t>(pg_c), a), cap) - a;
  } else {
    row_base = static_cast<int64_t>(b) * p.pages.row_stride;
    row_len = p.pages.row_capacity;
  }

  // ---- 1b. warp 0: the page of each of the selected blocks' 64-key tiles, issued now -----------------
  // Then the blocks are sorted while those reads are in flight.
  int32_t page[2] = {-1, -1}, off[2] = {0, 0};
  uint32_t key = 0xffffffffu;
  if (warp == 0) {
    if (q0 != x_cta && lane < topk) entry = has_token ? read_entry(q0) : -1;
    if (dense) {  // lane e: block lb + e of this split's share, ceil(blocks / S) <= 32 blocks (the plan's bound)
      const int nb = static_cast<int>((static_cast<uint32_t>(kv_hi) + kBlock - 1) / kBlock);
      const int chunk = (nb + S - 1) / S, lb = split * chunk;
      entry = lane < chunk && lb + lane < nb ? lb + lane : -1;
    }
    // A block is taken when it holds a visible key: 0 <= e and e * 128 < kv_hi (below kv_len and, when
    // causal, not past the token's position).
    const bool ok = has_token && (lane < topk || dense) && entry >= 0 &&
                    static_cast<uint32_t>(entry) < (static_cast<uint32_t>(kv_hi) + kBlock - 1) / kBlock;
    if (ok) {
      const uint32_t ps = static_cast<uint32_t>(p.k.page_size);
      // entry * 128 < kv_hi <= INT32_MAX, so ju < 2^31 + 64: 32-bit unsigned arithmetic is exact.
      const uint32_t ju[2] = {static_cast<uint32_t>(entry) * kBlock,
                              static_cast<uint32_t>(entry) * kBlock + kTokenTileKeys};
      uint32_t lp[2];
      if (kp.page_shift >= 0) {  // one branch for both tiles (a power-of-two page: every plan the bench makes)
        lp[0] = ju[0] >> kp.page_shift, lp[1] = ju[1] >> kp.page_shift;
      } else {
        lp[0] = ju[0] / ps, lp[1] = ju[1] / ps;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (ju[h] < static_cast<uint32_t>(kv_hi) && lp[h] < row_len) {
          page[h] = __ldg(p.pages.table + row_base + lp[h]);
          off[h] = static_cast<int32_t>(ju[h] - lp[h] * ps);
        }
      }
    }
    // Bitonic sort of (block << 5 | lane), ascending; lanes without a block hold the largest key.
    key = ok ? (static_cast<uint32_t>(entry) << 5) | static_cast<uint32_t>(lane) : 0xffffffffu;
    // With top-k <= 16 (M3) lanes 16-31 hold the largest key, so sorting lanes 0-15 (10 dependent
    // shuffles instead of 15) sorts the warp.
    const auto bitonic = [&](auto last) {
#pragma unroll
      for (int k = 2; k <= decltype(last)::value; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
          const uint32_t other = __shfl_xor_sync(kFull, key, j);
          const bool up = (lane & k) == 0, low = (lane & j) == 0;
          key = (low == up) ? min(key, other) : max(key, other);
        }
      }
    };
    if (!dense) {  // a dense share is ascending by lane already
      if (topk <= 16)
        bitonic(std::integral_constant<int, 16>{});
      else
        bitonic(std::integral_constant<int, 32>{});
    }
  }
  if (!has_token) return;  // every split of this (request, head) returns here
  const int G = p.group_size;
  // Rows of the group split `split` owns in a merge: r = split + jS < G.
  // x / S for 0 <= x <= 47 and S <= 16 without a division: (x * ceil(2^16 / S)) >> 16 == x / S (the
  // product's excess, x * (ceil(2^16/S) - 2^16/S) / 2^16 < 1/S, never carries past the next multiple of
  // 1/S); kp.split_magic = ceil(2^16 / S) comes from the host (computed here, ptxas sank its division to
  // the use). Used on warp 0's path (the split range) and in the merge tail, where each division was an
  // integer-division sequence on the path from the last MMA to the sends.
  const auto div_s = [&](int x) { return static_cast<int>((static_cast<uint32_t>(x) * kp.split_magic) >> 16); };
  const auto owned_rows = [&] { return split < G ? div_s(G - 1 - split) + 1 : 0; };
  if constexpr (kPushMerge) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (S > 1) {
      if (tid == 32) {  // one arrival, announcing the bytes every split will send this CTA (warp 1: off warp 0's path)
        uint64_t* merge_bar = reinterpret_cast<uint64_t*>(smem + kTokenSmemMergeBar);
        arch::mbarrier_init(merge_bar, 1);
        arch::fence_mbarrier_init();
        arch::mbarrier_arrive_expect_tx(merge_bar, static_cast<uint32_t>(owned_rows() * S * (D * 4 + 4)));
      }
      arch::cluster_arrive_relaxed();
    }
#endif
  }

  // ---- 2a. Q: 16 rows (heads g*G .. g*G+G-1, zeros past G) x 128 dims, 16-byte chunks swizzled -------
  {
    const T* qg = static_cast<const T*>(p.q) + q0 * p.q_stride_token + static_cast<int64_t>(g) * G * p.q_stride_head;
    // By warps 1-3 (256 chunks of 16 bytes, 3 per thread): warp 0 builds the list meanwhile.
    if (warp != 0) {
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        const int idx = tid - 32 + k * (kTokenThreads - 32), r = idx >> 4, c = idx & 15;
        const bool ok = r < G;
        if (idx < kTokenRows * 16)
          arch::cp_async_16(s_q + r * kRowBytes + ((c ^ (r & 7)) << 4), ok ? qg + r * p.q_stride_head + c * 8 : p.q,
                            ok ? 16 : 0);
      }
    }
    arch::cp_async_commit();
  }

  // ---- 2b. warp 0: pages of the selected blocks, the sorted list, this split's tiles -----------------
  if (warp == 0) {
    // Distinct blocks, ranked in ascending order (a duplicate entry counts once).
    const uint32_t prev = __shfl_up_sync(kFull, key, 1);
    const bool first = key != 0xffffffffu && (lane == 0 || (prev >> 5) != (key >> 5));
    const unsigned firsts = __ballot_sync(kFull, first);
    const int n_list = __popc(firsts), rank = __popc(firsts & ((1u << lane) - 1u));
    int lb, le;  // this split's range of the list, as in the general kernel
    if (dense) {  // the list is this split's share already
      lb = 0;
      le = n_list;
    } else if (kp.fixed_split_blocks > 0) {
      const int64_t F = kp.fixed_split_blocks;
      lb = static_cast<int>(min(static_cast<int64_t>(n_list), split * F));
      le = split == S - 1 ? n_list : static_cast<int>(min(static_cast<int64_t>(n_list), lb + F));
    } else {
      const int chunk = div_s(n_list + S - 1);  // ceil(n_list / S); n_list + S - 1 <= 47
      lb = min(n_list, split * chunk);
      le = min(n_list, lb + chunk);
    }
    const int src = static_cast<int>(key & 31u);
    MSA_TRACE_MARK(2, page[0] + page[1]);  // the pages (thread 0: lane 0's block)
    const int32_t pg0 = __shfl_sync(kFull, page[0], src), pg1 = __shfl_sync(kFull, page[1], src);
    const int32_t of0 = __shfl_sync(kFull, off[0], src), of1 = __shfl_sync(kFull, off[1], src);
    const bool mine = first && rank >= lb && rank < le;
    const int64_t j0 = static_cast<int64_t>(key >> 5) * kBlock;
    // A tile whose page is missing or outside the pool shows nothing (its keys are skipped).
    const bool t0 = mine && pg0 >= 0 && pg0 < p.pages.num_pages;
    const bool t1 = mine && pg1 >= 0 && pg1 < p.pages.num_pages && j0 + kTokenTileKeys < kv_hi;
    // Exclusive scan of the lanes' tile counts (0, 1 or 2) in sorted order, by two ballots: the lanes below
    // holding a tile 0 plus those holding a tile 1 (instead of 5 dependent shuffles on warp 0's path).
    const unsigned has0 = __ballot_sync(kFull, t0), has1 = __ballot_sync(kFull, t1), below = (1u << lane) - 1u;
    int at = __popc(has0 & below) + __popc(has1 & below);
    if (lane == 0) *n_tiles_smem = __popc(has0) + __popc(has1);
    const int64_t kh = static_cast<int64_t>(g) * p.k.stride_head, vh = static_cast<int64_t>(g) * p.v.stride_head;
    if (t0) {
      tiles[at] = TokenTile{pg0 * p.k.stride_page + of0 * p.k.stride_token + kh,
                            pg0 * p.v.stride_page + of0 * p.v.stride_token + vh,
                            static_cast<int32_t>(min(static_cast<int64_t>(kTokenTileKeys), kv_hi - j0)), 0};
      ++at;
    }
    if (t1)
      tiles[at] = TokenTile{
          pg1 * p.k.stride_page + of1 * p.k.stride_token + kh, pg1 * p.v.stride_page + of1 * p.v.stride_token + vh,
          static_cast<int32_t>(min(static_cast<int64_t>(kTokenTileKeys), kv_hi - j0 - kTokenTileKeys)), 0};
  }
  __syncthreads();
  const int n_tiles = *n_tiles_smem;
  MSA_TRACE_MARK(3, n_tiles);  // the sorted list and the tiles, in every warp

  // ---- 3. K/V tiles through a cp.async ring of kStages stages -----------------------------------------
  // 16-bit: thread (row r0 + 16i, chunks t8 and t8 + 8): each instruction moves 128 contiguous bytes of a row;
  // rows past the tile's visible keys are zero-filled (nothing read), so P = 0 meets V = 0 there. Rows land
  // swizzled. fp8: each warp copies its own rows (Fp8TileCopy, token_fp8_loop.cuh).
  const KV* kg = static_cast<const KV*>(p.k.data);
  const KV* vg = static_cast<const KV*>(p.v.data);
  [[maybe_unused]] const Fp8TileCopy copy_fp8(p.k.data, p.v.data, p.k.stride_token, p.v.stride_token, s_stages);
  const int r0 = tid >> 3, t8 = tid & 7;
  constexpr int kRowChunks = kLoadRowBytes / 128;  // 128-byte pieces of a row
  constexpr int kChunkElems = 16 / sizeof(KV);
  const uint32_t ld_dst = r0 * kLoadRowBytes + ((t8 ^ (r0 & 7)) << 4);
  const auto issue = [&](int x, int stage) {
    if constexpr (kF8) {
      copy_fp8(tiles, n_tiles, x, stage);
    } else {
      if (x < n_tiles) {
        const TokenTile t = tiles[x];
        const uint32_t ks = s_stages + stage * kLoadStageBytes + ld_dst, vs = ks + kTileBytes;
        const KV* kr = kg + t.k_off + t8 * kChunkElems;
        const KV* vr = vg + t.v_off + t8 * kChunkElems;
#pragma unroll
        for (int i = 0; i < kTokenTileKeys / 16; ++i) {
          const int r = r0 + 16 * i;
          const bool fill = r < t.visible;
          const KV* krow = fill ? kr + r * p.k.stride_token : kg;
          const KV* vrow = fill ? vr + r * p.v.stride_token : vg;
#pragma unroll
          for (int c = 0; c < kRowChunks; ++c) {
            arch::cp_async_16_pred(ks + 16 * i * kLoadRowBytes + c * 128, krow + (fill ? c * 8 * kChunkElems : 0),
                                   fill);
            arch::cp_async_16_pred(vs + 16 * i * kLoadRowBytes + c * 128, vrow + (fill ? c * 8 * kChunkElems : 0),
                                   fill);
          }
        }
      }
      arch::cp_async_commit();  // empty groups too: the wait counts stay uniform
    }
  };
  // fp8: the plan's kp.num_stages of the ring's stages are used (token_config.h); the groups past them are
  // committed empty, so that Q stays the oldest of kStages groups.
#pragma unroll
  for (int x = 0; x < kStages - 1; ++x) issue(kF8 && x >= kp.num_stages - 1 ? n_tiles : x, x);
  if constexpr (kPushMerge) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The cluster barrier's wait (every CTA of the cluster has initialized its merge barrier) taken
    // while the first K/V tiles are in flight: at the sends it cost ~600 cycles of the D-B1 tail
    // (token_trace, normalize included); every CTA arrived at its start long before.
    if (S > 1) arch::cluster_wait();
#endif
  }
  // The push merge's destinations of this thread's two rows (owner CTA, slot, mapped addresses), found
  // here while the tiles fly: at the sends they are ~330 instructions with the normalize (integer
  // divisions by S, mapa), ~585 cycles of the D-B1 tail (token_trace).
  // (Unused where the push merge is compiled out: the pull instantiation, sm_80, the host pass.)
  [[maybe_unused]] float* send_o[2] = {nullptr, nullptr};
  [[maybe_unused]] float* send_lse[2] = {nullptr, nullptr};
  [[maybe_unused]] uint64_t* send_bar[2] = {nullptr, nullptr};
  if constexpr (kPushMerge) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (S > 1) {
      const int rows_per_split = div_s(kTokenRows + S - 1);
      uint64_t* merge_bar = reinterpret_cast<uint64_t*>(smem + kTokenSmemMergeBar);
      float* recv_lse = reinterpret_cast<float*>(smem + kTokenSmemRecvLse);
      float* recv_o = reinterpret_cast<float*>(smem + kTokenSmemRecvO);
      // 16-bit: rows lane / 4 and lane / 4 + 8, dims 32 warp + 8n + 2 (lane % 4) + {0, 1}; fp8: row tid / 8, dims
      // 16 (tid % 8) .. + 15 (token_fp8_row_run)
#pragma unroll
      for (int j = 0; j < (kF8 ? 1 : 2); ++j) {
        const int r = kF8 ? tid >> 3 : (lane >> 2) + 8 * j;
        if (r >= G) continue;
        const int q = div_s(r);
        const unsigned owner = static_cast<unsigned>(r - q * S);
        const int slot = split * rows_per_split + q;
        send_bar[j] = static_cast<uint64_t*>(__cluster_map_shared_rank(merge_bar, owner));
        send_o[j] = static_cast<float*>(__cluster_map_shared_rank(recv_o + slot * D, owner)) +
                    (kF8 ? 16 * (tid & 7) : warp * 32 + 2 * (lane & 3));
        send_lse[j] = static_cast<float*>(__cluster_map_shared_rank(recv_lse + slot, owner));
      }
    }
#endif
  }

  // Q fragments (A operand of 8 k-steps) in registers; Q is the oldest cp.async group.
  arch::cp_async_wait<kStages - 1>();
  __syncthreads();
  uint32_t qa[D / 16][4];
  float logit_scale[2] = {kp.scale_log2, kp.scale_log2};  // of rows row0 and row0 + 8 (exp2 domain)
  if constexpr (kF8) {  // fp16 Q in the dim order of k_fragment_fp8_unchecked (fp8_tile.cuh)
    float unscale[2];
    q_fragments_dim_permuted<T>(s_q, lane, qa, unscale);
#pragma unroll
    for (int j = 0; j < 2; ++j) logit_scale[j] = kp.scale_log2 * unscale[j] * arch::e4m3_f16_unscale();
  } else {
    const int mi = lane >> 3, r = (mi & 1) * 8 + (lane & 7);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      arch::ldmatrix_x4(qa[kk], s_q + r * kRowBytes + (((2 * kk + (mi >> 1)) ^ (r & 7)) << 4));
  }

  // ---- 4. per tile: S = Q K^T (16 keys per warp), softmax across the warps, O += P V (32 dims per warp) -
  // (fp8: token_fp8_loop.cuh, every warp its own 16 keys of a tile for both products)
  const int row0 = lane >> 2;                     // this thread's rows: row0 and row0 + 8
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[4][4];
#pragma unroll
  for (int n = 0; n < 4; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  if constexpr (kF8) {
    float* merge_buf = reinterpret_cast<float*>(smem + kTokenSmemStages);
    token_tile_loop_fp8(copy_fp8, tiles, n_tiles, merge_buf, red_max, red_sum, qa, logit_scale, m_run, l_run,
                        kp.num_stages);
    if (S == 1) {  // o as two 16-byte runs per thread, summed straight from the merge buffer
      MSA_TRACE_MARK(12, __float_as_uint(l_run[0]));
      const int r = tid >> 3, c = tid & 7;
      if (r < G) {
        float v[16];
        const float row_lse =
            token_fp8_row_run<false>(merge_buf, red_max, red_sum, p.v_scale * arch::e4m3_f16_unscale(), v);
        const int64_t head = static_cast<int64_t>(g) * G + r;
        uint4* dst = reinterpret_cast<uint4*>(static_cast<T*>(p.o) + q0 * p.o_stride_token + head * p.o_stride_head +
                                              16 * c);
        dst[0] = make_uint4(arch::pack2<T>(v[0], v[1]), arch::pack2<T>(v[2], v[3]), arch::pack2<T>(v[4], v[5]),
                            arch::pack2<T>(v[6], v[7]));
        dst[1] = make_uint4(arch::pack2<T>(v[8], v[9]), arch::pack2<T>(v[10], v[11]), arch::pack2<T>(v[12], v[13]),
                            arch::pack2<T>(v[14], v[15]));
        if (p.lse && c == 0) p.lse[q0 * p.lse_stride_token + head * p.lse_stride_head] = row_lse;
      }
      MSA_TRACE_MARK(15, 0);
      MSA_TRACE_END(S);
      return;
    }
    if constexpr (!kPushMerge) {
      if (!kp.cluster_merge) {  // splits without clusters: this split's rows to the workspace (token_merge_kernel.cu)
        const int r = tid >> 3, c = tid & 7;
        if (r < G) {
          float v[16];
          const float row_lse =
              token_fp8_row_run<true>(merge_buf, red_max, red_sum, p.v_scale * arch::e4m3_f16_unscale(), v);
          const int64_t at = ((static_cast<int64_t>(blockIdx.x) * gridDim.y + g) * S + split) * kTokenRows + r;
          float4* dst = reinterpret_cast<float4*>(kp.part_o + at * D + 16 * c);
#pragma unroll
          for (int k = 0; k < 4; ++k) dst[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
          if (c == 0) kp.part_lse[at] = row_lse;
        }
        MSA_TRACE_END(S);
        return;
      }
      token_fp8_merged_fragments(merge_buf, o);  // the push merge sends row runs
    }
  } else {
    int stage = 0, issue_stage = kStages - 1;
    for (int x = 0; x < n_tiles; ++x) {
      arch::cp_async_wait<kStages - 2>();
      __syncthreads();  // tile x landed for all; every warp is done with tile x-1 (its stage, P, sums)
      issue(x + kStages - 1, issue_stage);
      issue_stage = issue_stage == kStages - 1 ? 0 : issue_stage + 1;
      const uint32_t ks = s_stages + stage * kLoadStageBytes;
      const uint32_t vs = ks + kTileBytes;
      stage = stage == kStages - 1 ? 0 : stage + 1;
      const int visible = tiles[x].visible;
      if (x < 8) MSA_TRACE_MARK(4 + x, visible);  // tile x landed

      float s[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      const int mi = lane >> 3, kr = warp * 16 + (mi >> 1) * 8 + (lane & 7);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t bk[4];
        arch::ldmatrix_x4(bk, ks + kr * kRowBytes + (((2 * kk + (mi & 1)) ^ (lane & 7)) << 4));
        arch::mma_m16n8k16<T>(s[0], qa[kk], bk[0], bk[1]);
        arch::mma_m16n8k16<T>(s[1], qa[kk], bk[2], bk[3]);
      }
      // Logits in the exp2 domain; keys past `visible` are -inf. Row maxima of this warp's 16 keys.
      float mx[2];
      scale_logits_row_max(s, warp, lane, visible, logit_scale, mx);
      if ((lane & 3) == 0) {
        red_max[warp * 16 + row0] = mx[0];
        red_max[warp * 16 + row0 + 8] = mx[1];
      }
      __syncthreads();
      float base[2], alpha[2], sum[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float m = m_run[j];
#pragma unroll
        for (int w = 0; w < 4; ++w) m = fmaxf(m, red_max[w * 16 + row0 + 8 * j]);
        base[j] = m == -INFINITY ? 0.f : m;  // a row that has seen nothing stays at p = 0
        alpha[j] = arch::exp2_approx(m_run[j] - base[j]);
        m_run[j] = m;
        sum[j] = 0.f;
      }
      // P (bf16 / fp16) to shared memory, [16 rows][64 keys], 16-byte chunks swizzled by row.
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const float p0 = arch::exp2_approx(s[n][0] - base[0]), p1 = arch::exp2_approx(s[n][1] - base[0]);
        const float p2 = arch::exp2_approx(s[n][2] - base[1]), p3 = arch::exp2_approx(s[n][3] - base[1]);
        sum[0] += p0 + p1;
        sum[1] += p2 + p3;
        const int key = warp * 16 + n * 8 + 2 * (lane & 3), chunk = key >> 3;
        const uint32_t at0 = s_p + row0 * 128 + ((chunk ^ (row0 & 7)) << 4) + (key & 7) * 2;
        const uint32_t at1 = s_p + (row0 + 8) * 128 + ((chunk ^ (row0 & 7)) << 4) + (key & 7) * 2;
        arch::st_shared_b32(at0, arch::pack2<PT>(p0, p1));
        arch::st_shared_b32(at1, arch::pack2<PT>(p2, p3));
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sum[j] += __shfl_xor_sync(kFull, sum[j], 1);
        sum[j] += __shfl_xor_sync(kFull, sum[j], 2);
      }
      if ((lane & 3) == 0) {
        red_sum[warp * 16 + row0] = sum[0];
        red_sum[warp * 16 + row0 + 8] = sum[1];
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float t = 0.f;
#pragma unroll
        for (int w = 0; w < 4; ++w) t += red_sum[w * 16 + row0 + 8 * j];
        l_run[j] = l_run[j] * alpha[j] + t;
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        o[n][0] *= alpha[0], o[n][1] *= alpha[0];
        o[n][2] *= alpha[1], o[n][3] *= alpha[1];
      }
      {
        const int mi = lane >> 3;
        const int pr = (mi & 1) * 8 + (lane & 7);        // P row of this lane's ldmatrix address
        const int vr = (mi & 1) * 8 + (lane & 7);        // V key row (within the k-step)
#pragma unroll
        for (int kk = 0; kk < kTokenTileKeys / 16; ++kk) {
          uint32_t pa[4];
          arch::ldmatrix_x4(pa, s_p + pr * 128 + (((2 * kk + (mi >> 1)) ^ (pr & 7)) << 4));
          const int key = kk * 16 + vr;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t bv[4];
            const int chunk = warp * 4 + 2 * h + (mi >> 1);
            arch::ldmatrix_x4_trans(bv, vs + key * kRowBytes + ((chunk ^ (key & 7)) << 4));
            arch::mma_m16n8k16<PT>(o[2 * h], pa, bv[0], bv[1]);
            arch::mma_m16n8k16<PT>(o[2 * h + 1], pa, bv[2], bv[3]);
          }
        }
      }
    }
  }

  MSA_TRACE_MARK(12, __float_as_uint(o[0][0]) + __float_as_uint(l_run[0]));  // the tile loop done
  // ---- 5. normalize; write o / lse, or this split's rows for its merge ----------------------------------
  float inv[2], lse[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    // V's dequantization scale too, and (fp8) the raw widening's factor (fp8.cuh)
    inv[j] = row_out_scale(l_run[j], kF8 ? p.v_scale * arch::e4m3_f16_unscale() : p.v_scale);
    lse[j] = row_lse(m_run[j], l_run[j]);
  }
  T* og = static_cast<T*>(p.o) + q0 * p.o_stride_token + static_cast<int64_t>(g) * G * p.o_stride_head;
  float* lseg = p.lse ? p.lse + q0 * p.lse_stride_token + static_cast<int64_t>(g) * G * p.lse_stride_head : nullptr;
  // This thread's o fragments of rows below `rows`: pair(r, j, n, col) for each pair of adjacent columns (o[n][2j],
  // o[n][2j + 1]), then lse_once(r, j) on the one thread that writes row r's lse.
  const auto for_each_fragment = [&](int rows, auto&& pair, auto&& lse_once) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = row0 + 8 * j;
      if (r >= rows) continue;
#pragma unroll
      for (int n = 0; n < 4; ++n) pair(r, j, n, warp * 32 + n * 8 + 2 * (lane & 3));
      if (warp == 0 && (lane & 3) == 0) lse_once(r, j);
    }
  };
  if (!kF8 && S == 1) {
    for_each_fragment(
        G,
        [&](int r, int j, int n, int col) {
          *reinterpret_cast<uint32_t*>(og + r * p.o_stride_head + col) =
              arch::pack2<T>(o[n][2 * j] * inv[j], o[n][2 * j + 1] * inv[j]);
        },
        [&](int r, int j) {
          if (lseg) lseg[r * p.lse_stride_head] = lse[j];
        });
    MSA_TRACE_MARK(15, 0);
    MSA_TRACE_END(S);
    return;
  }
  if constexpr (!kPushMerge) {
    // Splits without clusters: this split's rows to the workspace (token_merge_kernel.cu).
    if (!kF8 && !kp.cluster_merge) {
      const int64_t at = ((static_cast<int64_t>(blockIdx.x) * gridDim.y + g) * S + split) * kTokenRows;
      for_each_fragment(
          G,
          [&](int r, int j, int n, int col) {
            // A row that saw no key writes zeros (o * 0 would pass on a NaN the merge must not see).
            *reinterpret_cast<float2*>(kp.part_o + (at + r) * D + col) =
                l_run[j] > 0.f ? make_float2(o[n][2 * j] * inv[j], o[n][2 * j + 1] * inv[j]) : make_float2(0.f, 0.f);
          },
          [&](int r, int j) { kp.part_lse[at + r] = lse[j]; });
      MSA_TRACE_END(S);
      return;
    }
  }
  // The merged rows' writer (a chunk of 8 values of row r, and its lse with chunk 0).
  const auto real_row = [&](int r) { return r < G; };
  const auto emit = [&](int r, int c, const float (&acc)[8], float row_lse) {
    uint4 pk;
    pk.x = arch::pack2<T>(acc[0], acc[1]);
    pk.y = arch::pack2<T>(acc[2], acc[3]);
    pk.z = arch::pack2<T>(acc[4], acc[5]);
    pk.w = arch::pack2<T>(acc[6], acc[7]);
    *reinterpret_cast<uint4*>(og + r * p.o_stride_head + c * 8) = pk;
    if (lseg && c == 0) lseg[r * p.lse_stride_head] = row_lse;
  };
  if constexpr (kPushMerge) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint64_t* merge_bar = reinterpret_cast<uint64_t*>(smem + kTokenSmemMergeBar);
    const int rows_per_split = div_s(kTokenRows + S - 1);
    float* recv_lse = reinterpret_cast<float*>(smem + kTokenSmemRecvLse);  // [S][rows_per_split]
    float* recv_o = reinterpret_cast<float*>(smem + kTokenSmemRecvO);      // [S][rows_per_split][D]
    float* merge_w = reinterpret_cast<float*>(smem + kTokenSmemMergeW);    // [owned][17]
    if constexpr (kF8) {  // row tid / 8 as four 16-byte runs from the merge buffer
      if ((tid >> 3) < G) {
        float v[16];
        const float row_lse = token_fp8_row_run<true>(reinterpret_cast<const float*>(smem + kTokenSmemStages),
                                                      red_max, red_sum, p.v_scale * arch::e4m3_f16_unscale(), v);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          arch::st_async(send_o[0] + 4 * k, reinterpret_cast<const float(&)[4]>(v[4 * k]), send_bar[0]);
        if ((tid & 7) == 0) arch::st_async(send_lse[0], row_lse, send_bar[0]);
      }
    } else {
      for_each_fragment(
          G,
          [&](int, int j, int n, int) {
            // A row that saw no key sends zeros (o * 0 would pass on a NaN the merge must not see).
            const float v[2] = {l_run[j] > 0.f ? o[n][2 * j] * inv[j] : 0.f,
                                l_run[j] > 0.f ? o[n][2 * j + 1] * inv[j] : 0.f};
            arch::st_async(send_o[j] + n * 8, v, send_bar[j]);
          },
          [&](int, int j) { arch::st_async(send_lse[j], lse[j], send_bar[j]); });
    }
    MSA_TRACE_MARK(13, 0);  // rows sent
    arch::mbarrier_wait_cluster(merge_bar, 0u);
    MSA_TRACE_MARK(14, 0);  // this CTA's rows arrived
    // W: the owned values (owned x 128) spread over the 128 threads.
    const auto emit_w = [&](int r, int col, const auto& acc, float row_lse) {
      constexpr int W = sizeof(acc) / sizeof(float);
      T* dst = og + r * p.o_stride_head + col;
      if constexpr (W == 1) {
        *dst = static_cast<T>(acc[0]);
      } else if constexpr (W == 2) {
        *reinterpret_cast<uint32_t*>(dst) = arch::pack2<T>(acc[0], acc[1]);
      } else if constexpr (W == 4) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(arch::pack2<T>(acc[0], acc[1]), arch::pack2<T>(acc[2], acc[3]));
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(arch::pack2<T>(acc[0], acc[1]), arch::pack2<T>(acc[2], acc[3]),
                                                    arch::pack2<T>(acc[4], acc[5]), arch::pack2<T>(acc[6], acc[7]));
      }
      if (lseg && col == 0) lseg[r * p.lse_stride_head] = row_lse;
    };
    const int owned = owned_rows();
#ifdef MSA_TOKEN_TRACE
    // The same code twice (one copy, not unrolled): mark 15 after the first pass, 16 after the second,
    // whose instructions are in the instruction cache - how much of the merge is code fetch. (A second
    // inlined copy traces as cold as the first, hence one copy run twice.)
#pragma unroll 1
    for (int rep = 0; rep < 2; ++rep) {
#endif
    if (owned <= 1)
      push_merge_receive<D, 1>(recv_o, recv_lse, merge_w, S, split, rows_per_split, owned, real_row, emit_w);
    else if (owned == 2)
      push_merge_receive<D, 2>(recv_o, recv_lse, merge_w, S, split, rows_per_split, owned, real_row, emit_w);
    else if (owned <= 4)
      push_merge_receive<D, 4>(recv_o, recv_lse, merge_w, S, split, rows_per_split, owned, real_row, emit_w);
    else
      push_merge_receive<D, 8>(recv_o, recv_lse, merge_w, S, split, rows_per_split, owned, real_row, emit_w);
#ifdef MSA_TOKEN_TRACE
      MSA_TRACE_MARK(15 + rep, 0);
    }
#endif
    MSA_TRACE_END(S);
#endif
    return;
  }
  // The split's normalized rows (fp32 [16][128], then 16 lse) go to stage memory, which every warp is
  // done reading after this barrier (and no copy is pending: the groups past the last tile are empty).
  arch::cp_async_wait<0>();
  __syncthreads();
  float* po = reinterpret_cast<float*>(smem + kTokenSmemStages);
  float* plse = po + kTokenRows * D;
  for_each_fragment(
      kTokenRows,
      [&](int r, int j, int n, int col) {
        *reinterpret_cast<float2*>(po + r * D + col) = make_float2(o[n][2 * j] * inv[j], o[n][2 * j + 1] * inv[j]);
      },
      [&](int r, int j) { plse[r] = lse[j]; });
  MSA_TRACE_MARK(13, 0);  // rows staged
  merge_splits_in_cluster<D, kTokenRows, kTokenThreads>(arch::smem_addr(po), arch::smem_addr(plse), S, split, real_row,
                                                        emit);
  MSA_TRACE_MARK(15, 0);
  MSA_TRACE_END(S);
}

}  // namespace msa::detail::cuda::decode
