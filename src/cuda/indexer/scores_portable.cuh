// Prefill block scores on any sm_80+ device (mma.sync); on sm_90 only where the sm_90a kernels do not take
// the call (MSA_INDEXER_PREFILL=portable: the exact path for fp8 keys).
//
// CTA = 4 warps, 64 (token, head) rows of one index-K head (16 per warp: the mma M), over a range of
// kPrefillRangeBlocks blocks (work items shaped as the sm_90a kernel's: token tile, range of blocks,
// index-K head; smaller tiles and ranges). Each block's 128 key rows are
// gathered from the paged cache with cp.async into a kPortableStages-deep ring; the query rows stay in
// registers as A fragments for the whole CTA. A warp walks the block in 16 n8 tiles (8 keys each): a key
// tile's B fragments are 16-byte (bf16) or 8-byte (fp8) shared loads of whole D chunks, since the order
// of the D reduction only has to agree between Q and K (chunk t + 4s for thread t, step s). XOR swizzles
// of the chunk index keep those loads and the cp.async stores free of bank conflicts. fp8 keys are
// converted to fp16 in registers (the query rows are rescaled to fp16 by a power of two per row) and the
// per-token scales multiply the accumulator columns before the max.
#pragma once

#include <type_traits>

#include "cuda/arch/sm80.cuh"
#include "cuda/indexer/device.cuh"
#include "cuda/indexer/scores_stream.cuh"  // Fp8Tag

