// Query-major sparse / dense paged prefill for sm_90a: TMA + wgmma, warp-specialized.
//
// One CTA per SM walks work tiles (request, KV head, 128/G tokens) fetched from an atomic counter.
// Warpgroup 0 is the producer: warp 1 (the scheduler) claims the next tile, loads its Q (two
// 128B-swizzled boxes of 64 dims) and resolves its first blocks' pages while warp 0 loads, for every
// KV block of the current tile, its K and V (one box per 64 dims of a 128-key page slice) into
// mbarrier rings (kQStages Q tiles, kStages K blocks, kVStages V blocks). Warpgroups 1 and 2 are
// consumers of 64 rows each:
//   S = Q K^T (8 x wgmma m64n128k16, smem x smem), mask, online softmax in registers,
//   O += P V   (8 x wgmma m64n128k16, P from registers, V MN-major),
// with the QK^T of block i issued before the PV of block i-1 so that the softmax of one block runs
// while the tensor cores work on the other (FlashAttention-3's intra-warpgroup overlap), and across
// tiles: the next tile's first QK^T goes out with this tile's last PV (its Q is in the other buffer),
// its first softmax runs while that PV does, and this tile's o is written after.
//
// The block list of a tile: dense = 0 .. last block of the causal frontier; sparse = the sorted
// union of the tile tokens' valid selections with a token bitmask per block (schedule.cu).
// Masking is one key limit per row and block: keys [block*128, block*128 + limit) are visible.
//
// fp8 e4m3 K/V (kF8): warp 0 loads each e4m3 tile into the second half of its 16-bit stage, completing on
// k_land / v_land, a block's K ahead of the previous block's V inside a tile (so that the V ring's wait does
// not hold back the K loads); warps 2-3 of the producer warpgroup (the converters) widen the tiles in place
// to fp16 in that order and arrive on k_full / v_full (fp8_tiles.cuh). Both products run on fp16 wgmma
// whatever q's type: with bf16 q each consumer warp rescales its 16 rows of a Q tile into fp16 in place once
// the tile's Q has landed (a power of two per row, undone on the row's logits), P is packed to fp16, and o
// and lse are written as for a 16-bit cache.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/arch/fast_math.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/arch/sm90.cuh"
#include "cuda/arch/sm90_wgmma.cuh"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/consumer_math.cuh"
#include "cuda/prefill_sm90/fp8_tiles.cuh"
#include "cuda/prefill_sm90/params.h"
#include "cuda/prefill_sm90/qmajor_trace.cuh"
#include "cuda/prefill_sm90/tile_common.cuh"

namespace msa::detail::cuda::prefill_sm90 {

// What the producer tells the consumers about a stage: the block, which tile tokens selected it,
// and whether its page exists (for an invalid page the producer loads page 0; the consumers mask
// every key and zero its V).
struct StageInfo {
  int32_t block;
  uint32_t tokens;
  int32_t valid;
  int32_t mark;  // fp8, for the converter warps: kTileLastBlock, kStreamEnd (the record after the last block)
};
inline constexpr int32_t kTileLastBlock = 1, kStreamEnd = 2;

struct TileInfo {
  int32_t tile;  // -1: no more work
  int32_t nblocks;
  int32_t request, chunk, kv_head;
  int32_t qo_start, qo_len, kv_len, offset;
};

// One entry of the scheduler's hand-over: a block of the next tile's list, its page and its tokens.
struct AheadEntry {
  int32_t block;
  int32_t page;
  uint32_t tokens;
};

struct alignas(1024) QMajorSmem {
  uint8_t q[kQStages][kTileBytes];
  uint8_t k[kStages][kTileBytes];
  uint8_t v[kVStages][kTileBytes];
  uint64_t q_full[kQStages], q_empty[kQStages];
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kVStages], v_empty[kVStages];
  StageInfo stage[kStages];  // beside K stage i: the block it holds
  TileInfo tile[kQStages];   // beside Q buffer i: the tile it holds
  uint64_t ahead_full, ahead_go;  // scheduler -> warp 0: a tile handed over; warp 0 -> scheduler: claim the next
                                  // (32 arrivals each: every lane after its own accesses)
  AheadEntry ahead[32];           // the handed-over tile's first 32 blocks
  // fp8 K/V only: the e4m3 loads complete on k_land / v_land (one arrival + bytes), the converter warps'
  // widening on k_full / v_full (kF8ConvertThreads arrivals). Last, in the struct's padding: the 16-bit
  // kernels' layout and size are unchanged.
  uint64_t k_land[kStages], v_land[kVStages];
};
// + 1 KiB to align the dynamic shared memory base to 1024 B (128B-swizzle atoms).
inline constexpr int kQMajorSmemBytes = static_cast<int>(sizeof(QMajorSmem)) + 1024;
static_assert(kQMajorSmemBytes <= 227 * 1024, "Hopper allows 227 KiB of shared memory per CTA");

