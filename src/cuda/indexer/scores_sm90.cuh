// Prefill block scores on sm_90a: (token, head) rows as the wgmma M dimension, one 128-key block as N.
//
// CTA = 4 consumer warpgroups (64 rows each: 256 rows = 64 tokens x 4 heads of one index-K head) + one
// producer warp. Work item = (token tile, range of kSm90RangeBlocks blocks, index-K head); items are
// independent because a block's max needs no other block, and are dealt heaviest first (last token
// tiles first, all ranges of a tile together) so that the grid ends on the small items. The producer
// fills a kSm90Stages-deep ring of 128-byte-swizzled, K-major key blocks: with TMA boxes when the cache
// allows it (key_map.h; one lane per box, the page lookups of a warp round of blocks resolved at once),
// otherwise with a cp.async gather (any page size or token stride) that releases block i once block i+1
// is in flight. Pages outside the pool read as zeros. Each consumer warpgroup holds its 64 query rows in
// shared memory and issues 8 wgmma m64n128k16 per block; the row max of the 64x128 fp32 accumulator is a
// register max over 32 columns plus two quad shuffles, with the causal mask applied only on the diagonal
// blocks. Blocks no row of the tile can see are written -inf without being loaded.
#pragma once

#include "cuda/arch/sm80.cuh"
#include "cuda/arch/sm90.cuh"
#include "cuda/arch/sm90_wgmma.cuh"
#include "cuda/indexer/device.cuh"

