// Geometry of the single-token decode kernel (token_kernel.cuh), in one place; read by the plan too.
//
// Why these numbers (H200): a 64-key tile of K and V is 32 KB; 3 stages (96 KB) keep two tiles in
// flight while one is consumed, and ~104 KB per CTA lets 2 CTAs share an SM (228 KB); a grid of at
// most one CTA per SM takes a fourth stage instead (below). At D-B1 a CTA holds one 128-key block
// (two tiles), so the ring is never the limit there; at larger batches a CTA walks several blocks.
#pragma once

#include <cstdint>

namespace msa::detail::cuda::paged {

constexpr int kTokenThreads = 128;   // 4 warps: 16 keys each for Q K^T, 32 head dims each for P V
constexpr int kTokenRows = 16;       // MMA rows: the query heads of one KV head (G <= 16, zero-padded)
constexpr int kTokenHeadDim = 128;
constexpr int kTokenTileKeys = 64;   // keys per pipeline stage: a page of >= 64 keys holds a whole tile
constexpr int kTokenMaxTopk = 32;    // one selected block per lane of warp 0
constexpr int kTokenMaxSplits = 16;  // splits merge inside one thread-block cluster

// Pipeline depth: 3 stages (~104 KB) when the grid needs two CTAs per SM, 4 (~136 KB) when it has at
// most one CTA per SM, where the fourth stage is a third tile in flight: M3-TP1 D-B32 (128 CTAs, one
// per SM, 32 tiles each) is bound by the bytes one SM keeps in flight.
constexpr int kTokenMinStages = 3;
constexpr int kTokenMaxStages = 4;

// Shared memory (bytes) for `stages` stages. The split's fp32 rows for the cluster merge reuse the
// stages at the end.
struct TokenSmem {
  uint32_t q, p, red_max, red_sum, tiles, count, total;
};
__host__ __device__ constexpr TokenSmem token_smem(int stages) {
  TokenSmem s{};
  s.q = static_cast<uint32_t>(stages) * 2u * kTokenTileKeys * kTokenHeadDim * 2u;  // stages start at 0
  s.p = s.q + kTokenRows * kTokenHeadDim * 2u;
  s.red_max = s.p + kTokenRows * kTokenTileKeys * 2u;
  s.red_sum = s.red_max + 4u * kTokenRows * 4u;
  s.tiles = s.red_sum + 4u * kTokenRows * 4u;
  s.count = s.tiles + 2u * kTokenMaxTopk * 24u;
  s.total = s.count + 16u;
  return s;
}

static_assert(kTokenRows * kTokenHeadDim * 4u + kTokenRows * 4u <= token_smem(kTokenMinStages).q,
              "the merge rows fit the stage memory");
static_assert(token_smem(kTokenMinStages).tiles % 8 == 0, "tile records hold int64 offsets");

}  // namespace msa::detail::cuda::paged