#ifdef MSA_SM90A_DEVICE

// ---------------------------------------------------------------------------------------------
// Tile claims (warp 1 of the producer warpgroup, "the scheduler"): the next tile's claim, record, Q
// and the first 32 entries of its block list with their pages, while warp 0 still issues the current
// tile's K/V. Done by warp 0 after a tile's last block, a claim is ~5 dependent trips (the claim, the
// KV-major flag, lengths and count, list entries, pages; ~3-4 us) against the ~3 block-steps
// (~5.6 us) the consumers still hold, a bubble whenever the trips run long; a 16-block `shared`
// tile would pay it every 16 block-steps. The scheduler starts the next claim when warp 0 issues the
// current tile's block nblocks - kTileLookaheadBlocks (not earlier: a tile claimed early waits on a
// busy CTA while another goes idle at the end of the grid).
template <bool kSparse>
__device__ __forceinline__ void qmajor_scheduler(const QMajorParams& p, QMajorSmem& s) {
  const int lane = threadIdx.x & 31;
  const int32_t group = 1 << p.group_shift;
  const int32_t tile_tokens = p.sched.tile_tokens;
  // The claim's reads go out in as few dependent trips as their dependences allow: (the claim, the live
  // tile count, the listed count), (everything indexed by the tile: its KV-major flag, block count, first
  // 32 list entries read before the count is known, and tile_cum), (the request's lengths), (its pages),
  // with the tile's Q issued once its tokens are known, before the pages. One read after another they
  // take ~4.5 us from the PDL wait to the first Q at M3-TP4 P-chunk `shared` (qmajor_trace.cuh), ~9
  // dependent trips for every CTA's first tile; grouped so, the row runs 130.27 us against 131.3-131.5.
  // Two trips fewer (a CTA's first claim its own index, request 0's lengths read before the PDL wait)
  // measured slower, 131.1 -> 132.0 us (the first Q and K loads, ~3 us each on a cold L2, are what the
  // first tile waits for).
  const int32_t live = live_tiles(p.sched, p.seqs.batch_size);
  // Sparse with a KV-major path: when fewer than half the tiles are query-major, claims index the
  // compacted list of them (one trip more than a tile index, against a flag read per claimed KV-major
  // tile: M3-TP1 P-chunk `random`, no query-major tile, 1040 -> 1032 us). Otherwise tile order: the list
  // is in the order the tile-list warps finished, and tiles claimed out of order share fewer blocks
  // with the tiles running beside them (M3-TP1 P-chunk `shared`, 472 -> 490 us, `clustered` 764 -> 777
  // when claimed from the list).
  const int32_t listed_count = kSparse && p.lists.qm_tiles != nullptr ? *p.lists.qm_count : live;
  for (uint32_t q_it = 0;; ++q_it) {
    if (q_it > 0) arch::mbarrier_wait(&s.ahead_go, (q_it - 1) & 1);  // warp 0 read the previous hand-over
    TileInfo ti{};
    ti.tile = -1;
    AheadEntry e{0, -1, 0u};
    for (;;) {  // until a query-major tile or the end: sparse tiles flagged KV-major belong to the other kernel
      int32_t claim = 0;
      if (lane == 0) claim = atomicAdd(p.tile_counter, 1);
      claim = __shfl_sync(~0u, claim, 0);
      const bool listed = 2 * listed_count < live;
      const int32_t tile = !listed ? claim : claim < listed_count ? p.lists.qm_tiles[claim] : live;
      if (tile >= live) break;
      int32_t flagged = 0, count = 0;
      int2 x{0, 0};
      if constexpr (kSparse) {
        if (!listed) flagged = p.lists.kv_major[tile];
        count = p.lists.count[tile];
        if (lane < p.lists.capacity) x = p.lists.entries[static_cast<int64_t>(tile) * p.lists.capacity + lane];
      }
      const TileCoord c = decode_tile(p.sched, p.seqs.batch_size, tile);
      const SeqView v = load_seq(p.seqs, c.request);
      if (flagged != 0) continue;
      ti = TileInfo{tile, 0, c.request, c.chunk, c.kv_head, v.qo_start, v.qo_len, v.kv_len, v.offset};
      if constexpr (kSparse) {
        ti.nblocks = min(max(count, 0), p.lists.capacity);
        if (lane < ti.nblocks) e = AheadEntry{x.x, -1, static_cast<uint32_t>(x.y)};
      } else {
        // Blocks past the request's page-table row have no page (invisible): the list ends there too, so that a
        // device kv_len far past the plan's (a caller error) cannot stretch a tile over millions of empty blocks.
        int64_t row_pages = p.pages.row_capacity;  // dense form: a row's entries; flat form: the request's slice
        if (p.pages.indptr) {
          const int64_t a = clamp64(p.pages.indptr[c.request], 0, p.pages.row_capacity);
          row_pages = clamp64(p.pages.indptr[c.request + 1], a, p.pages.row_capacity) - a;
        }
        const int32_t last = min((c.chunk + 1) * tile_tokens, v.qo_len) - 1;
        ti.nblocks = static_cast<int32_t>(min(static_cast<int64_t>(num_kv_blocks(visible_key_end(v, last, p.causal))),
                                              row_pages * p.page_blocks));
        if (lane < ti.nblocks) e = AheadEntry{lane, -1, ~0u};
      }
      break;
    }
    if (lane == 0) {  // the record and the Q of buffer q_it % kQStages, before the page reads below
      const uint32_t qb = q_it % kQStages, qph = (q_it / kQStages) & 1;
      arch::mbarrier_wait(&s.q_empty[qb], qph ^ 1);
      s.tile[qb] = ti;
      if (ti.tile >= 0 && ti.nblocks > 0) {
        const int32_t tok0 = ti.qo_start + ti.chunk * tile_tokens;
        arch::mbarrier_arrive_expect_tx(&s.q_full[qb], kTileBytes);
        arch::tma_load_3d(s.q[qb], &p.q_map, 0, ti.kv_head * group, tok0, &s.q_full[qb]);
        arch::tma_load_3d(s.q[qb] + kHalfTileBytes, &p.q_map, kHalfDim, ti.kv_head * group, tok0, &s.q_full[qb]);
      } else {
        arch::mbarrier_arrive(&s.q_full[qb]);
      }
    }
    if (ti.tile >= 0 && lane < ti.nblocks) e.page = physical_page(p.pages, ti.request, e.block / p.page_blocks);
    s.ahead[lane] = e;
    arch::mbarrier_arrive(&s.ahead_full);  // each lane after its own writes (32 arrivals)
    if (ti.tile < 0) break;
  }
}

