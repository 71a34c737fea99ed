// Query-major sparse / dense paged prefill for sm_90a: TMA + wgmma, warp-specialized.
//
// One CTA per SM walks work tiles (request, KV head, 128/G tokens) fetched from an atomic counter.
// Warpgroup 0 is the producer: one warp loads the tile's Q (two 128B-swizzled boxes of 64 dims)
// and then, for every KV block of the tile, its K and V (one box per 64 dims of a 128-key page
// slice) into a kStages-deep mbarrier ring. Warpgroups 1 and 2 are consumers of 64 rows each:
//   S = Q K^T (8 x wgmma m64n128k16, smem x smem), mask, online softmax in registers,
//   O += P V   (8 x wgmma m64n128k16, P from registers, V MN-major),
// with the QK^T of block i issued before the PV of block i-1 so that the softmax of one block runs
// while the tensor cores work on the other (FlashAttention-3's intra-warpgroup overlap).
//
// The block list of a tile: dense = 0 .. last block of the causal frontier; sparse = the sorted
// union of the tile tokens' valid selections with a token bitmask per block (schedule.cu).
// Masking is one key limit per row and block: keys [block*128, block*128 + limit) are visible.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/config.h"
#include "cuda/sm90/consumer_math.cuh"
#include "cuda/sm90/params.h"
#include "cuda/sm90/sync.cuh"
#include "cuda/sm90/tile_common.cuh"

namespace msa::detail::cuda::sm90 {

// What the producer tells the consumers about a stage: the block, which tile tokens selected it,
// and whether its page exists (for an invalid page the producer loads page 0; the consumers mask
// every key and zero its V).
struct StageInfo {
  int32_t block;
  uint32_t tokens;
  int32_t valid;
  int32_t unused;
};

struct TileInfo {
  int32_t tile;  // -1: no more work
  int32_t nblocks;
  int32_t request, chunk, kv_head;
  int32_t qo_start, qo_len, kv_len, offset;
};

struct alignas(1024) QMajorSmem {
  uint8_t q[kTileBytes];
  uint8_t k[kStages][kTileBytes];
  uint8_t v[kStages][kTileBytes];
  uint64_t q_full, q_empty;
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kStages], v_empty[kStages];
  StageInfo stage[kStages];
  TileInfo tile;
};
// + 1 KiB to align the dynamic shared memory base to 1024 B (128B-swizzle atoms).
inline constexpr int kQMajorSmemBytes = static_cast<int>(sizeof(QMajorSmem)) + 1024;
static_assert(kQMajorSmemBytes <= 227 * 1024, "Hopper allows 227 KiB of shared memory per CTA");

#ifdef MSA_SM90A_DEVICE

// ---------------------------------------------------------------------------------------------
// Producer: one warp. Lane 0 issues everything; the warp resolves 32 blocks' pages at a time.
template <bool kSparse>
__device__ __forceinline__ void qmajor_producer(const QMajorParams& p, QMajorSmem& s) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    tma_prefetch_descriptor(&p.q_map);
    tma_prefetch_descriptor(&p.k_map);
    tma_prefetch_descriptor(&p.v_map);
  }
  const int32_t group = 1 << p.group_shift;
  const int32_t tile_tokens = p.sched.tile_tokens;
  const int32_t live = live_tiles(p.sched, p.seqs.batch_size);
  uint32_t it = 0, q_phase = 0;
  while (true) {
    int32_t tile = 0;
    do {  // sparse tiles flagged KV-major belong to the other kernel
      if (lane == 0) tile = atomicAdd(p.tile_counter, 1);
      tile = __shfl_sync(~0u, tile, 0);
    } while (kSparse && tile < live && p.lists.kv_major[tile] != 0);
    TileInfo ti{};
    ti.tile = -1;
    if (tile < live) {
      const TileCoord c = decode_tile(p.sched, p.seqs.batch_size, tile);
      const SeqView v = load_seq(p.seqs, c.request);
      ti = TileInfo{tile, 0, c.request, c.chunk, c.kv_head, v.qo_start, v.qo_len, v.kv_len, v.offset};
      if constexpr (kSparse) {
        ti.nblocks = min(max(p.lists.count[tile], 0), p.lists.capacity);
      } else {
        const int32_t last = min((c.chunk + 1) * tile_tokens, v.qo_len) - 1;
        ti.nblocks = num_kv_blocks(visible_key_end(v, last, p.causal));
      }
    }
    if (lane == 0) {
      barrier_wait(&s.q_empty, q_phase ^ 1);
      s.tile = ti;
      if (ti.tile >= 0 && ti.nblocks > 0) {
        const int32_t tok0 = ti.qo_start + ti.chunk * tile_tokens;
        barrier_arrive_expect(&s.q_full, kTileBytes);
        tma_load_3d(s.q, &p.q_map, 0, ti.kv_head * group, tok0, &s.q_full);
        tma_load_3d(s.q + kHalfTileBytes, &p.q_map, kHalfDim, ti.kv_head * group, tok0, &s.q_full);
      } else {
        barrier_arrive(&s.q_full);
      }
    }
    q_phase ^= 1;
    if (ti.tile < 0) break;

    for (int32_t i0 = 0; i0 < ti.nblocks; i0 += 32) {
      int32_t block = 0, page = -1;
      uint32_t tokens = 0;
      if (i0 + lane < ti.nblocks) {
        if constexpr (kSparse) {
          const int2 e = p.lists.entries[static_cast<int64_t>(tile) * p.lists.capacity + i0 + lane];
          block = e.x;
          tokens = static_cast<uint32_t>(e.y);
        } else {
          block = i0 + lane;
          tokens = ~0u;
        }
        page = physical_page(p.pages, ti.request, block / p.page_blocks);
      }
      const int32_t n = min(32, ti.nblocks - i0);
      for (int32_t j = 0; j < n; ++j, ++it) {
        const int32_t blk = __shfl_sync(~0u, block, j);
        const int32_t pg = __shfl_sync(~0u, page, j);
        const uint32_t tok = __shfl_sync(~0u, tokens, j);
        if (lane == 0) {
          const uint32_t st = it % kStages, ph = (it / kStages) & 1;
          const int32_t key0 = (blk % p.page_blocks) * kBlockKeys;
          const int32_t pc = pg >= 0 ? pg : 0;  // no page: load page 0, the consumers mask it all
          barrier_wait(&s.k_empty[st], ph ^ 1);
          s.stage[st] = StageInfo{blk, tok, pg >= 0, 0};
          barrier_arrive_expect(&s.k_full[st], kTileBytes);
          tma_load_4d(s.k[st], &p.k_map, 0, key0, ti.kv_head, pc, &s.k_full[st]);
          tma_load_4d(s.k[st] + kHalfTileBytes, &p.k_map, kHalfDim, key0, ti.kv_head, pc, &s.k_full[st]);
          barrier_wait(&s.v_empty[st], ph ^ 1);
          barrier_arrive_expect(&s.v_full[st], kTileBytes);
          tma_load_4d(s.v[st], &p.v_map, 0, key0, ti.kv_head, pc, &s.v_full[st]);
          tma_load_4d(s.v[st] + kHalfTileBytes, &p.v_map, kHalfDim, key0, ti.kv_head, pc, &s.v_full[st]);
        }
      }
    }
  }
}

