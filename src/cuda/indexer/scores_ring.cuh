// Decode block scores on sm_90a: every request's index keys streamed once through a TMA ring.
//
// Persistent CTA per SM = W consumer warps (4 for 16-bit keys, 8 for fp8: config.h) + one producer warp.
// Work items are (request, chunk of C blocks, index-K head), dealt round-robin over the CTAs; each item owns C
// consecutive stages of the CTA's stage sequence (blocks past max_blocks included), so both sides know
// every stage's block without exchanging anything.
//
// Producer: lane l resolves (request lengths, page id) of stage s0 + l / parts, box l % parts, for a
// whole warp round of stages at once (parts = 128 / min(page, 128) boxes per block), then per stage waits
// for the slot, announces the bytes and lets each box's lane issue it: the 128 key rows as 128-byte-
// swizzled rows (bf16: two 64-dim halves; fp8: one 128-byte row) plus, for fp8, one bulk copy of the
// box's per-token scales. Blocks no token of the request sees are not loaded; a page id outside the pool
// is written as zero keys (score 0, as the contract says) by the warp itself.
//
// Consumers: warp w takes items w, w + W, ... of the CTA, so a warp may reach a stage two uses of its
// slot ahead of the ring, where an mbarrier parity wait cannot tell the phases apart: it first waits for
// the producer's count of claimed stages (a stage is claimed once the consumer of its slot's previous
// use released it, so the slot's barrier is then in the right phase). Keys are the M dimension of
// mma.sync m16n8k16 (S^T = K Q^T) and up to 8 (token, head) columns its N, as in scores_stream.cuh, but
// the A fragments come from shared memory: thread (g, t) reads 16-byte chunks 2t + (s & 1) + 8 (s >> 1)
// (bf16) or 2t + j (fp8) of rows g and g + 8, so each 8-thread phase of an LDS.128 covers the 8 distinct
// 16-byte units of the swizzled rows (no bank conflicts), and the query row is read with the same chunk
// permutation (the reduction over D may be permuted freely).
#pragma once

#include <type_traits>

#include "cuda/arch/memory.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/arch/sm90.cuh"
#include "cuda/indexer/device.cuh"