// Before the PDL wait (the scheduler warp): the L2 prefetch of the input lines that the first claims read after
// it, the requests' lengths and the first page-table lines (dense: request 0's row; flat: the table's start), up
// to 32 lines. Inputs only: the caller's work that wrote them finished before this run's first kernel (launched
// without PDL) began, so they may be read before the wait.
__device__ __forceinline__ void qmajor_prewait_prefetch(const QMajorParams& p, int lane) {
  const SeqParams& q = p.seqs;
  if (lane * 32 <= q.batch_size && lane < 4) {
    arch::prefetch_l2(q.qo_indptr + lane * 32);
    if (lane * 32 < q.batch_size) {
      arch::prefetch_l2(q.kv_lens + lane * 32);
      if (q.qo_offset) arch::prefetch_l2(q.qo_offset + lane * 32);
    }
    if (p.pages.indptr) arch::prefetch_l2(p.pages.indptr + lane * 32);
  }
  const int64_t entries = p.pages.indptr ? p.pages.row_capacity : min(p.pages.row_capacity, p.pages.row_stride);
  if (static_cast<int64_t>(lane) * 32 < entries) arch::prefetch_l2(p.pages.table + lane * 32);
}

// fp8: the e4m3 V tile of block `it` (a 16 KiB box at key0 of page pc) into the second half of its V stage.
__device__ __forceinline__ void qmajor_load_v_e4m3(const QMajorParams& p, QMajorSmem& s, uint32_t it, int32_t key0,
                                                   int32_t kv_head, int32_t pc) {
  const uint32_t vs = it % kVStages, vph = (it / kVStages) & 1;
  arch::mbarrier_wait(&s.v_empty[vs], vph ^ 1);
  arch::mbarrier_arrive_expect_tx(&s.v_land[vs], kF8TileBytes);
  arch::tma_load_4d(s.v[vs] + kHalfTileBytes, &p.v_map, 0, key0, kv_head, pc, &s.v_land[vs]);
}

