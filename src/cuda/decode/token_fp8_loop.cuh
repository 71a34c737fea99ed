// The single-token kernel's tile loop for fp8 e4m3 K/V: every warp an independent pipeline.
//
// The 16-bit loop splits a 64-key tile 16 keys apiece for S = Q K^T and 32 head dims apiece for O += P V, so
// each tile costs three CTA barriers (the tile landed, the row maxima, the row sums and P). With fp8 K/V a tile
// is half the bytes and the stream of tiles twice as fast, and that chain, not the memory, set the pace: 0.75
// of the copy ceiling at M3-TP1 D-B64 with 1.9 active warps per scheduler, the issue slots 39% busy.
// Here warp w owns keys 16w .. 16w + 15 of every tile for both products, with its own softmax state:
//  * it copies its own 16 K and 16 V rows (cp.async), so a tile needs a warp barrier only;
//  * S (16 heads x its 16 keys) stays in registers and becomes P V's A operand directly (the key order of S's
//    columns is the k order of P V's rows);
//  * P V sums over its 16 keys for all 128 dims (16 n-tiles). Both products sum in any order, so V's dims take
//    a permuted order as K's do: n-tile j, column c is dim 16c + j, and thread (g, t) needs bytes
//    [16g, 16g + 16) of V rows 2t, 2t + 1, 2t + 8, 2t + 9: four 16-byte loads, byte pairs of two rows joined by
//    PRMT and widened by one e4m3 -> fp16 instruction per pair (below sm_89 code: one PRMT and a bit move per
//    pair, and the NaN encoding looked for once per tile, arch/fp8.cuh). V never goes through a converted copy.
//  * a row's softmax base moves only when a new maximum passes it by more than kTokenFp8RescaleSlack (2^8 in
//    p, as FlashAttention-3 does): P then lies in [0, 2^8], exact enough in fp16, and the rescale of the 64
//    accumulators per thread is skipped by the whole warp on most tiles.
// After the last tile the four warps' weighted states meet in shared memory, where each thread sums and normalizes
// 16 contiguous dims of one row (token_fp8_row_run) that it stores (unsplit) or sends to the row's owner (the push
// merge). The pull merge reads them back into the 16-bit loop's register layout (o[n] = dims 32w + 8n + 2t + {0, 1},
// token_fp8_merged_fragments) and shares its code with it.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/arch/fast_math.cuh"
#include "cuda/arch/fp8.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/decode/fp8_tile.cuh"
#include "cuda/decode/merge_math.cuh"
#include "cuda/decode/token_config.h"
#include "cuda/decode/token_logits.cuh"

namespace msa::detail::cuda::decode {

// The merge buffer: per warp 16 rows of 128 floats, the 16-byte chunk c of row r at chunk position
// token_fp8_merge_chunk(r, c) (token_config.h, where its bank-conflict-free phases are listed).
constexpr int kTokenFp8WarpFloats = kTokenRows * kTokenHeadDim;  // one warp's rows in the merge buffer
static_assert(4 * kTokenFp8WarpFloats * 4 <= kTokenStagesFp8 * 2 * kTokenTileKeys * kTokenHeadDim,
              "the warps' states fit the ring");

constexpr float kTokenFp8RescaleSlack = 8.f;  // log2 of P's bound

// This warp's rows of a tile into an fp8 stage: K rows 16w + lane / 8 + 4i (i < 4) at the stage's start, V
// rows at +8 KB, 128 bytes each with chunk c of row r at (c ^ (r % 8)) * 16; this lane moves chunk lane % 8
// of each. Rows past the tile's visible keys are zero-filled (nothing read): P = 0 meets V = 0 there. Per lane
// the row offsets are fixed, so a tile costs a 64-bit add per row.
struct Fp8TileCopy {
  const uint8_t* k;  // this lane's chunk of its first row, tile offsets to be added
  const uint8_t* v;
  int64_t k_step, v_step;  // 4 rows
  uint32_t ring;           // the ring's shared address
  uint32_t dst;            // ring + the offset of this lane's first K chunk in a stage
  int row;                 // this lane's first row in the tile
  __device__ __forceinline__ Fp8TileCopy(const void* kg, const void* vg, int64_t k_stride_token, int64_t v_stride_token,
                                         uint32_t stages) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = lane & 7;
    row = warp * 16 + (lane >> 3);
    k = static_cast<const uint8_t*>(kg) + row * k_stride_token + c * 16;
    v = static_cast<const uint8_t*>(vg) + row * v_stride_token + c * 16;
    k_step = 4 * k_stride_token, v_step = 4 * v_stride_token;
    ring = stages;
    dst = stages + row * kTokenHeadDim + ((c ^ (row & 7)) << 4);
  }
  // Tile x (when x < n_tiles) into ring stage `stage`; one commit always (the wait counts stay uniform).
  __device__ __forceinline__ void operator()(const TokenTile* tiles, int n_tiles, int x, int stage) const {
    if (x < n_tiles) {
      const TokenTile t = tiles[x];
      const uint32_t st = dst + stage * (2 * kTokenTileKeys * kTokenHeadDim);
      const uint8_t* kr = k + t.k_off;
      const uint8_t* vr = v + t.v_off;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool fill = row + 4 * i < t.visible;  // else zeros, and the source is not read (ignore-src)
        // Row + 4 has swizzle (row % 8) ^ 4 (row % 8 < 4): bit 6 of the chunk offset flips on odd i.
        const uint32_t at = (st ^ ((i & 1) << 6)) + i * 4 * kTokenHeadDim;
        arch::cp_async_16_pred(at, kr, fill);
        arch::cp_async_16_pred(at + kTokenTileKeys * kTokenHeadDim, vr, fill);
        kr += k_step, vr += v_step;
      }
    }
    arch::cp_async_commit();
  }
};