namespace msa::detail::cuda::indexer {

struct RingArgs {
  BlockScoresParams p;
  CUtensorMap keys;  // [pages, Hk, page, 64 x 16-bit] boxes of 64 x min(page, 128): 128-byte rows
  int64_t items;     // batch x chunks x Hk
  int chunks;        // items per request and head: ceil(max_blocks / RingLayout::kItemBlocks)
  int page_shift;
};

template <bool kF8>
struct RingLayout {
  static constexpr int kHalfBytes = kBlock * 128;                  // 128 rows of 128 bytes
  static constexpr int kKeyBytes = kBlock * kHeadDim * (kF8 ? 1 : 2);
  static constexpr int kScaleBytes = kF8 ? kBlock * 4 : 0;
  static constexpr int kStageBytes = (kKeyBytes + kScaleBytes + 1023) / 1024 * 1024;
  static constexpr int kStages = kRingBytes / kStageBytes;  // 7 (bf16 / fp16), 13 (fp8)
  static constexpr int kItemBlocks = kF8 ? kRingItemBlocksF8 : kRingItemBlocks16;
  static constexpr int kConsumerWarps = kF8 ? kRingConsumerWarpsF8 : kRingConsumerWarps16;
  static constexpr int kThreads = 32 * (kConsumerWarps + 1);
  static constexpr int kSmemBytes = 1024 /* alignment slack */ + kStages * kStageBytes + (2 * kStages + 1) * 8;
  static_assert(kStages >= 4, "the ring needs a few stages of slack");
  static_assert(kSmemBytes <= 227 * 1024, "beyond the sm_90 shared memory per CTA");
};

struct RingItem {
  int b, kh, chunk;
};

__device__ __forceinline__ RingItem ring_item(int64_t item, int batch, int k_heads) {
  const int64_t per_chunk = static_cast<int64_t>(batch) * k_heads;
  const int64_t r = item % per_chunk;
  return {static_cast<int>(r / k_heads), static_cast<int>(r % k_heads), static_cast<int>(item / per_chunk)};
}

// Keys [0, end) of request rq are visible to at least one of its tokens (0 when it has none).
__device__ __forceinline__ int64_t request_visible_end(const Request& rq, bool causal) {
  return rq.q_len > 0 ? visible_end(rq, rq.offset + rq.q_len - 1, causal) : 0;
}

template <typename QT, bool kF8>
__global__ void __launch_bounds__(RingLayout<kF8>::kThreads, 1)
    scores_ring_kernel(const __grid_constant__ RingArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = RingLayout<kF8>;
  constexpr int S = L::kStages;
  constexpr int C = L::kItemBlocks;
  const BlockScoresParams& p = a.p;
  // The next kernel of a decode step (select_topk, launched with PDL) may be scheduled now; it waits in
  // arch::grid_dependency_wait() until these scores are complete, but its launch latency is hidden.
  arch::allow_dependent_launch();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t ring = arch::smem_addr(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * L::kStageBytes);
  uint64_t* empty = full + S;
  int64_t* claimed = reinterpret_cast<int64_t*>(empty + S);  // stages the producer has waited for

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int B = p.seqs.batch_size, HK = p.k.num_heads;
  const int G = p.num_heads / HK;
  if (blockIdx.x >= a.items) return;
  const int64_t my_items = (a.items - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int64_t nstages = my_items * C;
  auto item_of = [&](int64_t j) { return ring_item(blockIdx.x + j * gridDim.x, B, HK); };

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      // Every lane of the producer and of the consuming warp arrives itself: compute-sanitizer's racecheck
      // orders a lane's shared-memory accesses by its own arrivals only (not through __syncwarp).
      arch::mbarrier_init(full + s, 32);   // the producer's lanes (lane 0 with the stage's transaction bytes)
      arch::mbarrier_init(empty + s, 32);  // the consuming warp's lanes
    }
    arch::fence_mbarrier_init();
    *claimed = 0;
  }
  __syncthreads();