// K/V loads (warp 0 of the producer warpgroup). Lane 0 issues everything; the warp resolves 32 blocks'
// pages at a time (the first 32 of a tile come resolved from the scheduler).
template <bool kSparse, bool kF8>
__device__ __forceinline__ void qmajor_producer(const QMajorParams& p, QMajorSmem& s) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) tma_prefetch_qkv_maps(p);
  uint32_t it = 0;  // blocks issued so far
  // fp8: the V load of block it - 1 goes out after the K load of block it (then the V ring's wait, on the PV
  // product of block it - 3, comes after the K load the consumers need one block-step later), and a tile's
  // last V after its last K. (Held until the next tile's first K, that V would wait for the next hand-over;
  // when a tile without blocks comes first, the hand-over after it waits for the consumers to release that
  // tile's Q buffer, which they reach only after the V: a deadlock.)
  uint32_t v_next = 0;  // fp8: blocks whose V load went out
  int32_t v_key0 = 0, v_head = 0, v_pc = 0;
  auto flush_v = [&] {
    if constexpr (kF8) {
      if (v_next < it) {
        if (lane == 0) qmajor_load_v_e4m3(p, s, v_next, v_key0, v_head, v_pc);
        ++v_next;
      }
    }
  };
  for (uint32_t q_it = 0;; ++q_it) {
    arch::mbarrier_wait(&s.ahead_full, q_it & 1);
    const TileInfo& rec = s.tile[q_it % kQStages];
    const int32_t tile = rec.tile, nblocks = rec.nblocks, request = rec.request, kv_head = rec.kv_head;
    const AheadEntry first = s.ahead[lane];
    if (tile < 0) {
      if constexpr (kF8) {
        if (lane == 0) {  // the end record for the converters (past the ring's last K)
          const uint32_t st = it % kStages, ph = (it / kStages) & 1;
          arch::mbarrier_wait(&s.k_empty[st], ph ^ 1);
          s.stage[st] = StageInfo{-1, 0u, 0, kStreamEnd};
          arch::mbarrier_arrive(&s.k_land[st]);
        }
      }
      break;
    }
    // Each lane's arrival on ahead_go lets the scheduler overwrite the hand-over (read above).
    const int32_t trigger = max(nblocks - kTileLookaheadBlocks, 0);
    if (nblocks == 0) arch::mbarrier_arrive(&s.ahead_go);
    for (int32_t i0 = 0; i0 < nblocks; i0 += 32) {
      int32_t block = first.block, page = first.page;
      uint32_t tokens = first.tokens;
      if (i0 > 0) {
        block = 0, page = -1, tokens = 0;
        if (i0 + lane < nblocks) {
          if constexpr (kSparse) {
            const int2 e = p.lists.entries[static_cast<int64_t>(tile) * p.lists.capacity + i0 + lane];
            block = e.x;
            tokens = static_cast<uint32_t>(e.y);
          } else {
            block = i0 + lane;
            tokens = ~0u;
          }
          page = physical_page(p.pages, request, block / p.page_blocks);
        }
      }
      const int32_t n = min(32, nblocks - i0);
      for (int32_t j = 0; j < n; ++j, ++it) {
        const int32_t blk = __shfl_sync(~0u, block, j);
        const int32_t pg = __shfl_sync(~0u, page, j);
        const uint32_t tok = __shfl_sync(~0u, tokens, j);
        const int32_t key0 = (blk % p.page_blocks) * kBlockKeys;
        const int32_t pc = pg >= 0 ? pg : 0;  // no page: load page 0, the consumers mask it all
        if (lane == 0) {
          const uint32_t st = it % kStages, ph = (it / kStages) & 1;
          arch::mbarrier_wait(&s.k_empty[st], ph ^ 1);
          if constexpr (kF8) {
            s.stage[st] = StageInfo{blk, tok, pg >= 0, i0 + j == nblocks - 1 ? kTileLastBlock : 0};
            arch::mbarrier_arrive_expect_tx(&s.k_land[st], kF8TileBytes);
            arch::tma_load_4d(s.k[st] + kHalfTileBytes, &p.k_map, 0, key0, kv_head, pc, &s.k_land[st]);
          } else {
            s.stage[st] = StageInfo{blk, tok, pg >= 0, 0};
            arch::mbarrier_arrive_expect_tx(&s.k_full[st], kTileBytes);
            arch::tma_load_4d(s.k[st], &p.k_map, 0, key0, kv_head, pc, &s.k_full[st]);
            arch::tma_load_4d(s.k[st] + kHalfTileBytes, &p.k_map, kHalfDim, key0, kv_head, pc, &s.k_full[st]);
          }
        }
        // Every lane arrives (32 arrivals) after its own read of the hand-over, as the consumers release
        // their buffers: compute-sanitizer's racecheck sees the order (one lane's arrival after a
        // __syncwarp was reported as a race, though the shuffles above had consumed every lane's read).
        if (i0 + j == trigger) arch::mbarrier_arrive(&s.ahead_go);
        if constexpr (kF8) {
          flush_v();
          v_key0 = key0, v_head = kv_head, v_pc = pc;
        } else if (lane == 0) {
          const uint32_t vs = it % kVStages, vph = (it / kVStages) & 1;
          // V block j's stage frees when PV(j - 2) completes, which the consumers reach before they wait
          // for K(j): this wait never holds back a K the consumers need.
          arch::mbarrier_wait(&s.v_empty[vs], vph ^ 1);
          arch::mbarrier_arrive_expect_tx(&s.v_full[vs], kTileBytes);
          arch::tma_load_4d(s.v[vs], &p.v_map, 0, key0, kv_head, pc, &s.v_full[vs]);
          arch::tma_load_4d(s.v[vs] + kHalfTileBytes, &p.v_map, kHalfDim, key0, kv_head, pc, &s.v_full[vs]);
        }
      }
    }
    flush_v();  // fp8: the tile's last V
  }
}

