// Decode block scores: stream every request's index keys once at the copy ceiling.
//
// Grid (request, chunk of kStreamBlocksPerCta blocks, index-K head x head chunk); each warp scores whole
// 128-key blocks. Keys are the M dimension of mma.sync m16n8k16 (S^T = K Q^T) and up to 8 (token, head)
// columns are its N, so each thread loads its A fragments straight from global memory with 16-byte loads:
// thread (g = lane/4, t = lane%4) owns key rows g and g+8 of a 16-key tile. The reduction over D may be
// permuted freely as long as K and Q agree, so thread t takes whole 8-element chunks of D (chunk_of below),
// which makes every load instruction read 64 contiguous bytes of 8 rows (full 32-byte sectors) and leaves
// no shared memory or shuffles on the load path. The block max is a register max over the tile rows and a
// 3-step shuffle over g. Masks: keys >= the column's visible end get -inf before the max.
#pragma once

#include <type_traits>

#include "cuda/arch/memory.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/indexer/device.cuh"

namespace msa::detail::cuda::indexer {

struct Fp8Tag {};  // index K stored as fp8 e4m3 with a per-token fp32 scale

template <typename QT, typename KT>
struct StreamTraits {
  static constexpr bool kF8 = std::is_same_v<KT, Fp8Tag>;
  // The mma's operand type: fp16 for fp8 keys (converted exactly) and for fp16 queries, else bf16.
  using MmaT = std::conditional_t<kF8 || std::is_same_v<QT, __half>, __half, __nv_bfloat16>;
  static constexpr int kElemBytes = kF8 ? 1 : 2;
  static constexpr int kLoadsPerRow = kF8 ? 2 : 4;  // 16-byte loads of one key row per thread (row/4)
  static constexpr int kTilesPerStep = kStreamStepBytes / (2 * kLoadsPerRow * 16);
  static_assert((kBlock / 16) % kTilesPerStep == 0);