  constexpr int W = L::kConsumerWarps;
  if (warp == W) {
    // ---------------- producer ----------------
    if (lane == 0) arch::tma_prefetch_descriptor(&a.keys);
    const int rows = min(p.k.page_size, kBlock), parts = kBlock / rows;
    const int per_round = 32 / parts;
    const PageDiv pd{p.k.page_size, a.page_shift};
    constexpr int kPartBytes = kF8 ? (128 + 4) : 256;  // per key row: key bytes (+ fp8 scale)
    // Lane l: stage s0 + l / parts, part l % parts. The loads of a round's lengths and page ids are issued a
    // round ahead (fetch) and resolved after the round before it has issued its stages (resolve), so their
    // round trips run under that round's copies instead of stopping the stream once per round.
    struct Lookup {
      RequestRaw rq;
      int raw_pg = -1, off = 0, kh = 0, blk = 0;
      bool in = false;  // a stage of this CTA whose block is below max_blocks
    };
    const auto fetch = [&](int64_t s0) {
      Lookup l;
      const int64_t s = s0 + lane / parts;
      if (lane < per_round * parts && s < nstages) {
        const RingItem it = item_of(s / C);
        l.blk = it.chunk * C + static_cast<int>(s % C);
        l.kh = it.kh;
        if (l.blk < p.max_blocks) {
          l.in = true;
          l.rq = load_request_raw(p.seqs, it.b);
          const int64_t key0 = static_cast<int64_t>(l.blk) * kBlock + (lane % parts) * rows;
          int64_t lp;
          pd.split(key0, &lp, &l.off);
          const PageRow pr = page_row(p.pages, it.b);  // read whether visible or not; checked in resolve
          l.raw_pg = page_entry(pr, lp);
        }
      }
      return l;
    };
    // pg = -2: nothing to load (no token of the request sees the keys); -1: zero keys.
    const auto resolve = [&](const Lookup& l) {
      const int64_t key0 = static_cast<int64_t>(l.blk) * kBlock + (lane % parts) * rows;
      if (!l.in || key0 >= request_visible_end(finish_request(p.seqs, l.rq), p.causal)) return -2;
      return page_in_pool(l.raw_pg, p.pages.num_pages);
    };
    Lookup next = fetch(0);
    for (int64_t s0 = 0; s0 < nstages; s0 += per_round) {
      const Lookup cur = next;
      const int pg = resolve(cur), off = cur.off, kh = cur.kh;
      next = fetch(s0 + per_round);
      for (int k = 0; k < per_round && s0 + k < nstages; ++k) {
        const int64_t sk = s0 + k;
        const int stage = static_cast<int>(sk % S);
        const uint32_t base = ring + stage * L::kStageBytes;
        const int src = k * parts + (lane < parts ? lane : 0);
        const int my_pg = __shfl_sync(kFullMask, pg, src);
        const int my_off = __shfl_sync(kFullMask, off, src);
        const int my_kh = __shfl_sync(kFullMask, kh, src);
        const bool mine = lane < parts;
        const unsigned load_mask = __ballot_sync(kFullMask, mine && my_pg >= 0);
        const unsigned zero_mask = __ballot_sync(kFullMask, mine && my_pg == -1);
        if (sk >= S) arch::mbarrier_wait(empty + stage, ((sk / S) - 1) & 1);
        if (lane == 0) arch::publish_shared_count(claimed, sk + 1);
        if (zero_mask) {  // pages outside the pool: zero keys (and scales), written by the warp
          for (unsigned m = zero_mask; m; m &= m - 1) {
            const int zp = __ffs(m) - 1;
            for (int x = 16 * lane; x < rows * 128; x += 512) {
              arch::st_shared_zero16(base + zp * rows * 128 + x);
              if constexpr (!kF8) arch::st_shared_zero16(base + L::kHalfBytes + zp * rows * 128 + x);
            }
            if constexpr (kF8)
              for (int x = 16 * lane; x < rows * 4; x += 512)
                arch::st_shared_zero16(base + L::kKeyBytes + zp * rows * 4 + x);
          }
          arch::fence_proxy_async();  // these generic writes come before later TMA writes into the stage
        }
        const uint32_t bytes = __popc(load_mask) * rows * kPartBytes;
        if (lane == 0 && bytes)
          arch::mbarrier_arrive_expect_tx(full + stage, bytes);
        else
          arch::mbarrier_arrive(full + stage);
        __syncwarp();  // the transaction bytes are announced before any copy can complete them
        if (mine && my_pg >= 0) {
          const uint32_t dst = base + lane * rows * 128;
          if constexpr (kF8) {
            arch::tma_load_4d(dst, &a.keys, 0, my_off, my_kh, my_pg, full + stage);
            const float* sc = p.k_scale + my_pg * p.ks_stride_page + my_kh * p.ks_stride_head + my_off;
            arch::bulk_load(base + L::kKeyBytes + lane * rows * 4, sc, rows * 4, full + stage);
          } else {
            arch::tma_load_4d(dst, &a.keys, 0, my_off, my_kh, my_pg, full + stage);
            arch::tma_load_4d(dst + L::kHalfBytes, &a.keys, 64, my_off, my_kh, my_pg, full + stage);
          }
        }
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  const int g = lane >> 2, t = lane & 3;
  const int mt = kRingMaxGroup / G;  // tokens per pass (columns n = token * G + head)
  int64_t claimed_seen = 0;  // the producer's claimed-stage count as this warp last read it
  for (int64_t j = warp; j < my_items; j += W) {
    const RingItem it = item_of(j);
    const Request rq = load_request(p.seqs, it.b);
    const int64_t npass = (rq.q_len + mt - 1) / mt;

    // Query fragments of one pass: column g's row at the chunks this thread feeds (see the header); fp8:
    // rescaled by a power of two into fp16 range, the inverse kept per accumulator column.
    uint4 qf[4];
    float inv[2];
    int64_t hi[2];
    float* outp[2];
    int64_t nb_pass = 0;
    auto load_pass = [&](int64_t pass) {
      auto col_token = [&](int n) { return pass * mt + n / G; };
      auto col_valid = [&](int n) { return n < mt * G && col_token(n) < rq.q_len; };
      const bool valid = col_valid(g);
      const QT* qrow = static_cast<const QT*>(p.q) + (rq.q_begin + (valid ? col_token(g) : 0)) * p.q_stride_token +
                       (it.kh * G + g % G) * p.q_stride_head;
      float inv_g = 1.f;
      if constexpr (kF8) {
        // Thread t feeds D elements [16q, 16q + 16) for q = 2t, 2t + 1: 32 contiguous elements.
#pragma unroll
        for (int u = 0; u < 4; ++u)
          qf[u] = valid ? arch::ld_global_nc_v4(qrow + 32 * t + 8 * u) : make_uint4(0, 0, 0, 0);
        float amax = fmaxf(fmaxf(chunk_amax<QT>(qf[0]), chunk_amax<QT>(qf[1])),
                           fmaxf(chunk_amax<QT>(qf[2]), chunk_amax<QT>(qf[3])));
        amax = warp_max_xor(amax, 1, 2);  // the quad holds the whole row
        const int e = fp16_row_exponent(amax);
#pragma unroll
        for (int u = 0; u < 4; ++u) qf[u] = chunk_to_scaled_f16<QT>(qf[u], exp2_int(e));
        inv_g = exp2_int(-e) * arch::e4m3_f16_unscale();
      } else {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const int q = 2 * t + (s & 1) + 8 * (s >> 1);
          qf[s] = valid ? arch::ld_global_nc_v4(qrow + 8 * q) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int n = 2 * t + c;
        const bool v = col_valid(n);
        hi[c] = v ? visible_end(rq, rq.offset + col_token(n), p.causal) : 0;
        outp[c] = v ? p.out + (rq.q_begin + col_token(n)) * p.out_stride_token +
                          (it.kh * G + n % G) * p.out_stride_head
                    : nullptr;
        inv[c] = __shfl_sync(kFullMask, inv_g, 4 * n);
      }
      const int64_t last_tok = min64((pass + 1) * mt, rq.q_len) - 1;
      const int64_t hi_pass = visible_end(rq, rq.offset + last_tok, p.causal);  // positions grow with tokens
      nb_pass = min64((hi_pass + kBlock - 1) / kBlock, p.max_blocks);
    };
    if (npass == 1) load_pass(0);  // more passes reload per block (L1 hits after the item's first block)

    for (int i = 0; i < C; ++i) {
      const int blk = it.chunk * C + i;
      const int64_t s = j * C + i;
      const int stage = static_cast<int>(s % S);
      const uint32_t base = ring + stage * L::kStageBytes;
      if (s >= claimed_seen) {  // claims run ahead of the consumers: one poll (lane 0's) covers several stages
        int64_t c;
        while ((c = __shfl_sync(kFullMask, lane == 0 ? arch::poll_shared_count(claimed) : 0, 0)) <= s)
          __nanosleep(32);
        claimed_seen = c;
      }
      arch::mbarrier_wait(full + stage, (s / S) & 1);
      for (int64_t pass = 0; pass < npass && blk < p.max_blocks; ++pass) {
        if (npass > 1) load_pass(pass);
        float m0 = -INFINITY, m1 = -INFINITY;
        if (blk < nb_pass) {
          // acc = the 16x8 scores of tile tt: rows 16 tt + g (acc 0, 1) and + 8 (acc 2, 3), columns 2t, 2t+1.
          auto tile = [&](int tt, float (&acc)[4]) {
            const int r0 = 16 * tt + g, r1 = r0 + 8;  // r & 7 == g for both
            acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
            if constexpr (kF8) {
#pragma unroll
              for (int jj = 0; jj < 2; ++jj) {
                const int q = 2 * t + jj;
                const uint4 ka = arch::ld_shared_v4(base + r0 * 128 + ((q ^ g) << 4));
                const uint4 kb = arch::ld_shared_v4(base + r1 * 128 + ((q ^ g) << 4));
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                  const uint2 xa = arch::e4m3x4_to_f16x4_raw(word(ka, u));
                  const uint2 xb = arch::e4m3x4_to_f16x4_raw(word(kb, u));
                  const uint4& qv = qf[2 * jj + (u >> 1)];
                  arch::mma_m16n8k16<__half>(acc, xa.x, xb.x, xa.y, xb.y, word(qv, 2 * (u & 1)),
                                             word(qv, 2 * (u & 1) + 1));
                }
              }
              const float sa = arch::ld_shared_f32(base + L::kKeyBytes + r0 * 4);
              const float sb = arch::ld_shared_f32(base + L::kKeyBytes + r1 * 4);
              acc[0] *= sa, acc[1] *= sa, acc[2] *= sb, acc[3] *= sb;
            } else {
#pragma unroll
              for (int s4 = 0; s4 < 4; ++s4) {
                const int q = 2 * t + (s4 & 1) + 8 * (s4 >> 1);
                const uint32_t off = (q >> 3) * L::kHalfBytes + (((q & 7) ^ g) << 4);
                const uint4 ka = arch::ld_shared_v4(base + r0 * 128 + off);
                const uint4 kb = arch::ld_shared_v4(base + r1 * 128 + off);
#pragma unroll
                for (int e = 0; e < 2; ++e)
                  arch::mma_m16n8k16<QT>(acc, word(ka, 2 * e), word(kb, 2 * e), word(ka, 2 * e + 1),
                                                        word(kb, 2 * e + 1), word(qf[s4], 2 * e),
                                                        word(qf[s4], 2 * e + 1));
              }
            }
          };
          // Keys of the block visible to each of this thread's columns: 0..128 (32-bit compares).
          const int64_t key_blk = static_cast<int64_t>(blk) * kBlock;
          const int lim0 = static_cast<int>(clamp_to<int64_t>(hi[0] - key_blk, 0, kBlock));
          const int lim1 = static_cast<int>(clamp_to<int64_t>(hi[1] - key_blk, 0, kBlock));
          if (__all_sync(kFullMask, lim0 == kBlock && lim1 == kBlock)) {  // no column stops inside the block
#pragma unroll 2
            for (int tt = 0; tt < kBlock / 16; ++tt) {
              float acc[4];
              tile(tt, acc);
              m0 = fmaxf(m0, fmaxf(acc[0], acc[2]));
              m1 = fmaxf(m1, fmaxf(acc[1], acc[3]));
            }
          } else {
#pragma unroll 2
            for (int tt = 0; tt < kBlock / 16; ++tt) {
              float acc[4];
              tile(tt, acc);
              const int r0 = 16 * tt + g;
              m0 = fmaxf(m0, fmaxf(r0 < lim0 ? acc[0] : -INFINITY, r0 + 8 < lim0 ? acc[2] : -INFINITY));
              m1 = fmaxf(m1, fmaxf(r0 < lim1 ? acc[1] : -INFINITY, r0 + 8 < lim1 ? acc[3] : -INFINITY));
            }
          }
          m0 = warp_max_xor(m0, 4, 16);
          m1 = warp_max_xor(m1, 4, 16);
        }
        if (g == 0) {
          if (outp[0]) outp[0][blk * p.out_stride_block] = m0 * inv[0];
          if (outp[1]) outp[1][blk * p.out_stride_block] = m1 * inv[1];
        }
      }
      arch::mbarrier_arrive(empty + stage);
    }
  }
#else
  __trap();  // built without sm_90a: ring_scores_available() keeps the dispatcher away
#endif
}

}  // namespace msa::detail::cuda::indexer
