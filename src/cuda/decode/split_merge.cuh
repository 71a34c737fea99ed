// The fused split merge of the paged kernel: the CTA that finishes an item last merges the item's S
// partials (normalized fp32 o of ROWS rows and their lse, written by every split) in split order.
//
// Why it is staged through shared memory: the merge sits on the critical path of small batches
// (D-B1: 16 splits, one block each). Loading the partials with cp.async puts every split's part in
// flight at once, so the merge costs one L2 round trip for the lse values plus one per row chunk of
// o (the chunk that fits the free stage memory: 16 splits x 16 rows x 512 B = 128 KB at D-B1 fits
// in ~95 KB as 11 + 5 rows), instead of a chain of dependent loads per split and row. The first o
// chunk is issued together with the lse values, before the weights are known.
#pragma once

#include <cstdint>

#include "cuda/arch/sm80.cuh"
#include "cuda/arch/sm90_cluster.cuh"
#include "cuda/decode/config.cuh"
#include "cuda/decode/merge_math.cuh"

namespace msa::detail::cuda::decode {

// Weight of a part that holds no key (lse = -inf): skipped, never read. A real weight is in [0, 1]
// or NaN (a NaN lse propagates, as in the reference).
constexpr float kSkipPart = -1.f;

// Shared-memory bytes the merge needs for S splits with at least one row per chunk.
__host__ __device__ constexpr uint32_t merge_min_bytes(int splits, int rows, int d) {
  return static_cast<uint32_t>(splits) * rows * 4u + 2u * rows * 4u + 16u + static_cast<uint32_t>(splits) * d * 4u;
}

// Called by every thread of the last CTA after its acquire fence. part_o / part_lse point at the
// item's first split ([S][ROWS][D] and [S][ROWS]); smem holds cap bytes that nothing else uses now.
// real(r) says whether row r is a query row (not padding); emit(r, c, acc[8], lse) writes the
// merged 8 values of 16-byte chunk c of row r (and lse when c == 0).
template <int D, int ROWS, int THREADS, typename RealRow, typename Emit>
__device__ void merge_splits(const float* part_o, const float* part_lse, int S, unsigned char* smem, uint32_t cap,
                             const RealRow& real, const Emit& emit) {
  constexpr int kChunks = D / 8;       // 8-float output chunks per row
  constexpr int kRowCopies = D / 4;    // 16-byte copies per row
  const int tid = threadIdx.x;
  float* w = reinterpret_cast<float*>(smem);  // [S][ROWS]: lse, then weights
  float* row_sum = w + S * ROWS;              // [ROWS]: 1 / the weights' sum
  float* row_lse = row_sum + ROWS;            // [ROWS]
  const uint32_t obuf_off = align_up(static_cast<uint32_t>(S * ROWS + 2 * ROWS) * 4u, 16);
  float* obuf = reinterpret_cast<float*>(smem + obuf_off);  // [S][rp][D]: one row chunk of every split
  const int rp = min(ROWS, static_cast<int>((cap - obuf_off) / (static_cast<uint32_t>(S) * D * 4u)));
  const uint32_t w_addr = arch::smem_addr(w), obuf_addr = arch::smem_addr(obuf);

  // Rows [r0, r0 + nr) of split s are nr * D contiguous floats in the workspace and in obuf.
  const auto issue_rows = [&](int r0) {
    const int copies = min(rp, ROWS - r0) * kRowCopies;
    const float* src = part_o + r0 * D;
    uint32_t dst = obuf_addr;
    for (int s = 0; s < S; ++s, src += ROWS * D, dst += rp * D * 4u)
      for (int k = tid; k < copies; k += THREADS) arch::cp_async_16(dst + k * 16u, src + k * 4, 16);
  };
  for (int idx = tid; idx < S * ROWS / 4; idx += THREADS) arch::cp_async_16(w_addr + idx * 16u, part_lse + idx * 4, 16);
  issue_rows(0);
  arch::cp_async_commit();
  arch::cp_async_wait<0>();
  __syncthreads();

  // Weights per row: exp(lse_s - max), exactly 1 for the max itself (a single non-empty part passes
  // through bit for bit), kSkipPart for empty parts.
  for (int r = tid; r < ROWS; r += THREADS) {
    float m = -INFINITY;
    for (int s = 0; s < S; ++s) m = lse_fold_max(m, w[s * ROWS + r]);
    float sum = 0.f;
    for (int s = 0; s < S; ++s) {
      const float ls = w[s * ROWS + r];
      float wt = kSkipPart;
      if (m != -INFINITY && ls != -INFINITY) {
        wt = lse_weight(ls, m);
        sum += wt;
      }
      w[s * ROWS + r] = wt;
    }
    row_sum[r] = merge_inv(sum);
    row_lse[r] = m == -INFINITY ? -INFINITY : m + merge_log(sum);
  }
  __syncthreads();

  for (int r0 = 0; r0 < ROWS; r0 += rp) {
    if (r0 > 0) {
      __syncthreads();  // the previous chunk is consumed
      issue_rows(r0);
      arch::cp_async_commit();
      arch::cp_async_wait<0>();
      __syncthreads();
    }
    const int nr = min(rp, ROWS - r0);
    for (int u = tid; u < nr * kChunks; u += THREADS) {
      const int rr = u / kChunks, c = u - rr * kChunks, r = r0 + rr;
      if (!real(r)) continue;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int s = 0; s < S; ++s) {
        const float wt = w[s * ROWS + r];
        if (wt == kSkipPart) continue;
        const float4* src = reinterpret_cast<const float4*>(obuf + (s * rp + rr) * D + c * 8);
        const float4 a = src[0], z = src[1];
        acc[0] += wt * a.x, acc[1] += wt * a.y, acc[2] += wt * a.z, acc[3] += wt * a.w;
        acc[4] += wt * z.x, acc[5] += wt * z.y, acc[6] += wt * z.z, acc[7] += wt * z.w;
      }
      const float inv = row_sum[r];  // 1 / sum
      if (row_lse[r] != -INFINITY) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] *= inv;
      }
      emit(r, c, acc, row_lse[r]);
    }
  }
}