namespace msa::detail::cuda::indexer {

template <typename QT, typename KT>
struct PortableTraits {
  static constexpr bool kF8 = std::is_same_v<KT, Fp8Tag>;
  // The mma's operand type: fp16 for fp8 keys (converted exactly) and for fp16 queries, else bf16.
  using MmaT = std::conditional_t<kF8 || std::is_same_v<QT, __half>, __half, __nv_bfloat16>;
  static constexpr int kRowBytes = kF8 ? 128 : 256;
  static constexpr int kKeyBytes = kBlock * kRowBytes;
  static constexpr int kStageBytes = kKeyBytes + (kF8 ? kBlock * 4 : 0);  // + per-token scales
  static constexpr int kSmemBytes = kPortableStages * kStageBytes;
  // Copy layout: 16-byte pieces per row, rows per pass of 128 threads.
  static constexpr int kPiecesPerRow = kRowBytes / 16;
  static constexpr int kRowsPerPass = 128 / kPiecesPerRow;
  // Swizzled byte offset of D chunk c (8 elements) in key row r. bf16: 16-byte chunks, odd rows XOR 4
  // (a quarter-warp reads rows 2i, 2i+1 x chunks 4s..4s+3). fp8: 8-byte chunks, XOR 4 * (r % 4) (a
  // half-warp reads rows 4i..4i+3 x chunks 4s..4s+3).
  static __device__ __forceinline__ uint32_t chunk_offset(int r, int c) {
    if constexpr (kF8)
      return r * kRowBytes + ((c ^ ((r & 3) << 2)) << 3);
    else
      return r * kRowBytes + ((c ^ ((r & 1) << 2)) << 4);
  }
};

template <typename QT, typename KT>
__global__ void __launch_bounds__(kPortableWarps * 32)
    scores_portable_kernel(const BlockScoresParams p, int tile_tokens, int page_shift) {
  using Tr = PortableTraits<QT, KT>;
  static_assert(kPortableWarps == 4, "the copy layout assumes 128 threads");
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int G = p.num_heads / p.k.num_heads, kh = blockIdx.z;
  const int64_t slot = gridDim.x - 1 - blockIdx.x;  // last tiles first: they have the most blocks
  int64_t tile = 0;
  const int b = slot_to_request(p.seqs, slot, tile_tokens, &tile);
  if (b < 0) return;
  const Request rq = load_request(p.seqs, b);
  const int64_t tok0 = tile * tile_tokens;
  if (tok0 >= rq.q_len) return;
  const int ntok = static_cast<int>(min64(tile_tokens, rq.q_len - tok0));
  const int64_t hi_first = visible_end(rq, rq.offset + tok0, p.causal);
  const int64_t hi_last = visible_end(rq, rq.offset + tok0 + ntok - 1, p.causal);
  const int blk_begin = blockIdx.y * kPrefillRangeBlocks;
  const int blk_end = static_cast<int>(min64(blk_begin + kPrefillRangeBlocks, p.max_blocks));
  const int nb_vis = static_cast<int>(min64((hi_last + kBlock - 1) / kBlock, p.max_blocks));
  const int ncomp = max(min(blk_end, nb_vis) - blk_begin, 0);
  const int64_t tok_base = rq.q_begin + tok0;
  const int rows = tile_tokens * G;

  {  // -inf where no row of the tile sees a key
    const int fill_begin = max(blk_begin, nb_vis);
    const int per_blk = ntok * G;
    const int total = (blk_end - fill_begin) * per_blk;
    for (int e = tid; e < total; e += kPortableWarps * 32) {
      const int i = e % ntok, j = (e / ntok) % G, blk = fill_begin + e / per_blk;
      p.out[(tok_base + i) * p.out_stride_token + (kh * G + j) * p.out_stride_head + blk * p.out_stride_block] =
          -INFINITY;
    }
  }
  if (ncomp == 0) return;

  // Query rows 16 * warp + g and + 8 as A fragments; chunk t + 4s of D for step s.
  uint4 qa[2][4];
  int64_t hi[2];
  float* outp[2];
  float inv[2] = {1.f, 1.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + g + 8 * h;
    const int i = row / G, j = row % G;
    const bool valid = row < rows && i < ntok;
    const QT* qrow = static_cast<const QT*>(p.q) + (valid ? (tok_base + i) * p.q_stride_token +
                                                                (kh * G + j) * p.q_stride_head
                                                          : 0);
#pragma unroll
    for (int s = 0; s < 4; ++s)
      qa[h][s] = valid ? arch::ld_global_nc_v4(qrow + 8 * (t + 4 * s)) : make_uint4(0, 0, 0, 0);
    hi[h] = valid ? visible_end(rq, rq.offset + tok0 + i, p.causal) : 0;
    outp[h] = valid ? p.out + (tok_base + i) * p.out_stride_token + (kh * G + j) * p.out_stride_head : nullptr;
    if constexpr (Tr::kF8) {
      float amax = fmaxf(fmaxf(chunk_amax<QT>(qa[h][0]), chunk_amax<QT>(qa[h][1])),
                         fmaxf(chunk_amax<QT>(qa[h][2]), chunk_amax<QT>(qa[h][3])));
      amax = warp_max_xor(amax, 1, 2);
      const int e = fp16_row_exponent(amax);
#pragma unroll
      for (int s = 0; s < 4; ++s) qa[h][s] = chunk_to_scaled_f16<QT>(qa[h][s], exp2_int(e));
      inv[h] = exp2_int(-e) * arch::e4m3_f16_unscale();
    }
  }

  // Block loader: lane l of warp w resolves the source row that lane (copy-loop source) l serves, then
  // each 16-byte piece fetches its row address with a shuffle.
  const PageRow pr = page_row(p.pages, b);
  const PageDiv pd{p.k.page_size, page_shift};
  const int esize = Tr::kF8 ? 1 : 2;
  const char* kbase = static_cast<const char*>(p.k.data) + kh * p.k.stride_head * esize;
  const int64_t sp = p.k.stride_page * esize, st = p.k.stride_token * esize;
  constexpr int kRowGroups = 128 / Tr::kRowsPerPass;  // copy passes over the block: 16 (bf16) or 8 (fp8)
  auto load_block = [&](int it) {
    const int stage = it % kPortableStages;
    uint8_t* dst = smem + stage * Tr::kStageBytes;
    const int64_t key0 = static_cast<int64_t>(blk_begin + it) * kBlock;
    // Rows of this warp: r = (rows per pass / 4) * warp + r_in + kRowsPerPass * m for the copy loop below.
    constexpr int kWarpRows = Tr::kRowsPerPass / 4;  // distinct rows per pass per warp: 2 or 4
    const int my_row = kWarpRows * warp + (lane % kWarpRows) + Tr::kRowsPerPass * (lane / kWarpRows);
    const int64_t j = key0 + my_row;
    int64_t lp;
    int off;
    pd.split(j, &lp, &off);
    const int pg = j < hi_last ? page_of(pr, lp, p.pages.num_pages) : -1;
    const unsigned long long my_addr =
        pg >= 0 ? reinterpret_cast<unsigned long long>(kbase + pg * sp + off * st) : 0ull;
    if constexpr (Tr::kF8) {
      float* scales = reinterpret_cast<float*>(dst + Tr::kKeyBytes);
      const float* src = pg >= 0 ? p.k_scale + pg * p.ks_stride_page + kh * p.ks_stride_head + off * p.ks_stride_token
                                 : p.k_scale;
      arch::cp_async_4(arch::smem_addr(scales + my_row), src, pg >= 0 ? 4 : 0);
    }
    const int piece = tid % Tr::kPiecesPerRow;
#pragma unroll
    for (int m = 0; m < kRowGroups; ++m) {
      const int r_in = (lane / Tr::kPiecesPerRow);  // row within this warp's pass rows
      const int r = kWarpRows * warp + r_in + Tr::kRowsPerPass * m;
      const unsigned long long a = __shfl_sync(kFullMask, my_addr, r_in + kWarpRows * m);
      const char* src = a ? reinterpret_cast<const char*>(a) + piece * 16 : kbase;
      // a 16-byte piece is one bf16 chunk, or fp8 chunks 2*piece and 2*piece+1 (kept adjacent by the swizzle)
      const uint32_t d = Tr::kF8 ? Tr::chunk_offset(r, 2 * piece) : Tr::chunk_offset(r, piece);
      arch::cp_async_16(arch::smem_addr(dst + d), src, a ? 16 : 0);
    }
  };

#pragma unroll
  for (int s = 0; s < kPortableStages - 1; ++s) {
    if (s < ncomp) load_block(s);
    arch::cp_async_commit();
  }
  for (int it = 0; it < ncomp; ++it) {
    arch::cp_async_wait<kPortableStages - 2>();
    __syncthreads();  // block `it` visible to all; the stage refilled below was read last iteration
    if (it + kPortableStages - 1 < ncomp) load_block(it + kPortableStages - 1);
    arch::cp_async_commit();

    const uint8_t* ks = smem + (it % kPortableStages) * Tr::kStageBytes;
    const int blk = blk_begin + it;
    const bool masked = static_cast<int64_t>(blk + 1) * kBlock > hi_first;
    float mx[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
#pragma unroll 4
    for (int nt = 0; nt < kBlock / 8; ++nt) {
      const int kr = 8 * nt + g;  // key row whose B fragment this thread holds
      uint4 kb[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if constexpr (Tr::kF8) {
          const uint2 raw = *reinterpret_cast<const uint2*>(ks + Tr::chunk_offset(kr, t + 4 * s));
          const uint2 lo = arch::e4m3x4_to_f16x4_raw(raw.x), hi4 = arch::e4m3x4_to_f16x4_raw(raw.y);
          kb[s] = make_uint4(lo.x, lo.y, hi4.x, hi4.y);
        } else {
          kb[s] = *reinterpret_cast<const uint4*>(ks + Tr::chunk_offset(kr, t + 4 * s));
        }
      }
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          arch::mma_m16n8k16<typename Tr::MmaT>(acc, word(qa[0][s], 2 * e), word(qa[1][s], 2 * e),
                                                word(qa[0][s], 2 * e + 1), word(qa[1][s], 2 * e + 1),
                                                word(kb[s], 2 * e), word(kb[s], 2 * e + 1));
      if constexpr (Tr::kF8) {
        const float2 sc = *reinterpret_cast<const float2*>(ks + Tr::kKeyBytes + (8 * nt + 2 * t) * 4);
        acc[0] *= sc.x, acc[1] *= sc.y, acc[2] *= sc.x, acc[3] *= sc.y;
      }
      const int64_t kc = static_cast<int64_t>(blk) * kBlock + 8 * nt + 2 * t;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v0 = masked && kc + e >= hi[0] ? -INFINITY : acc[e];
        const float v1 = masked && kc + e >= hi[1] ? -INFINITY : acc[2 + e];
        mx[0][e] = fmaxf(mx[0][e], v0);
        mx[1][e] = fmaxf(mx[1][e], v1);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m = warp_max_xor(fmaxf(mx[h][0], mx[h][1]), 1, 2);
      if ((lane & 3) == h && outp[h]) outp[h][blk * p.out_stride_block] = m * inv[h];
    }
  }
  arch::cp_async_wait_all();
}

}  // namespace msa::detail::cuda::indexer