template <bool kBf16, bool kSparse>
__device__ __forceinline__ void qmajor_consumer(const QMajorParams& p, QMajorSmem& s, int wg) {
  using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
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
  const uint32_t q_addr = smem_u32(s.q) + wg * kWarpgroupRows * 128;
  const uint32_t k_base = smem_u32(s.k[0]);
  const uint32_t v_base = smem_u32(s.v[0]);
  uint32_t it = 0, q_phase = 0;

  // Ping-pong (FlashAttention-3): the two consumer warpgroups take turns issuing their wgmma batches,
  // so that one's softmax runs while the other's products occupy the tensor cores. Warpgroup c issues
  // after barrier kIssueBarrier + c completes (its own 128 threads + the other's 128 arrivals) and
  // then arrives on the other's; warpgroup 1 pre-arrives once so that warpgroup 0 starts. Both
  // warpgroups walk the same tiles and blocks, so their issue sections pair up one to one.
  const uint32_t my_turn = kIssueBarrier + wg, other_turn = kIssueBarrier + (wg ^ 1);
  if (wg == 1) named_barrier_arrive(kIssueBarrier, 2 * 128);
  auto issue_begin = [&] { named_barrier_sync(my_turn, 2 * 128); };
  auto issue_end = [&] { named_barrier_arrive(other_turn, 2 * 128); };

  while (true) {
    barrier_wait(&s.q_full, q_phase);
    q_phase ^= 1;
    const TileInfo ti = s.tile;
    if (ti.tile < 0) break;
    const SeqView seq{ti.qo_start, ti.qo_len, ti.kv_len, ti.offset};
    int32_t qi[2], kv_end[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      qi[h] = ti.chunk * tile_tokens + tok_in_tile[h];
      kv_end[h] = visible_key_end(seq, qi[h], p.causal);
    }
    auto limits = [&](const StageInfo& si, int32_t (&lim)[2]) {
      const int64_t key0 = static_cast<int64_t>(si.block) * kBlockKeys;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        bool sel = si.valid != 0;
        if constexpr (kSparse) sel = sel && ((si.tokens >> tok_in_tile[h]) & 1u);
        lim[h] = sel ? static_cast<int32_t>(clamp64(kv_end[h] - key0, 0, kBlockKeys)) : 0;
      }
    };
    // V rows that must not enter the PV product: keys at or past kv_len of the request's last block,
    // and all of an invalid page's (P is 0 there, but 0 * NaN is NaN). The PV wgmma itself is never
    // skipped (a branch around it would make ptxas serialize every wgmma of the kernel).
    auto fix_v = [&](const StageInfo& si, uint32_t st) {
      const int64_t first = si.valid ? static_cast<int64_t>(ti.kv_len) - static_cast<int64_t>(si.block) * kBlockKeys : 0;
      if (first < kBlockKeys) zero_v_rows(s.v[st], static_cast<int32_t>(first));
    };

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
    int32_t lim[2];

    // Every consumer thread arrives on every empty barrier after its own last read of that buffer
    // and of the record beside it (s.tile, s.stage): see "Barrier protocol" in docs/prefill.md.
    if (ti.nblocks == 0) {
      barrier_arrive(&s.q_empty);
    } else {
      float sc[64];
      uint32_t pf[32];
      uint32_t st = it % kStages, ph = (it / kStages) & 1;
      barrier_wait(&s.k_full[st], ph);
      StageInfo cur = s.stage[st];
      issue_begin();
      wgmma_fence();
      issue_qk<kBf16>(sc, q_addr, k_base + st * kTileBytes);
      issue_end();
      wgmma_wait<0>();
      fence_regs(sc);
      if (ti.nblocks == 1) barrier_arrive(&s.q_empty);
      barrier_arrive(&s.k_empty[st]);
      limits(cur, lim);
      mask_scores(sc, lim, t);
      softmax_block(sc, m, l, alpha, p.scale_log2);
      scores_to_operand<kBf16>(sc, pf);
      uint32_t pst = st, pph = ph;
      StageInfo prev = cur;

      for (int32_t i = 1; i < ti.nblocks; ++i) {
        st = (it + i) % kStages;
        ph = ((it + i) / kStages) & 1;
        barrier_wait(&s.k_full[st], ph);
        cur = s.stage[st];
        // V of the previous block was loaded before this K: waiting here costs nothing, and keeps the
        // tail fix (a barrier of both warpgroups) outside the issue sections.
        barrier_wait(&s.v_full[pst], pph);
        fix_v(prev, pst);
        issue_begin();
        wgmma_fence();
        issue_qk<kBf16>(sc, q_addr, k_base + st * kTileBytes);
        issue_pv<kBf16>(o, pf, v_base + pst * kTileBytes);
        issue_end();
        fence_regs(pf);
        wgmma_wait<1>();
        fence_regs(sc);
        if (i == ti.nblocks - 1) barrier_arrive(&s.q_empty);
        barrier_arrive(&s.k_empty[st]);
        limits(cur, lim);
        mask_scores(sc, lim, t);
        softmax_block(sc, m, l, alpha, p.scale_log2);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        barrier_arrive(&s.v_empty[pst]);
        rescale(o, alpha);
        scores_to_operand<kBf16>(sc, pf);
        pst = st;
        pph = ph;
        prev = cur;
      }
      barrier_wait(&s.v_full[pst], pph);
      fix_v(prev, pst);
      issue_begin();
      wgmma_fence();
      issue_pv<kBf16>(o, pf, v_base + pst * kTileBytes);
      issue_end();
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pf);
      barrier_arrive(&s.v_empty[pst]);
    }
    it += ti.nblocks;

    // Epilogue: o = O / l (0 when nothing is visible), lse = ln(sum exp(s)) (-inf when nothing is).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(~0u, l[h], 1);
      l[h] += __shfl_xor_sync(~0u, l[h], 2);
      if (qi[h] >= ti.qo_len) continue;
      const int64_t tok = static_cast<int64_t>(ti.qo_start) + qi[h];
      const int64_t head = static_cast<int64_t>(ti.kv_head) * group + head_in_group[h];
      const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
      Elem* dst = static_cast<Elem*>(p.o) + tok * p.o_stride_token + head * p.o_stride_head + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack2<kBf16>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      if (p.lse != nullptr && t == 0)
        p.lse[tok * p.lse_stride_token + head * p.lse_stride_head] =
            l[h] > 0.f ? (m[h] + __log2f(l[h])) * 0.69314718055994531f : -INFINITY;
    }
  }
}

#endif  // MSA_SM90A_DEVICE

template <bool kBf16, bool kSparse>
__global__ void __launch_bounds__(kThreads, 1) qmajor_prefill_kernel(const __grid_constant__ QMajorParams p) {
#ifdef MSA_SM90A_DEVICE
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
  QMajorSmem& s = *reinterpret_cast<QMajorSmem*>(smem_raw + pad);
  if (threadIdx.x == 0) {
    barrier_init(&s.q_full, 1);
    barrier_init(&s.q_empty, kConsumerThreads);
    for (int i = 0; i < kStages; ++i) {
      barrier_init(&s.k_full[i], 1);
      barrier_init(&s.k_empty[i], kConsumerThreads);
      barrier_init(&s.v_full[i], 1);
      barrier_init(&s.v_empty[i], kConsumerThreads);
    }
    barrier_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    regs_decrease<kProducerRegs>();
    if (threadIdx.x < 32) qmajor_producer<kSparse>(p, s);
  } else {
    regs_increase<kConsumerRegs>();
    qmajor_consumer<kBf16, kSparse>(p, s, wg - 1);
  }
#endif
}

}  // namespace msa::detail::cuda::sm90