namespace msa::detail::cuda::indexer {

inline constexpr int kSm90QHalfBytes = kSm90Rows * 128;      // 64 of the 128 dims, one 128-byte row each
inline constexpr int kSm90KHalfBytes = kBlock * 128;
inline constexpr int kSm90KStageBytes = 2 * kSm90KHalfBytes;  // 32 KB
inline constexpr int kSm90SmemBytes = 1024 /* alignment slack */ + 2 * kSm90QHalfBytes +
                                      kSm90Stages * kSm90KStageBytes + 2 * kSm90Stages * 8;

struct Sm90Args {
  BlockScoresParams p;
  CUtensorMap keys;  // valid when tma (key_map.h)
  int64_t slots;     // token-tile slots (see slot_to_request)
  int ranges;        // ranges of kSm90RangeBlocks blocks per tile
  int tile_tokens;
  int page_shift;
  bool tma;
};

// A visible-key end relative to the first key of the range, clamped to [0, (kSm90RangeBlocks + 1) x kBlock]:
// the diagonal test and the row masks of the consumer loop then take 32-bit values (the consumers have 96
// registers per thread, 64 of them the accumulator).
__device__ __forceinline__ int range_relative_end(int64_t end, int blk_begin) {
  return static_cast<int>(clamp_to<int64_t>(end - static_cast<int64_t>(blk_begin) * kBlock, 0,
                                            static_cast<int64_t>(kSm90RangeBlocks + 1) * kBlock));
}

// Byte offset of 16-byte chunk c (0..15) of row r in a [2 halves][rows][128 B] 128B-swizzled tile.
__device__ __forceinline__ uint32_t swizzled_chunk(int r, int c, int half_bytes) {
  return (c >> 3) * half_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

template <bool kF16>
__global__ void __launch_bounds__(kSm90Threads, 1) scores_sm90_kernel(const __grid_constant__ Sm90Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const BlockScoresParams& p = a.p;
  const int tile_tokens = a.tile_tokens;
  using QT = std::conditional_t<kF16, __half, __nv_bfloat16>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t q_s = arch::smem_addr(smem);
  const uint32_t k_s = q_s + 2 * kSm90QHalfBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + 2 * kSm90QHalfBytes + kSm90Stages * kSm90KStageBytes);
  uint64_t* empty = full + kSm90Stages;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = p.num_heads / p.k.num_heads, kh = blockIdx.y;
  // Last tiles first (they have the most blocks), all ranges of a tile together.
  const int64_t slot = a.slots - 1 - blockIdx.x / a.ranges;
  const int range = static_cast<int>(blockIdx.x % a.ranges);
  int64_t tile = 0;
  const int b = slot_to_request(p.seqs, slot, tile_tokens, &tile);
  if (b < 0) return;
  const Request rq = load_request(p.seqs, b);
  const int64_t tok0 = tile * tile_tokens;
  if (tok0 >= rq.q_len) return;
  const int ntok = static_cast<int>(min64(tile_tokens, rq.q_len - tok0));
  const int64_t hi_first = visible_end(rq, rq.offset + tok0, p.causal);
  const int64_t hi_last = visible_end(rq, rq.offset + tok0 + ntok - 1, p.causal);
  const int blk_begin = range * kSm90RangeBlocks;
  const int blk_end = static_cast<int>(min64(blk_begin + kSm90RangeBlocks, p.max_blocks));
  const int nb_vis = static_cast<int>(min64((hi_last + kBlock - 1) / kBlock, p.max_blocks));
  const int ncomp = max(min(blk_end, nb_vis) - blk_begin, 0);
  const int64_t tok_base = rq.q_begin + tok0;

  if (warp < 4 * kSm90ConsumerWarpgroups && blk_end > max(blk_begin, nb_vis)) {
    // -inf where no row of the tile sees a key: one warp per row of the output's innermost dimension
    // (blocks for THK, tokens otherwise), so that each warp writes contiguous words.
    const int fill_begin = max(blk_begin, nb_vis);
    const int nwarps = 4 * kSm90ConsumerWarpgroups;
    if (p.out_stride_block == 1) {
      for (int r = warp; r < ntok * G; r += nwarps) {
        float* o = p.out + (tok_base + r / G) * p.out_stride_token + (kh * G + r % G) * p.out_stride_head;
        for (int x = fill_begin + lane; x < blk_end; x += 32) o[x] = -INFINITY;
      }
    } else {
      for (int r = warp; r < (blk_end - fill_begin) * G; r += nwarps) {
        float* o = p.out + tok_base * p.out_stride_token + (kh * G + r % G) * p.out_stride_head +
                   static_cast<int64_t>(fill_begin + r / G) * p.out_stride_block;
        for (int i = lane; i < ntok; i += 32) o[i * p.out_stride_token] = -INFINITY;
      }
    }
  }
  if (ncomp == 0) return;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kSm90Stages; ++s) {
      arch::mbarrier_init(full + s, 32);  // every producer lane (TMA: lane 0 with the bytes; see the ring kernel)
      arch::mbarrier_init(empty + s, 4 * kSm90ConsumerWarpgroups);  // one arrival per consumer warp
    }
    arch::fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == 4 * kSm90ConsumerWarpgroups && a.tma) {
    // ---------------- producer: TMA boxes into the stage ring ----------------
    // Lane l resolves block it0 + l / parts, box l % parts (pg = -2: beyond every row's keys, not loaded;
    // -1: outside the pool, zero keys written by the warp); then per block the boxes' lanes issue them.
    if (lane == 0) arch::tma_prefetch_descriptor(&a.keys);
    const PageRow pr = page_row(p.pages, b);
    const PageDiv pd{p.k.page_size, a.page_shift};
    const int rows = min(p.k.page_size, kBlock), parts = kBlock / rows, per_round = 32 / parts;
    for (int it0 = 0; it0 < ncomp; it0 += per_round) {
      int pg = -2, off = 0;
      {
        const int it = it0 + lane / parts;
        const int64_t key0 = static_cast<int64_t>(blk_begin + it) * kBlock + (lane % parts) * rows;
        if (it < ncomp && key0 < hi_last) {
          int64_t lp;
          pd.split(key0, &lp, &off);
          pg = page_of(pr, lp, p.pages.num_pages);
        }
      }
      for (int k = 0; k < per_round && it0 + k < ncomp; ++k) {
        const int it = it0 + k, stage = it % kSm90Stages;
        const uint32_t dst_stage = k_s + stage * kSm90KStageBytes;
        const int src = k * parts + (lane < parts ? lane : 0);
        const int my_pg = __shfl_sync(kFullMask, pg, src), my_off = __shfl_sync(kFullMask, off, src);
        const bool mine = lane < parts;
        const unsigned load_mask = __ballot_sync(kFullMask, mine && my_pg >= 0);
        const unsigned zero_mask = __ballot_sync(kFullMask, mine && my_pg == -1);
        if (it >= kSm90Stages) arch::mbarrier_wait(empty + stage, ((it / kSm90Stages) - 1) & 1);
        if (zero_mask) {
          for (unsigned m = zero_mask; m; m &= m - 1) {
            const int zp = __ffs(m) - 1;
            for (int x = 16 * lane; x < rows * 128; x += 512) {
              arch::st_shared_zero16(dst_stage + zp * rows * 128 + x);
              arch::st_shared_zero16(dst_stage + kSm90KHalfBytes + zp * rows * 128 + x);
            }
          }
          arch::fence_proxy_async();  // generic zeros before the wgmma (async proxy) reads them
        }
        const uint32_t bytes = __popc(load_mask) * rows * 256;
        if (lane == 0 && bytes)
          arch::mbarrier_arrive_expect_tx(full + stage, bytes);
        else
          arch::mbarrier_arrive(full + stage);
        __syncwarp();  // the bytes are announced before any box can complete them
        if (mine && my_pg >= 0) {
          const uint32_t dst = dst_stage + lane * rows * 128;
          arch::tma_load_4d(dst, &a.keys, 0, my_off, kh, my_pg, full + stage);
          arch::tma_load_4d(dst + kSm90KHalfBytes, &a.keys, 64, my_off, kh, my_pg, full + stage);
        }
      }
    }
    return;
  }

  if (warp == 4 * kSm90ConsumerWarpgroups) {
    // ---------------- producer: cp.async gather of key blocks into the stage ring ----------------
    // Lane l resolves the source rows l, l+32, l+64, l+96 of a block (page lookup, 64-bit address);
    // the copy loop then fetches each row's address with a shuffle: ~18 instructions per 16-byte copy.
    const PageRow pr = page_row(p.pages, b);
    const PageDiv pd{p.k.page_size, a.page_shift};
    const char* kbase = static_cast<const char*>(p.k.data) + kh * p.k.stride_head * 2;
    const int64_t sp = p.k.stride_page * 2, st = p.k.stride_token * 2;
    const int c = lane & 15, half = lane >> 4;
    for (int it = 0; it < ncomp; ++it) {
      const int stage = it % kSm90Stages;
      const int64_t key0 = static_cast<int64_t>(blk_begin + it) * kBlock;
      unsigned long long row_addr[kBlock / 32];
#pragma unroll
      for (int q = 0; q < kBlock / 32; ++q) {
        const int64_t j = key0 + lane + 32 * q;
        int64_t lp;
        int off;
        pd.split(j, &lp, &off);
        const int pg = j < hi_last ? page_of(pr, lp, p.pages.num_pages) : -1;
        row_addr[q] = pg >= 0 ? reinterpret_cast<unsigned long long>(kbase + pg * sp + off * st) : 0ull;
      }
      if (it >= kSm90Stages) arch::mbarrier_wait(empty + stage, ((it / kSm90Stages) - 1) & 1);
      const uint32_t dst_stage = k_s + stage * kSm90KStageBytes;
#pragma unroll
      for (int m = 0; m < kBlock / 2; ++m) {
        const int r = 2 * m + half;
        const unsigned long long a = __shfl_sync(kFullMask, row_addr[m / 16], r & 31);
        const char* src = a ? reinterpret_cast<const char*>(a) + c * 16 : kbase;
        arch::cp_async_16(dst_stage + swizzled_chunk(r, c, kSm90KHalfBytes), src, a ? 16 : 0);
      }
      arch::cp_async_commit();
      // Block it-1 is signalled once block it is in flight: wait for its copies, make them visible to
      // the async proxy (wgmma), release. The one-block lag never stalls the consumers, who need it-1
      // only after finishing it-2, while issuing `it` needed just block it-4 finished.
      if (it > 0) {
        arch::cp_async_wait<1>();
        arch::fence_proxy_async();
        arch::mbarrier_arrive(full + (it - 1) % kSm90Stages);
      }
    }
    arch::cp_async_wait_all();
    arch::fence_proxy_async();
    arch::mbarrier_arrive(full + (ncomp - 1) % kSm90Stages);
    return;
  }

  // ---------------- consumers ----------------
  const int wg = warp >> 2, wi = warp & 3, tid = threadIdx.x & 127;
  const int rows = tile_tokens * G;
  // This warpgroup's 64 query rows -> shared memory (row r = token r / G, head r % G).
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    const int q = tid + 128 * m, c = q & 15, row = 64 * wg + (q >> 4);
    const int i = row / G, j = row % G;
    const bool valid = row < rows && i < ntok;
    const QT* src = static_cast<const QT*>(p.q) + (valid ? (tok_base + i) * p.q_stride_token +
                                                               (kh * G + j) * p.q_stride_head + 8 * c
                                                         : 0);
    arch::cp_async_16(q_s + swizzled_chunk(row, c, kSm90QHalfBytes), src, valid ? 16 : 0);
  }
  arch::cp_async_commit();
  arch::cp_async_wait_all();
  arch::fence_proxy_async();
  arch::named_barrier_sync(1 + wg, 128);

  // Accumulator rows of this thread: r_lo (values 4j, 4j+1) and r_lo + 8 (4j+2, 4j+3).
  const int first_end = range_relative_end(hi_first, blk_begin);  // the tile's first row's
  int hi[2];                                                        // range_relative_end
  float* outp[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 64 * wg + 16 * wi + (lane >> 2) + 8 * h;
    const int i = row / G, j = row % G;
    const bool valid = row < rows && i < ntok;
    hi[h] = valid ? range_relative_end(visible_end(rq, rq.offset + tok0 + i, p.causal), blk_begin) : 0;
    outp[h] = valid ? p.out + (tok_base + i) * p.out_stride_token + (kh * G + j) * p.out_stride_head : nullptr;
  }
  const uint64_t desc_q = arch::smem_desc_kmajor_sw128(q_s + 64 * wg * 128);
  const bool blocks_contiguous = p.out_stride_block == 1;  // THK: a row's blocks are adjacent in out
  float acc[64];
  float keep[2] = {-INFINITY, -INFINITY};
  for (int it = 0; it < ncomp; ++it) {
    const int stage = it % kSm90Stages;
    const int blk = blk_begin + it;
    arch::mbarrier_wait(full + stage, (it / kSm90Stages) & 1);
    const uint64_t desc_k = arch::smem_desc_kmajor_sw128(k_s + stage * kSm90KStageBytes);
    arch::fence_regs(acc);
    arch::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const uint32_t qo = (k >> 2) * kSm90QHalfBytes + (k & 3) * 32;
      const uint32_t ko = (k >> 2) * kSm90KHalfBytes + (k & 3) * 32;
      arch::wgmma_m64n128k16_ss<QT>(acc, desc_q + (qo >> 4), desc_k + (ko >> 4), k > 0);
    }
    arch::wgmma_commit();
    arch::wgmma_wait<0>();
    arch::fence_regs(acc);
    __syncwarp();
    if (lane == 0) arch::mbarrier_arrive(empty + stage);

    // Row max over the block's 128 keys (columns 8j + e + 2 (lane & 3) of this thread). Only blocks where
    // some row of the tile stops (the diagonal) need the mask: a 32-bit limit per row then costs one
    // compare and one select per value; elsewhere the max is 64 FMNMX per thread.
    float mx[2][4];
    if ((it + 1) * kBlock <= first_end) {
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float v = fmaxf(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
          mx[h][j & 3] = j < 4 ? v : fmaxf(mx[h][j & 3], v);
        }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 4; ++q) mx[h][q] = -INFINITY;
      const int col0 = it * kBlock + 2 * (lane & 3);
      int lim[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) lim[h] = min(max(hi[h] - col0, 0), kBlock);
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            mx[h][j & 3] = fmaxf(mx[h][j & 3], 8 * j + e < lim[h] ? acc[4 * j + 2 * h + e] : -INFINITY);
    }
    float m[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      m[h] = warp_max_xor(fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3])), 1, 2);
    if (blocks_contiguous) {
      // Quad lane q keeps block 4k + q of each group of 4, then the quad writes the group as one
      // 16-byte run per row instead of four scattered words.
      const int slot = it & 3;
      if ((lane & 3) == slot) keep[0] = m[0], keep[1] = m[1];
      if (slot == 3 || it == ncomp - 1) {
        const int mine = (it & ~3) + (lane & 3);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (mine <= it && outp[h]) outp[h][blk_begin + mine] = keep[h];
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if ((lane & 3) == h && outp[h]) outp[h][blk * p.out_stride_block] = m[h];
    }
  }
#else
  __trap();  // built without sm_90a: sm90_scores_available() keeps the dispatcher away
#endif
}

}  // namespace msa::detail::cuda::indexer