// V's B fragments of n-tiles 4u .. 4u + 3 from word u of the two row pairs' chunks (rows a0, a1 -> b0; rows
// c0, c1 -> b1): f16x2 word (byte i of row a0, byte i of row a1) is n-tile 4u + i's, widened (values /
// e4m3_f16_unscale()) without the NaN step below sm_89 code (the caller checks the tile's words at once). sm_89+:
// the bytes of two rows joined (PRMT), one instruction per pair; below, the bit move's own PRMT takes its two
// bytes from the two rows.
__device__ __forceinline__ void v_fragments_fp8_unchecked(uint32_t a0, uint32_t a1, uint32_t c0, uint32_t c1,
                                                          uint2 (&b0)[2], uint2 (&b1)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  b0[0] = arch::e4m3x4_to_f16x4_unchecked(__byte_perm(a0, a1, 0x5140));  // n-tiles 4u, 4u + 1
  b0[1] = arch::e4m3x4_to_f16x4_unchecked(__byte_perm(a0, a1, 0x7362));  // 4u + 2, 4u + 3
  b1[0] = arch::e4m3x4_to_f16x4_unchecked(__byte_perm(c0, c1, 0x5140));
  b1[1] = arch::e4m3x4_to_f16x4_unchecked(__byte_perm(c0, c1, 0x7362));
#else
  using arch::e4m3x2_to_f16x2_unchecked;
  b0[0] = make_uint2(e4m3x2_to_f16x2_unchecked<0, 4>(a0, a1), e4m3x2_to_f16x2_unchecked<1, 5>(a0, a1));
  b0[1] = make_uint2(e4m3x2_to_f16x2_unchecked<2, 6>(a0, a1), e4m3x2_to_f16x2_unchecked<3, 7>(a0, a1));
  b1[0] = make_uint2(e4m3x2_to_f16x2_unchecked<0, 4>(c0, c1), e4m3x2_to_f16x2_unchecked<1, 5>(c0, c1));
  b1[1] = make_uint2(e4m3x2_to_f16x2_unchecked<2, 6>(c0, c1), e4m3x2_to_f16x2_unchecked<3, 7>(c0, c1));
#endif
}

// Row r's maximum m over the four warps' (red_max), its softmax base (0 while m is -inf) and its sum l of the
// warps' sums (red_sum) rescaled to that base: the loop's merge and the row runs form them alike (the same bits).
struct Fp8RowState {
  float m, base, l;
};
__device__ __forceinline__ Fp8RowState token_fp8_row_state(const float* red_max, const float* red_sum, int r) {
  Fp8RowState st{-INFINITY, 0.f, 0.f};
#pragma unroll
  for (int w = 0; w < 4; ++w) st.m = fmaxf(st.m, red_max[w * 16 + r]);
  st.base = st.m == -INFINITY ? 0.f : st.m;
#pragma unroll
  for (int w = 0; w < 4; ++w) st.l = fmaf(arch::exp2_approx(red_max[w * 16 + r] - st.base), red_sum[w * 16 + r], st.l);
  return st;
}

