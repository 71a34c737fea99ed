// Prefill block scores on sm_90a with fp8 e4m3 index keys on fp8 wgmma (e4m3 x e4m3 -> fp32, 32 elements
// of K per instruction: twice the 16-bit MMA rate, half the key bytes).
//
// The sibling of scores_sm90.cuh: the same work items (token tile, range of kSm90RangeBlocks blocks,
// index-K head), the same 256-row CTA of 4 consumer warpgroups and one producer warp, the same -inf fill
// and row-max epilogue. What differs:
// - Queries are quantized to e4m3 once per work item: each row times 448 / amax (448 the largest e4m3
//   value; the fp32 quotient and products correctly rounded), rounded to nearest even, stored 128-byte
//   swizzled like the keys; the row's inverse scale amax * (1 / 448) multiplies its block maxima. A key
//   row is 128 bytes, one TMA box row (key_map.h's 16-bit pseudo-elements) and one swizzle row, so a
//   block is 4 wgmma m64n128k32 (8 for bf16).
// - A stage holds a block's keys and its 128 per-token scales (TMA box + one bulk copy per box, or the
//   cp.async gather's 4-byte copies). The epilogue multiplies each accumulator column by its key's scale
//   before the max (the scales differ per key, so they cannot follow the max as the query's does).
// Error budget (unit-variance q and k, D = 128): rounding q to e4m3 moves each product by at most 2^-4
// relative (3 mantissa bits; ~2.6% rms), so a score moves by ~0.3 rms, the same as the keys' own e4m3
// rounding; the fp32 accumulation inside the tensor core (~14 bits kept across a k32 step) adds ~2^-14 of
// the score's magnitude. scores_portable.cuh keeps the exact path (keys converted to fp16, queries
// rescaled by a power of two).
#pragma once

#include "cuda/arch/fp8.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/arch/sm90.cuh"
#include "cuda/arch/sm90_wgmma.cuh"
#include "cuda/indexer/device.cuh"
#include "cuda/indexer/scores_sm90.cuh"  // Sm90Args, swizzled_chunk