// Largest split count merged inside a thread-block cluster (16 needs the non-portable cluster size
// that the H100 / H200 allow; the plan checks that such a cluster fits the device).
constexpr int kMaxClusterSplits = 16;

// The merge of the S splits of an item that form one thread-block cluster (sm_90; cluster dims
// (1, 1, S), so the CTA of split s has cluster rank s). Each CTA left its normalized partial rows
// in its own shared memory (po: [ROWS][D] fp32, plse: [ROWS], shared-window addresses) and calls
// this; CTA `rank` then merges rows rank, rank + S, ... reading every split's row through
// distributed shared memory: no workspace round trip, no arrival counter, no fence, and the rows
// are spread over the S CTAs (D-B1: one row each) instead of one CTA merging all of them. Same
// arithmetic, in the same split order, as merge_splits: the results are bitwise the same.
template <int D, int ROWS, int THREADS, typename RealRow, typename Emit>
__device__ void merge_splits_in_cluster(uint32_t po, uint32_t plse, int S, int rank, const RealRow& real,
                                        const Emit& emit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kChunks = D / 8;
  arch::cluster_sync();  // every split's partial is in its shared memory
  const int my_rows = (ROWS - rank + S - 1) / S;
  for (int u = threadIdx.x; u < my_rows * kChunks; u += THREADS) {
    const int r = rank + (u / kChunks) * S, c = u - (u / kChunks) * kChunks;
    if (!real(r)) continue;
    float ls[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s)
      ls[s] = s < S ? arch::ld_cluster_f32(arch::cluster_map(plse + r * 4u, s)) : -INFINITY;
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) m = lse_fold_max(m, ls[s]);
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float lse = -INFINITY;
    if (m != -INFINITY) {
      float wts[kMaxClusterSplits];  // taken before the branch below (lse_weight_eager)
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) wts[s] = lse_weight_eager(ls[s], m);
      float sum = 0.f;
      const uint32_t row = po + (r * D + c * 8) * 4u;
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s >= S || ls[s] == -INFINITY) continue;
        const float wt = wts[s];
        sum += wt;
        const uint32_t a = arch::cluster_map(row, s);
        const float4 x = arch::ld_cluster_f32x4(a), z = arch::ld_cluster_f32x4(a + 16);
        acc[0] += wt * x.x, acc[1] += wt * x.y, acc[2] += wt * x.z, acc[3] += wt * x.w;
        acc[4] += wt * z.x, acc[5] += wt * z.y, acc[6] += wt * z.z, acc[7] += wt * z.w;
      }
      const float inv = merge_inv(sum);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] *= inv;
      lse = m + merge_log(sum);
    }
    emit(r, c, acc, lse);
  }
  arch::cluster_sync();  // no CTA leaves (freeing its shared memory) while another still reads it
#endif
}

}  // namespace msa::detail::cuda::decode