// The tile loop over the ring that `copy` fills: `stages` (the plan's: kTokenStagesFp8, kTokenStagesFp8AlonePerSm
// or kTokenStagesFp8Shallow) of its stages of 64 K rows then 64 V rows, the first stages - 1 tiles already issued;
// qa / logit_scale: Q's fragments in the permuted dim order and the rows' logit scales (exp2 domain). Leaves each
// warp's o weighted to the CTA's maximum in merge_buf (in the ring's bytes; unnormalized, V in raw fp16 units),
// every warp's maxima and sums in red_max / red_sum, and m_run, l_run of rows g and g + 8. Ends with every warp
// past a CTA barrier.
__device__ __forceinline__ void token_tile_loop_fp8(const Fp8TileCopy& copy, const TokenTile* tiles, int n_tiles,
                                                    float* merge_buf, float* red_max, float* red_sum,
                                                    const uint32_t (&qa)[8][4], const float (&logit_scale)[2],
                                                    float (&m_run)[2], float (&l_run)[2], int stages) {
  constexpr uint32_t kRowBytes = kTokenHeadDim;  // one fp8 row
  constexpr uint32_t kStageBytes = 2 * kTokenTileKeys * kRowBytes;
  constexpr unsigned kFull = 0xffffffffu;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  float mw[2] = {-INFINITY, -INFINITY}, lw[2] = {0.f, 0.f};  // lw: this thread's 4 keys of each row
  float ow[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) ow[j][0] = ow[j][1] = ow[j][2] = ow[j][3] = 0.f;
  // This thread's shared-memory offsets in a stage: K rows kr (n-tile 0) and kr + 8 (n-tile 1), kr = 16w + g,
  // chunks 2t and 2t + 1 (load_k_row_fp8's); V rows vr, vr + 1 (k 2t, 2t + 1), vr + 8, vr + 9, vr = 16w + 2t,
  // chunk g. A row 8 further has the same swizzle: +1 KB.
  const int kr = warp * 16 + g, vr = warp * 16 + 2 * t;
  const uint32_t k_at0 = kr * kRowBytes + (((2 * t) ^ (kr & 7)) << 4);
  const uint32_t k_at1 = kr * kRowBytes + (((2 * t + 1) ^ (kr & 7)) << 4);
  const uint32_t v_at0 = kTokenTileKeys * kRowBytes + vr * kRowBytes + ((g ^ (vr & 7)) << 4);
  const uint32_t v_at1 = kTokenTileKeys * kRowBytes + (vr + 1) * kRowBytes + ((g ^ ((vr + 1) & 7)) << 4);
  int stage = 0, issue_stage = stages - 1;
  for (int x = 0; x < n_tiles; ++x) {
    // At most stages - 2 groups newer than tile x's may stay pending.
    if (stages == kTokenStagesFp8)
      arch::cp_async_wait<kTokenStagesFp8 - 2>();
    else if (stages == kTokenStagesFp8AlonePerSm)
      arch::cp_async_wait<kTokenStagesFp8AlonePerSm - 2>();
    else
      arch::cp_async_wait<kTokenStagesFp8Shallow - 2>();
    __syncwarp();  // this warp's rows of tile x landed (every lane's copies); its reads of tile x - 1 are done
    copy(tiles, n_tiles, x + stages - 1, issue_stage);
    issue_stage = issue_stage == stages - 1 ? 0 : issue_stage + 1;
    const uint32_t st = copy.ring + stage * kStageBytes;
    stage = stage == stages - 1 ? 0 : stage + 1;
    const int visible = tiles[x].visible;
    // Every shared load first (volatile asm keeps program order).
    const KRowFp8 k0 = {{arch::ld_shared_v4(st + k_at0), arch::ld_shared_v4(st + k_at1)}};
    const KRowFp8 k1 = {
        {arch::ld_shared_v4(st + k_at0 + 8 * kRowBytes), arch::ld_shared_v4(st + k_at1 + 8 * kRowBytes)}};
    const uint4 v[4] = {arch::ld_shared_v4(st + v_at0), arch::ld_shared_v4(st + v_at1),
                        arch::ld_shared_v4(st + v_at0 + 8 * kRowBytes), arch::ld_shared_v4(st + v_at1 + 8 * kRowBytes)};
    // K's fragments widened, then checked for the NaN encoding at once (below sm_89 code: one HMNMX2 per
    // word; the fix runs only in a tile that holds a NaN byte).
    uint2 kb[8][2];
    uint32_t kmax[2] = {0u, 0u};
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      kb[kk][0] = k_fragment_fp8_unchecked(k0, kk), kb[kk][1] = k_fragment_fp8_unchecked(k1, kk);
      kmax[kk & 1] = arch::e4m3_raw_abs_max(arch::e4m3_raw_abs_max(kmax[kk & 1], kb[kk][0].x), kb[kk][0].y);
      kmax[kk & 1] = arch::e4m3_raw_abs_max(arch::e4m3_raw_abs_max(kmax[kk & 1], kb[kk][1].x), kb[kk][1].y);
    }
    if (arch::e4m3_raw_has_nan(arch::e4m3_raw_abs_max(kmax[0], kmax[1]))) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int n = 0; n < 2; ++n)
          kb[kk][n] = make_uint2(arch::e4m3_raw_nan_fix(kb[kk][n].x), arch::e4m3_raw_nan_fix(kb[kk][n].y));
    }
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      arch::mma_m16n8k16<__half>(s[0], qa[kk], kb[kk][0].x, kb[kk][0].y);
      arch::mma_m16n8k16<__half>(s[1], qa[kk], kb[kk][1].x, kb[kk][1].y);
    }
    // Logits in the exp2 domain, keys past `visible` -inf; this warp's row maxima (the row's 4 threads).
    float mx[2];
    scale_logits_row_max(s, warp, lane, visible, logit_scale, mx);
    // The base moves (for the warp's rows together) only when a maximum passes it by more than the slack.
    if (__any_sync(kFull, mx[0] > mw[0] + kTokenFp8RescaleSlack || mx[1] > mw[1] + kTokenFp8RescaleSlack)) {
      float alpha[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float m = fmaxf(mw[j], mx[j]);
        alpha[j] = arch::exp2_approx(mw[j] - (m == -INFINITY ? 0.f : m));
        mw[j] = m;
        lw[j] *= alpha[j];
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        ow[j][0] *= alpha[0], ow[j][1] *= alpha[0];
        ow[j][2] *= alpha[1], ow[j][3] *= alpha[1];
      }
    }
    float base[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) base[j] = mw[j] == -INFINITY ? 0.f : mw[j];  // a row that has seen nothing: p = 0
    uint32_t pa[4];  // P as P V's A operand: k 2t, 2t + 1 from n-tile 0, k 2t + 8, 2t + 9 from n-tile 1
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const float p0 = arch::exp2_approx(s[n][0] - base[0]), p1 = arch::exp2_approx(s[n][1] - base[0]);
      const float p2 = arch::exp2_approx(s[n][2] - base[1]), p3 = arch::exp2_approx(s[n][3] - base[1]);
      lw[0] += p0 + p1;
      lw[1] += p2 + p3;
      pa[2 * n] = arch::pack2<__half>(p0, p1);
      pa[2 * n + 1] = arch::pack2<__half>(p2, p3);
    }
    const auto word = [](const uint4& c, int u) { return u == 0 ? c.x : u == 1 ? c.y : u == 2 ? c.z : c.w; };
    uint2 vb[4][2][2];  // word u's fragments: rows a -> [0], rows c -> [1]
    uint32_t vmax[2] = {0u, 0u};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      v_fragments_fp8_unchecked(word(v[0], u), word(v[1], u), word(v[2], u), word(v[3], u), vb[u][0], vb[u][1]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          vmax[h] = arch::e4m3_raw_abs_max(arch::e4m3_raw_abs_max(vmax[h], vb[u][h][i].x), vb[u][h][i].y);
    }
    if (arch::e4m3_raw_has_nan(arch::e4m3_raw_abs_max(vmax[0], vmax[1]))) {
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            vb[u][h][i] = make_uint2(arch::e4m3_raw_nan_fix(vb[u][h][i].x), arch::e4m3_raw_nan_fix(vb[u][h][i].y));
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      arch::mma_m16n8k16<__half>(ow[4 * u], pa, vb[u][0][0].x, vb[u][1][0].x);
      arch::mma_m16n8k16<__half>(ow[4 * u + 1], pa, vb[u][0][0].y, vb[u][1][0].y);
      arch::mma_m16n8k16<__half>(ow[4 * u + 2], pa, vb[u][0][1].x, vb[u][1][1].x);
      arch::mma_m16n8k16<__half>(ow[4 * u + 3], pa, vb[u][0][1].y, vb[u][1][1].y);
    }
  }

  // ---- the four warps' states merged: m = max of the warps', each warp's o and l weighted by 2^(m_w - m) ----
  arch::cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    lw[j] += __shfl_xor_sync(kFull, lw[j], 1);
    lw[j] += __shfl_xor_sync(kFull, lw[j], 2);
  }
  if (t == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) red_max[warp * 16 + g + 8 * j] = mw[j], red_sum[warp * 16 + g + 8 * j] = lw[j];
  }
  __syncthreads();  // every warp is done with the ring; the maxima and sums are in
  float wt[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const Fp8RowState st = token_fp8_row_state(red_max, red_sum, g + 8 * j);
    wt[j] = arch::exp2_approx(mw[j] - st.base);
    m_run[j] = st.m;
    l_run[j] = st.l;
  }
  float* mine = merge_buf + warp * kTokenFp8WarpFloats;