namespace msa::detail::cuda::indexer {

struct Sm90F8Layout {
  static constexpr int kQBytes = kSm90Rows * 128;  // e4m3 queries: one 128-byte row each
  static constexpr int kKeyBytes = kBlock * 128;
  static constexpr int kStageBytes = (kKeyBytes + kBlock * 4 + 1023) / 1024 * 1024;  // keys + scales
  static constexpr int kStages = kSm90F8Stages;
  static constexpr int kSmemBytes = 1024 /* alignment slack */ + kQBytes + kStages * kStageBytes +
                                    kSm90Rows * 4 /* query inverse scales */ + 2 * kStages * 8;
  static_assert(kSmemBytes <= 227 * 1024, "beyond the sm_90 shared memory per CTA");
};

template <bool kF16>
__global__ void __launch_bounds__(kSm90Threads, 1) scores_sm90_fp8_kernel(const __grid_constant__ Sm90Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Sm90F8Layout;
  constexpr int S = L::kStages;
  const BlockScoresParams& p = a.p;
  const int tile_tokens = a.tile_tokens;
  using QT = std::conditional_t<kF16, __half, __nv_bfloat16>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t q_s = arch::smem_addr(smem);
  const uint32_t k_s = q_s + L::kQBytes;
  const uint32_t qinv_s = k_s + S * L::kStageBytes;  // float per query row
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kQBytes + S * L::kStageBytes + kSm90Rows * 4);
  uint64_t* empty = full + S;

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
    // -inf where no row of the tile sees a key (as in scores_sm90.cuh).
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
    for (int s = 0; s < S; ++s) {
      arch::mbarrier_init(full + s, 32);  // every producer lane (TMA: lane 0 with the bytes; see the ring kernel)
      arch::mbarrier_init(empty + s, 128 * kSm90ConsumerWarpgroups);  // every consumer thread (it reads the scales)
    }
    arch::fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == 4 * kSm90ConsumerWarpgroups && a.tma) {
    // ---------------- producer: TMA boxes and scale copies into the stage ring ----------------
    // Lane l resolves block it0 + l / parts, box l % parts (pg = -2: beyond every row's keys, not loaded;
    // -1: outside the pool, zero keys and scales written by the warp); then per block the boxes' lanes
    // issue one key box and one bulk copy of its scales each.
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
        const int it = it0 + k, stage = it % S;
        const uint32_t dst_stage = k_s + stage * L::kStageBytes;
        const int src = k * parts + (lane < parts ? lane : 0);
        const int my_pg = __shfl_sync(kFullMask, pg, src), my_off = __shfl_sync(kFullMask, off, src);
        const bool mine = lane < parts;
        const unsigned load_mask = __ballot_sync(kFullMask, mine && my_pg >= 0);
        const unsigned zero_mask = __ballot_sync(kFullMask, mine && my_pg == -1);
        if (it >= S) arch::mbarrier_wait(empty + stage, ((it / S) - 1) & 1);
        if (zero_mask) {
          for (unsigned m = zero_mask; m; m &= m - 1) {
            const int zp = __ffs(m) - 1;
            for (int x = 16 * lane; x < rows * 128; x += 512) arch::st_shared_zero16(dst_stage + zp * rows * 128 + x);
            for (int x = 16 * lane; x < rows * 4; x += 512)
              arch::st_shared_zero16(dst_stage + L::kKeyBytes + zp * rows * 4 + x);
          }
          arch::fence_proxy_async();  // generic zeros before the wgmma (async proxy) reads them
        }
        const uint32_t bytes = __popc(load_mask) * rows * (128 + 4);
        if (lane == 0 && bytes)
          arch::mbarrier_arrive_expect_tx(full + stage, bytes);
        else
          arch::mbarrier_arrive(full + stage);
        __syncwarp();  // the bytes are announced before any copy can complete them
        if (mine && my_pg >= 0) {
          arch::tma_load_4d(dst_stage + lane * rows * 128, &a.keys, 0, my_off, kh, my_pg, full + stage);
          const float* sc = p.k_scale + my_pg * p.ks_stride_page + kh * p.ks_stride_head + my_off;
          arch::bulk_load(dst_stage + L::kKeyBytes + lane * rows * 4, sc, rows * 4, full + stage);
        }
      }
    }
    return;
  }

  if (warp == 4 * kSm90ConsumerWarpgroups) {
    // ---------------- producer: cp.async gather of key blocks and scales into the stage ring ----------------
    // Lane l resolves the source rows l, l+32, l+64, l+96 of a block (page lookup, 64-bit addresses of the
    // row and of its scale); the copy loop fetches each row's address with a shuffle, 8 lanes per row.
    const PageRow pr = page_row(p.pages, b);
    const PageDiv pd{p.k.page_size, a.page_shift};
    const char* kbase = static_cast<const char*>(p.k.data) + kh * p.k.stride_head;
    const float* sbase = p.k_scale + kh * p.ks_stride_head;
    const int64_t sp = p.k.stride_page, st = p.k.stride_token;
    const int c = lane & 7, sub = lane >> 3;
    for (int it = 0; it < ncomp; ++it) {
      const int stage = it % S;
      const int64_t key0 = static_cast<int64_t>(blk_begin + it) * kBlock;
      unsigned long long row_addr[kBlock / 32];
      const float* scale_src[kBlock / 32];
#pragma unroll
      for (int q = 0; q < kBlock / 32; ++q) {
        const int64_t j = key0 + lane + 32 * q;
        int64_t lp;
        int off;
        pd.split(j, &lp, &off);
        const int pg = j < hi_last ? page_of(pr, lp, p.pages.num_pages) : -1;
        row_addr[q] = pg >= 0 ? reinterpret_cast<unsigned long long>(kbase + pg * sp + off * st) : 0ull;
        scale_src[q] = pg >= 0 ? sbase + pg * p.ks_stride_page + off * p.ks_stride_token : nullptr;
      }
      if (it >= S) arch::mbarrier_wait(empty + stage, ((it / S) - 1) & 1);
      const uint32_t dst_stage = k_s + stage * L::kStageBytes;
#pragma unroll
      for (int q = 0; q < kBlock / 32; ++q)
        arch::cp_async_4(dst_stage + L::kKeyBytes + (lane + 32 * q) * 4, scale_src[q] ? scale_src[q] : p.k_scale,
                         scale_src[q] ? 4 : 0);
#pragma unroll
      for (int m = 0; m < kBlock / 4; ++m) {
        const int r = 4 * m + sub;
        const unsigned long long ad = __shfl_sync(kFullMask, row_addr[m / 8], r & 31);
        const char* src = ad ? reinterpret_cast<const char*>(ad) + c * 16 : kbase;
        arch::cp_async_16(dst_stage + r * 128 + ((c ^ (r & 7)) << 4), src, ad ? 16 : 0);
      }
      arch::cp_async_commit();
      // Block it-1 is signalled once block it is in flight (as in scores_sm90.cuh).
      if (it > 0) {
        arch::cp_async_wait<1>();
        arch::fence_proxy_async();
        arch::mbarrier_arrive(full + (it - 1) % S);
      }
    }
    arch::cp_async_wait_all();
    arch::fence_proxy_async();
    arch::mbarrier_arrive(full + (ncomp - 1) % S);
    return;
  }

  // ---------------- consumers ----------------
  const int wg = warp >> 2, wi = warp & 3, tid = threadIdx.x & 127;
  const int rows = tile_tokens * G;
  {
    // This warpgroup's 64 query rows -> e4m3 in shared memory: thread pair (2r, 2r + 1) holds row r's
    // halves (64 elements each), finds the row's amax and writes 4 swizzled 16-byte chunks each.
    const int r = tid >> 1, half = tid & 1, row = 64 * wg + r;
    const int i = row / G, j = row % G;
    const bool valid = row < rows && i < ntok;
    const QT* src = static_cast<const QT*>(p.q) +
                    (valid ? (tok_base + i) * p.q_stride_token + (kh * G + j) * p.q_stride_head + 64 * half : 0);
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = valid ? arch::ld_global_nc_v4(src + 8 * u) : make_uint4(0, 0, 0, 0);
    float amax = 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) amax = fmaxf(amax, chunk_amax<QT>(v[u]));
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
    // amax -> 448; rows below 2^-100 (zero rows included) keep a finite scale. The quotient is correctly
    // rounded whatever the build's division flags, so that a model (tests/python/msa_testing.py,
    // fp8_mma_queries) can reproduce it: bf16 rows put ~0.5% of their elements (a quarter of unit-normal
    // rows hold one) exactly on an e4m3 rounding tie, where one ulp of the scale moves the element a whole
    // e4m3 step and a block score by up to ~1.5.
    const float amax_c = fmaxf(amax, 0x1p-100f);
    const float scale = __fdiv_rn(448.f, amax_c);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint32_t w[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4& x = v[2 * u + h];
        const float2 f0 = to_float2<QT>(x.x), f1 = to_float2<QT>(x.y), f2 = to_float2<QT>(x.z),
                     f3 = to_float2<QT>(x.w);
        w[2 * h] = arch::f32x4_to_e4m3x4(f0.x * scale, f0.y * scale, f1.x * scale, f1.y * scale);
        w[2 * h + 1] = arch::f32x4_to_e4m3x4(f2.x * scale, f2.y * scale, f3.x * scale, f3.y * scale);
      }
      const int chunk = 4 * half + u;
      st_shared_v4(q_s + row * 128 + ((chunk ^ (row & 7)) << 4), make_uint4(w[0], w[1], w[2], w[3]));
    }
    if (half == 0) arch::st_shared_b32(qinv_s + 4 * row, __float_as_uint(amax_c * (1.f / 448.f)));
    arch::fence_proxy_async();  // generic stores before the wgmma (async proxy) reads them
    arch::named_barrier_sync(1 + wg, 128);
  }

  // Accumulator rows of this thread: r_lo (values 4j, 4j+1) and r_lo + 8 (4j+2, 4j+3).
  const int first_end = range_relative_end(hi_first, blk_begin);  // the tile's first row's
  int hi[2];                                                        // range_relative_end
  float* outp[2];
  float qinv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 64 * wg + 16 * wi + (lane >> 2) + 8 * h;
    const int i = row / G, j = row % G;
    const bool valid = row < rows && i < ntok;
    hi[h] = valid ? range_relative_end(visible_end(rq, rq.offset + tok0 + i, p.causal), blk_begin) : 0;
    outp[h] = valid ? p.out + (tok_base + i) * p.out_stride_token + (kh * G + j) * p.out_stride_head : nullptr;
    qinv[h] = arch::ld_shared_f32(qinv_s + 4 * row);
  }
  const uint64_t desc_q = arch::smem_desc_kmajor_sw128(q_s + 64 * wg * 128);
  const bool blocks_contiguous = p.out_stride_block == 1;  // THK: a row's blocks are adjacent in out
  const int t2 = 2 * (lane & 3);
  float acc[64];
  float keep[2] = {-INFINITY, -INFINITY};
  for (int it = 0; it < ncomp; ++it) {
    const int stage = it % S;
    const int blk = blk_begin + it;
    arch::mbarrier_wait(full + stage, (it / S) & 1);
    const uint32_t stage_addr = k_s + stage * L::kStageBytes;
    const uint64_t desc_k = arch::smem_desc_kmajor_sw128(stage_addr);
    arch::fence_regs(acc);
    arch::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kHeadDim / 32; ++k)
      arch::wgmma_m64n128k32_ss_e4m3(acc, desc_q + 2 * k, desc_k + 2 * k, k > 0);  // + 32 bytes of K per step
    arch::wgmma_commit();
    // The scales of this thread's columns 8j + t2, 8j + t2 + 1 (they live in the stage): the first two pairs
    // are read while the products run.
    const uint32_t scales = stage_addr + L::kKeyBytes + 4 * t2;
    const float2 sc0 = ld_shared_f32x2(scales), sc1 = ld_shared_f32x2(scales + 32);
    arch::wgmma_wait<0>();
    arch::fence_regs(acc);

    // Row max over the block's 128 keys of the products times their key's scale (the query's inverse scale
    // is positive: it multiplies the max). Each scaled product goes straight into the max, so the
    // accumulator's registers free up as the loop runs and the next scales' loads go ahead of their use
    // (scaled in place first, every load waited on its own: a quarter of the consumers' stall samples).
    // Off the diagonal: 64 FMUL + 64 FMNMX per thread; on it, a 32-bit limit per row.
    float mx[2][4];
    auto scaled_max = [&](auto masked, const int (&lim)[2]) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 sc = j == 0 ? sc0 : j == 1 ? sc1 : ld_shared_f32x2(scales + 32 * j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v0 = acc[4 * j + 2 * h] * sc.x, v1 = acc[4 * j + 2 * h + 1] * sc.y;
          if constexpr (decltype(masked)::value) {
            v0 = 8 * j < lim[h] ? v0 : -INFINITY;
            v1 = 8 * j + 1 < lim[h] ? v1 : -INFINITY;
          }
          const float v = fmaxf(v0, v1);
          mx[h][j & 3] = j < 4 ? v : fmaxf(mx[h][j & 3], v);
        }
      }
    };
    if ((it + 1) * kBlock <= first_end) {
      scaled_max(std::false_type{}, {kBlock, kBlock});
    } else {
      const int col0 = it * kBlock + t2;
      int lim[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) lim[h] = min(max(hi[h] - col0, 0), kBlock);
      scaled_max(std::true_type{}, lim);
    }
    arch::mbarrier_arrive(empty + stage);  // the scales are read
    float m[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      m[h] = warp_max_xor(fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3])), 1, 2) * qinv[h];
    if (blocks_contiguous) {
      // Quad lane q keeps block 4k + q of each group of 4, then the quad writes the group as one
      // 16-byte run per row instead of four scattered words.
      const int slot4 = it & 3;
      if ((lane & 3) == slot4) keep[0] = m[0], keep[1] = m[1];
      if (slot4 == 3 || it == ncomp - 1) {
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
  __trap();  // built without sm_90a: sm90_fp8_scores_available() keeps the dispatcher away
#endif
}

}  // namespace msa::detail::cuda::indexer