// fp8 (warps 2-3 of the producer warpgroup, ct = 0 .. kF8ConvertThreads - 1): the tiles warp 0 loads, widened
// to fp16 in place in its order: K(j), then V(j - 1) if still due, and at a tile's last block V(j) too. Every
// converter thread arrives on k_full / v_full after its own stores.
__device__ __forceinline__ void qmajor_converter(QMajorSmem& s, int ct) {
  const uint32_t k_base = arch::smem_addr(s.k[0]), v_base = arch::smem_addr(s.v[0]);
  uint32_t v_next = 0;  // blocks whose V is widened
  for (uint32_t it = 0;; ++it) {
    const uint32_t st = it % kStages, ph = (it / kStages) & 1;
    arch::mbarrier_wait(&s.k_land[st], ph);
    const int32_t mark = s.stage[st].mark;
    if (mark == kStreamEnd) break;  // every V is done: the last block was a tile's last
    widen_e4m3_tile<__half>(k_base + st * kTileBytes, ct);
    arch::mbarrier_arrive(&s.k_full[st]);
    for (const uint32_t v_end = mark == kTileLastBlock ? it + 1 : it; v_next < v_end; ++v_next) {
      const uint32_t vs = v_next % kVStages, vph = (v_next / kVStages) & 1;
      arch::mbarrier_wait(&s.v_land[vs], vph);
      widen_e4m3_tile<__half>(v_base + vs * kTileBytes, ct);
      arch::mbarrier_arrive(&s.v_full[vs]);
    }
  }
}