#pragma unroll
  for (int j = 0; j < 2; ++j) {  // row g + 8j: dims 32t + 16h + 4q + i are ow[4q + i][2j + h]
    const int r = g + 8 * j;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int e = 2 * j + h;
        *reinterpret_cast<float4*>(mine + r * kTokenHeadDim + 4 * token_fp8_merge_chunk(r, 8 * t + 4 * h + q)) =
            make_float4(ow[4 * q][e] * wt[j], ow[4 * q + 1][e] * wt[j], ow[4 * q + 2][e] * wt[j],
                        ow[4 * q + 3][e] * wt[j]);
      }
  }
  __syncthreads();
}

// The merged state in the 16-bit loop's register layout (a split's rows go on to the split merges).
__device__ __forceinline__ void token_fp8_merged_fragments(const float* merge_buf, float (&o)[4][4]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // dims 32w + 8n + 2t + {0, 1} of row g + 8j: half t % 2 of chunk 8w + 2n + t / 2
      const int r = g + 8 * j;
      const int at = r * kTokenHeadDim + 4 * token_fp8_merge_chunk(r, 8 * warp + 2 * n + (t >> 1)) + 2 * (t & 1);
      float2 acc = make_float2(0.f, 0.f);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 v = *reinterpret_cast<const float2*>(merge_buf + w * kTokenFp8WarpFloats + at);
        acc.x += v.x, acc.y += v.y;
      }
      o[n][2 * j] = acc.x, o[n][2 * j + 1] = acc.y;
    }
}