  // The 8-element chunk of D that thread t feeds to chunk-step s (s = 0..3). bf16: chunks t, t+4, t+8,
  // t+12, one 16-byte load each. fp8: one 16-byte load holds chunks 2t, 2t+1 (and 8+2t, 9+2t).
  static __device__ __forceinline__ int chunk_of(int t, int s) {
    if constexpr (kF8)
      return 8 * (s >> 1) + 2 * t + (s & 1);
    else
      return t + 4 * s;
  }
  // Byte offset in the key row of thread t's u-th 16-byte load.
  static __device__ __forceinline__ int load_offset(int t, int u) {
    if constexpr (kF8)
      return 64 * u + 16 * t;
    else
      return 16 * (t + 4 * u);
  }
};

template <typename QT, typename KT>
__global__ void __launch_bounds__(kStreamWarps * 32, kStreamMinCtasPerSm)
    scores_stream_kernel(const BlockScoresParams p, int head_chunks, int page_shift) {
  using Tr = StreamTraits<QT, KT>;
  constexpr int kTps = Tr::kTilesPerStep;
  constexpr int kLpr = Tr::kLoadsPerRow;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int b = blockIdx.x;
  const int blk_first = blockIdx.y * kStreamBlocksPerCta;
  const int kh = blockIdx.z / head_chunks, hc = blockIdx.z % head_chunks;
  const int G = p.num_heads / p.k.num_heads;
  // Columns n = 0..7 of a pass: token n / geff of the pass, head n % geff of this head chunk.
  const int geff = G > kStreamCols ? min(kStreamCols, G - hc * kStreamCols) : G;
  const int mt = G >= kStreamCols ? 1 : kStreamCols / G;  // tokens per pass

  const Request rq = load_request(p.seqs, b);
  if (rq.q_len == 0) return;
  const PageRow pr = page_row(p.pages, b);
  const PageDiv pd{p.k.page_size, page_shift};
  const char* kbase = static_cast<const char*>(p.k.data) + kh * p.k.stride_head * Tr::kElemBytes;
  const int64_t sp_bytes = p.k.stride_page * Tr::kElemBytes, st_bytes = p.k.stride_token * Tr::kElemBytes;
  const int64_t npass = (rq.q_len + mt - 1) / mt;

  for (int64_t pass = 0; pass < npass; ++pass) {
    auto col_token = [&](int n) { return pass * mt + n / geff; };
    auto col_head = [&](int n) { return kh * G + hc * kStreamCols + n % geff; };
    auto col_valid = [&](int n) { return n < mt * geff && col_token(n) < rq.q_len; };

    // B fragments: this thread's chunks of column g's query row.
    uint4 qf[4];
    float inv_g = 1.f;
    {
      const bool valid = col_valid(g);
      const QT* qrow = static_cast<const QT*>(p.q) + (rq.q_begin + (valid ? col_token(g) : 0)) * p.q_stride_token +
                       col_head(g) * p.q_stride_head;
#pragma unroll
      for (int s = 0; s < 4; ++s)
        qf[s] = valid ? arch::ld_global_nc_v4(qrow + 8 * Tr::chunk_of(t, s)) : make_uint4(0, 0, 0, 0);
      if constexpr (Tr::kF8) {
        float amax = fmaxf(fmaxf(chunk_amax<QT>(qf[0]), chunk_amax<QT>(qf[1])),
                           fmaxf(chunk_amax<QT>(qf[2]), chunk_amax<QT>(qf[3])));
        amax = warp_max_xor(amax, 1, 2);  // the quad holds the whole row
        const int e = fp16_row_exponent(amax);
#pragma unroll
        for (int s = 0; s < 4; ++s) qf[s] = chunk_to_scaled_f16<QT>(qf[s], exp2_int(e));
        inv_g = exp2_int(-e) * arch::e4m3_f16_unscale();
      }
    }
    // Accumulator columns of this thread: 2t and 2t+1.
    int64_t hi[2];
    float* outp[2];
    float inv[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int n = 2 * t + c;
      const bool valid = col_valid(n);
      hi[c] = valid ? visible_end(rq, rq.offset + col_token(n), p.causal) : 0;
      outp[c] = valid ? p.out + (rq.q_begin + col_token(n)) * p.out_stride_token + col_head(n) * p.out_stride_head
                      : nullptr;
      inv[c] = __shfl_sync(kFullMask, inv_g, 4 * n);
    }
    const int64_t last_tok = min64((pass + 1) * mt, rq.q_len) - 1;
    const int64_t hi_pass = visible_end(rq, rq.offset + last_tok, p.causal);  // positions grow with tokens
    const int64_t nb_pass = min64((hi_pass + kBlock - 1) / kBlock, p.max_blocks);

    // Address of key j's row (nullptr: not loaded, reads as zeros).
    auto row_ptr = [&](int64_t j, const float** scale) -> const char* {
      if (j >= hi_pass) return nullptr;
      int64_t lp;
      int off;
      pd.split(j, &lp, &off);
      const int pg = page_of(pr, lp, p.pages.num_pages);
      if (pg < 0) return nullptr;
      if constexpr (Tr::kF8)
        *scale = p.k_scale + pg * p.ks_stride_page + kh * p.ks_stride_head + off * p.ks_stride_token;
      return kbase + pg * sp_bytes + off * st_bytes;
    };

    for (int i = 0; i < kStreamBlocksPerCta / kStreamWarps; ++i) {
      const int blk = blk_first + warp + i * kStreamWarps;
      if (blk >= p.max_blocks) break;
      float m0 = -INFINITY, m1 = -INFINITY;
      if (blk < nb_pass) {
        const int64_t key0 = static_cast<int64_t>(blk) * kBlock;
#pragma unroll
        for (int step = 0; step < kBlock / 16 / kTps; ++step) {
          uint4 ka[kTps][kLpr], kb[kTps][kLpr];
          float sa[kTps], sb[kTps];
#pragma unroll
          for (int tt = 0; tt < kTps; ++tt) {
            const int64_t ja = key0 + (step * kTps + tt) * 16 + g;
            const float* psa = nullptr;
            const float* psb = nullptr;
            const char* pa = row_ptr(ja, &psa);
            const char* pb = row_ptr(ja + 8, &psb);
#pragma unroll
            for (int u = 0; u < kLpr; ++u) {
              ka[tt][u] = pa ? arch::ld_global_stream_v4(pa + Tr::load_offset(t, u)) : make_uint4(0, 0, 0, 0);
              kb[tt][u] = pb ? arch::ld_global_stream_v4(pb + Tr::load_offset(t, u)) : make_uint4(0, 0, 0, 0);
            }
            if constexpr (Tr::kF8) {
              sa[tt] = psa ? __ldg(psa) : 0.f;
              sb[tt] = psb ? __ldg(psb) : 0.f;
            }
          }
#pragma unroll
          for (int tt = 0; tt < kTps; ++tt) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int s = 0; s < 4; ++s) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                uint32_t a0, a1, a2, a3;
                if constexpr (Tr::kF8) {
                  const uint2 xa = arch::e4m3x4_to_f16x4_raw(word(ka[tt][s >> 1], (s & 1) * 2 + e));
                  const uint2 xb = arch::e4m3x4_to_f16x4_raw(word(kb[tt][s >> 1], (s & 1) * 2 + e));
                  a0 = xa.x, a2 = xa.y, a1 = xb.x, a3 = xb.y;
                } else {
                  a0 = word(ka[tt][s], 2 * e), a2 = word(ka[tt][s], 2 * e + 1);
                  a1 = word(kb[tt][s], 2 * e), a3 = word(kb[tt][s], 2 * e + 1);
                }
                arch::mma_m16n8k16<typename Tr::MmaT>(acc, a0, a1, a2, a3, word(qf[s], 2 * e), word(qf[s], 2 * e + 1));
              }
            }
            if constexpr (Tr::kF8) {
              acc[0] *= sa[tt], acc[1] *= sa[tt], acc[2] *= sb[tt], acc[3] *= sb[tt];
            }
            const int64_t ja = key0 + (step * kTps + tt) * 16 + g;
            m0 = fmaxf(m0, fmaxf(ja < hi[0] ? acc[0] : -INFINITY, ja + 8 < hi[0] ? acc[2] : -INFINITY));
            m1 = fmaxf(m1, fmaxf(ja < hi[1] ? acc[1] : -INFINITY, ja + 8 < hi[1] ? acc[3] : -INFINITY));
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
  }
}

}  // namespace msa::detail::cuda::indexer