// kBf16: q and o are bf16. kF8: K/V are fp8, widened to fp16 (qmajor_converter), so both products run on fp16
// wgmma (kMmaBf16 false), and bf16 Q tiles are rescaled into fp16 by their consumers (kScaleQ).
template <bool kBf16, bool kSparse, bool kF8>
__device__ __forceinline__ void qmajor_consumer(const QMajorParams& p, QMajorSmem& s, int wg MSA_QTRACE_PARAM) {
  using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  constexpr bool kMmaBf16 = kBf16 && !kF8;
  constexpr bool kScaleQ = kBf16 && kF8;
  const int tid = threadIdx.x & 127;
  const int lane = tid & 31;
  const int t = lane & 3;
  const int32_t group = 1 << p.group_shift;
  const int32_t tile_tokens = p.sched.tile_tokens;
  int32_t tok_in_tile[2], head_in_group[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = wg * kWarpgroupRows + (tid >> 5) * 16 + (lane >> 2) + 8 * h;
    tok_in_tile[h] = row >> p.group_shift;
    head_in_group[h] = row & (group - 1);
  }
  const uint32_t k_base = arch::smem_addr(s.k[0]);
  const uint32_t v_base = arch::smem_addr(s.v[0]);
  uint32_t it = 0, q_it = 0;  // blocks and tiles taken so far (the producer's order)

  // Ping-pong (FlashAttention-3): the two consumer warpgroups take turns issuing their wgmma batches,
  // so that one's softmax runs while the other's products occupy the tensor cores. Warpgroup c issues
  // after barrier kIssueBarrier + c completes (its own 128 threads + the other's 128 arrivals) and
  // then arrives on the other's; warpgroup 1 pre-arrives once so that warpgroup 0 starts. Both
  // warpgroups walk the same tiles and blocks, so their issue sections pair up one to one.
  const uint32_t my_turn = kIssueBarrier + wg, other_turn = kIssueBarrier + (wg ^ 1);
  if (wg == 1) arch::named_barrier_arrive(kIssueBarrier, 2 * 128);
  auto issue_begin = [&] { arch::named_barrier_sync(my_turn, 2 * 128); };
  auto issue_end = [&] { arch::named_barrier_arrive(other_turn, 2 * 128); };

  // The record of tile q_it (its Q is in buffer q_it % kQStages once q_full completes, if it has blocks).
  auto fetch = [&] {
    arch::mbarrier_wait(&s.q_full[q_it % kQStages], (q_it / kQStages) & 1);
    return s.tile[q_it % kQStages];
  };
  auto release_q = [&] { arch::mbarrier_arrive(&s.q_empty[q_it % kQStages]); };
  auto q_addr_of = [&] { return arch::smem_addr(s.q[q_it % kQStages]) + wg * kWarpgroupRows * 128; };
  // kScaleQ: the logit scale of this thread's two rows in the current tile (sm_scale x log2(e) x 2^-e), set by
  // scale_q once the tile's Q has landed (fetch) and before its first QK^T. The next tile's Q is rescaled at the
  // cross-tile step, when every softmax of the current tile is taken (only its last PV is pending).
  RowScales row_scale_log2;
  auto scale_q = [&] {
    if constexpr (kScaleQ) {
      float unscale[2];
      q_rows_to_scaled_f16(q_addr_of() + (tid >> 5) * 16 * 128, lane, unscale);
      row_scale_log2.row[0] = p.scale_log2 * unscale[0];
      row_scale_log2.row[1] = p.scale_log2 * unscale[1];
    }
  };
  struct Rows {
    int32_t qi[2], kv_end[2];
  };
  auto rows_of = [&](const TileInfo& ti) {
    const SeqView seq{ti.qo_start, ti.qo_len, ti.kv_len, ti.offset};
    Rows r;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      r.qi[h] = ti.chunk * tile_tokens + tok_in_tile[h];
      r.kv_end[h] = visible_key_end(seq, r.qi[h], p.causal);
    }
    return r;
  };
  auto limits = [&](const Rows& rw, const StageInfo& si, int32_t (&lim)[2]) {
    const int64_t key0 = static_cast<int64_t>(si.block) * kBlockKeys;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      bool sel = si.valid != 0;
      if constexpr (kSparse) sel = sel && ((si.tokens >> tok_in_tile[h]) & 1u);
      lim[h] = sel ? static_cast<int32_t>(clamp64(rw.kv_end[h] - key0, 0, kBlockKeys)) : 0;
    }
  };
  // V rows that must not enter the PV product: keys at or past kv_len of the request's last block,
  // and all of an invalid page's (P is 0 there, but 0 * NaN is NaN). The PV wgmma itself is never
  // skipped (a branch around it would make ptxas serialize every wgmma of the kernel).
  auto fix_v = [&](const TileInfo& ti, const StageInfo& si, uint32_t vs) {
    const int64_t first = si.valid ? static_cast<int64_t>(ti.kv_len) - static_cast<int64_t>(si.block) * kBlockKeys : 0;
    if (first < kBlockKeys) zero_v_rows(s.v[vs], static_cast<int32_t>(first));
  };

  float o[64], sc[64];
  float m[2], l[2], alpha[2];
  uint32_t pf[32];
  int32_t lim[2];
  auto softmax = [&](float (&mm)[2], float (&ll)[2], float (&aa)[2]) {
    if constexpr (kScaleQ) softmax_block(sc, mm, ll, aa, row_scale_log2);
    else softmax_block(sc, mm, ll, aa, p.scale_log2);
  };
  // QK^T of the K in stage st with PV of the V in stage vs (P of the previous block in pf), in this
  // warpgroup's issue turn; returns with the scores complete and the PV in flight.
  auto issue_qk_pv = [&](uint32_t q_addr, uint32_t st, uint32_t vs) {
    issue_begin();
    arch::wgmma_fence();
    issue_qk<kMmaBf16>(sc, q_addr, k_base + st * kTileBytes);
    issue_pv<kMmaBf16>(o, pf, v_base + vs * kTileBytes);
    issue_end();
    arch::fence_regs(pf);
    arch::wgmma_wait<1>();
    arch::fence_regs(sc);
  };
  // After issue_qk_pv: K stage st released, the scores masked and taken into the softmax state (m, l,
  // alpha) while the PV runs, then the PV's completion and V stage vs released.
  auto softmax_under_pv = [&](const Rows& rw, const StageInfo& si, uint32_t st, uint32_t vs, float (&mm)[2],
                              float (&ll)[2], float (&aa)[2]) {
    arch::mbarrier_arrive(&s.k_empty[st]);
    limits(rw, si, lim);
    mask_scores(sc, lim, t);
    softmax(mm, ll, aa);
    arch::wgmma_wait<0>();
    arch::fence_regs(o);
    arch::fence_regs(pf);
    arch::mbarrier_arrive(&s.v_empty[vs]);
  };
  // Epilogue of a tile: o = O * v_scale / l (0 when nothing is visible), lse = ln(sum exp(s)) (-inf when nothing
  // is): v_scale scales the output only.
  auto epilogue = [&](const TileInfo& ti, const Rows& rw) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(~0u, l[h], 1);
      l[h] += __shfl_xor_sync(~0u, l[h], 2);
      if (rw.qi[h] >= ti.qo_len) continue;
      const int64_t tok = static_cast<int64_t>(ti.qo_start) + rw.qi[h];
      const int64_t head = static_cast<int64_t>(ti.kv_head) * group + head_in_group[h];
      // l >= 1 when a key is visible (the row max weighs 1): the SFU's 1/l and log2 (arch/fast_math.cuh), not the
      // IEEE division's slow-path call, on the path from a tile's last PV to the next tile.
      const float inv = l[h] > 0.f ? arch::rcp_approx(l[h]) * p.v_scale : 0.f;
      Elem* dst = static_cast<Elem*>(p.o) + tok * p.o_stride_token + head * p.o_stride_head + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j) =
            arch::pack2<Elem>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      if (p.lse != nullptr && t == 0)
        p.lse[tok * p.lse_stride_token + head * p.lse_stride_head] =
            l[h] == 0.f ? -INFINITY : (m[h] + arch::log2_approx(l[h])) * 0.69314718055994531f;
    }
  };
  auto reset = [&] {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  };

  // Every consumer thread arrives on every empty barrier after its own last read of that buffer
  // and of the record beside it (s.tile, s.stage): see "Barrier protocol" in docs/prefill.md.
  TileInfo ti = fetch();
  MSA_QTRACE(mark(2));
  bool started = false;  // block 0 of ti went out at the previous tile's end (its softmax is taken)
  StageInfo prev{};      // the record of the block whose PV is pending
  while (ti.tile >= 0) {
    const Rows rw = rows_of(ti);
    if (ti.nblocks == 0) {
      release_q();
      reset();
      epilogue(ti, rw);
      MSA_QTRACE(done(q_it));
      ++q_it;
      ti = fetch();
      continue;
    }
    const uint32_t q_addr = q_addr_of();
    if (!started) {  // the tile's first QK^T alone
      reset();
      scale_q();
      const uint32_t st = it % kStages, ph = (it / kStages) & 1;
      arch::mbarrier_wait(&s.k_full[st], ph);
      if (q_it == 0) MSA_QTRACE(mark(3));
      prev = s.stage[st];
      issue_begin();
      arch::wgmma_fence();
      issue_qk<kMmaBf16>(sc, q_addr, k_base + st * kTileBytes);
      issue_end();
      MSA_QTRACE(issued(q_it));
      arch::wgmma_wait<0>();
      arch::fence_regs(sc);
      if (ti.nblocks == 1) release_q();
      arch::mbarrier_arrive(&s.k_empty[st]);
      limits(rw, prev, lim);
      mask_scores(sc, lim, t);
      softmax(m, l, alpha);
      scores_to_operand<kMmaBf16>(sc, pf);
    }
    for (int32_t i = 1; i < ti.nblocks; ++i) {
      const uint32_t st = (it + i) % kStages, ph = ((it + i) / kStages) & 1;
      const uint32_t pvs = (it + i - 1) % kVStages, pvph = ((it + i - 1) / kVStages) & 1;
      arch::mbarrier_wait(&s.k_full[st], ph);
      const StageInfo cur = s.stage[st];
      // V of the previous block was loaded before this K (fp8: right after it; the PV needs it all the
      // same): waiting here costs nothing, and keeps the tail fix (a barrier of both warpgroups) outside
      // the issue sections.
      arch::mbarrier_wait(&s.v_full[pvs], pvph);
      fix_v(ti, prev, pvs);
      issue_qk_pv(q_addr, st, pvs);
      if (i == ti.nblocks - 1) release_q();
      softmax_under_pv(rw, cur, st, pvs, m, l, alpha);
      rescale(o, alpha);
      scores_to_operand<kMmaBf16>(sc, pf);
      prev = cur;
    }
    // The tile's last PV is pending (pf, prev). The next tile's record: the scheduler claimed it and
    // loaded its Q into the other buffer while this tile's last kTileLookaheadBlocks blocks were issued.
    const uint32_t lvs = (it + ti.nblocks - 1) % kVStages, lvph = ((it + ti.nblocks - 1) / kVStages) & 1;
    it += ti.nblocks;
    ++q_it;
    const TileInfo nx = fetch();
    arch::mbarrier_wait(&s.v_full[lvs], lvph);
    fix_v(ti, prev, lvs);
    if (nx.tile >= 0 && nx.nblocks > 0) {
      // The next tile's first QK^T with this tile's last PV; its softmax (fresh state) while the PV runs.
      const Rows nrw = rows_of(nx);
      scale_q();  // q_it is the next tile's
      const uint32_t st = it % kStages, ph = (it / kStages) & 1;
      arch::mbarrier_wait(&s.k_full[st], ph);
      const StageInfo cur = s.stage[st];
      issue_qk_pv(q_addr_of(), st, lvs);
      MSA_QTRACE(issued(q_it));
      if (nx.nblocks == 1) release_q();
      float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.f, 0.f}, alpha2[2];
      softmax_under_pv(nrw, cur, st, lvs, m2, l2, alpha2);
      epilogue(ti, rw);
      MSA_QTRACE(done(q_it - 1));
      reset();  // the next tile's O starts at 0, its softmax state is the one just taken
      m[0] = m2[0], m[1] = m2[1];
      l[0] = l2[0], l[1] = l2[1];
      scores_to_operand<kMmaBf16>(sc, pf);
      prev = cur;
      started = true;
    } else {
      issue_begin();
      arch::wgmma_fence();
      issue_pv<kMmaBf16>(o, pf, v_base + lvs * kTileBytes);
      issue_end();
      arch::wgmma_wait<0>();
      arch::fence_regs(o);
      arch::fence_regs(pf);
      arch::mbarrier_arrive(&s.v_empty[lvs]);
      epilogue(ti, rw);
      MSA_QTRACE(done(q_it - 1));
      started = false;
    }
    ti = nx;
  }
}