// Thread i's share of the CTA's output rows: dims 16c .. 16c + 15 (c = i % 8) of row r = i / 8, summed over the
// four warps and normalized into v; returns the row's lse. A row whose sum is not positive (no key seen, or a NaN
// met) gets v = o x 0 (a NaN of the cache stays in o, as in the fragment path), or with kZeroUnseen exact zeros
// (what the push merge sends: its merge must not see a NaN of such a row). The row's maximum and sum are formed
// again (token_fp8_row_state, as the loop formed m_run / l_run);
// out_scale: V's dequantization and widening factors. An unsplit CTA stores v as two 16-byte runs, a split sends
// it to the row's owner as four 16-byte st.async (token_kernel.cuh): against the fragment layout's 32 eight-byte
// loads, 8 four-byte stores or 8 eight-byte sends per thread.
template <bool kZeroUnseen>
__device__ __forceinline__ float token_fp8_row_run(const float* merge_buf, const float* red_max, const float* red_sum,
                                                   float out_scale, float (&v)[16]) {
  const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
  const Fp8RowState st = token_fp8_row_state(red_max, red_sum, r);
  const bool seen = st.l > 0.f;
  const float inv = row_out_scale(st.l, out_scale);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int at = r * kTokenHeadDim + 4 * token_fp8_merge_chunk(r, 4 * c + k);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(merge_buf + w * kTokenFp8WarpFloats + at);
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
    const bool zero = kZeroUnseen && !seen;
    v[4 * k] = zero ? 0.f : acc.x * inv;
    v[4 * k + 1] = zero ? 0.f : acc.y * inv;
    v[4 * k + 2] = zero ? 0.f : acc.z * inv;
    v[4 * k + 3] = zero ? 0.f : acc.w * inv;
  }
  return row_lse(st.m, st.l);
}

}  // namespace msa::detail::cuda::decode