#endif  // MSA_SM90A_DEVICE

// kF8: K and V are fp8 e4m3 (one TMA box of 128 keys x 128 bytes a block), widened to fp16.
template <bool kBf16, bool kSparse, bool kF8 = false>
__global__ void __launch_bounds__(kThreads, 1) qmajor_prefill_kernel(const __grid_constant__ QMajorParams p) {
#ifdef MSA_SM90A_DEVICE
  MSA_QTRACE_DECL;
  MSA_QTRACE(begin());
  if (threadIdx.x / 32 == 1) qmajor_prewait_prefetch(p, threadIdx.x & 31);
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  MSA_QTRACE(mark(1));
  arch::allow_dependent_launch();
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - (arch::smem_addr(smem_raw) & 1023u)) & 1023u;
  QMajorSmem& s = *reinterpret_cast<QMajorSmem*>(smem_raw + pad);
  if (threadIdx.x == 0) {
    // fp8: the converter threads complete k_full / v_full, the TMA loads k_land / v_land.
    constexpr uint32_t kFullArrivals = kF8 ? kF8ConvertThreads : 1;
    for (int i = 0; i < kQStages; ++i) {
      arch::mbarrier_init(&s.q_full[i], 1);
      arch::mbarrier_init(&s.q_empty[i], kConsumerThreads);
    }
    for (int i = 0; i < kStages; ++i) {
      arch::mbarrier_init(&s.k_full[i], kFullArrivals);
      arch::mbarrier_init(&s.k_empty[i], kConsumerThreads);
      if constexpr (kF8) arch::mbarrier_init(&s.k_land[i], 1);
    }
    for (int i = 0; i < kVStages; ++i) {
      arch::mbarrier_init(&s.v_full[i], kFullArrivals);
      arch::mbarrier_init(&s.v_empty[i], kConsumerThreads);
      if constexpr (kF8) arch::mbarrier_init(&s.v_land[i], 1);
    }
    arch::mbarrier_init(&s.ahead_full, 32);
    arch::mbarrier_init(&s.ahead_go, 32);
    arch::fence_mbarrier_init();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    arch::regs_decrease<kProducerRegs>();
    if (threadIdx.x < 32) qmajor_producer<kSparse, kF8>(p, s);
    else if (threadIdx.x < 64) qmajor_scheduler<kSparse>(p, s);
    else if constexpr (kF8) qmajor_converter(s, threadIdx.x - 32 * kF8ConvertWarp0);
  } else {
    arch::regs_increase<kConsumerRegs>();
    qmajor_consumer<kBf16, kSparse, kF8>(p, s, wg - 1 MSA_QTRACE_ARG);
    MSA_QTRACE(end());
  }
#endif
}

}  // namespace msa::detail::cuda::prefill_sm90
