// Geometry of the single-token decode kernel (token_kernel.cuh), in one place; read by the plan too.
//
// Why these numbers (H200): a 64-key tile of K and V is 32 KB; 3 stages (96 KB) keep two tiles in
// flight while one is consumed, and ~104 KB per CTA lets 2 CTAs share an SM (228 KB). At D-B1 a CTA
// holds one 128-key block (two tiles), so the ring is never the limit there; at larger batches a CTA
// walks several blocks and the depth matters as in the general kernel (3 stages, docs/decode.md).
#pragma once

#include <cstdint>

namespace msa::detail::cuda::paged {

constexpr int kTokenThreads = 128;   // 4 warps: 16 keys each for Q K^T, 32 head dims each for P V
constexpr int kTokenRows = 16;       // MMA rows: the query heads of one KV head (G <= 16, zero-padded)
constexpr int kTokenHeadDim = 128;
constexpr int kTokenTileKeys = 64;   // keys per pipeline stage: a page of >= 64 keys holds a whole tile
constexpr int kTokenStages = 3;
constexpr int kTokenMaxTopk = 32;    // one selected block per lane of warp 0
constexpr int kTokenMaxSplits = 16;  // splits merge inside one thread-block cluster

// Shared memory (bytes). The split's fp32 rows for the cluster merge reuse the stages at the end.
constexpr uint32_t kTokenSmemStages = 0;
constexpr uint32_t kTokenSmemQ = kTokenSmemStages + kTokenStages * 2u * kTokenTileKeys * kTokenHeadDim * 2u;
constexpr uint32_t kTokenSmemP = kTokenSmemQ + kTokenRows * kTokenHeadDim * 2u;
constexpr uint32_t kTokenSmemRedMax = kTokenSmemP + kTokenRows * kTokenTileKeys * 2u;
constexpr uint32_t kTokenSmemRedSum = kTokenSmemRedMax + 4u * kTokenRows * 4u;
constexpr uint32_t kTokenSmemTiles = kTokenSmemRedSum + 4u * kTokenRows * 4u;
constexpr uint32_t kTokenSmemCount = kTokenSmemTiles + 2u * kTokenMaxTopk * 24u;
constexpr uint32_t kTokenSmemBytes = kTokenSmemCount + 16u;
// The push merge (the default, token_kernel.cuh) adds, past the above, its barrier and
// the rows the other splits send: at most 32 (splits x rows per split: S * ceil(16 / S) <= 30).
constexpr int kTokenRecvRows = 32;
constexpr uint32_t kTokenSmemMergeBar = kTokenSmemBytes;
constexpr uint32_t kTokenSmemRecvLse = kTokenSmemMergeBar + 16u;
constexpr uint32_t kTokenSmemRecvO = kTokenSmemRecvLse + kTokenRecvRows * 4u;
// Then the merge weights of the owned rows (at most 8 rows when S >= 2): 16 split weights and the max.
constexpr int kTokenMergeWStride = 17;
constexpr uint32_t kTokenSmemMergeW = kTokenSmemRecvO + kTokenRecvRows * kTokenHeadDim * 4u;
constexpr uint32_t kTokenSmemPushBytes = kTokenSmemMergeW + 8u * kTokenMergeWStride * 4u;

static_assert(kTokenRows * kTokenHeadDim * 4u + kTokenRows * 4u <= kTokenStages * 2u * kTokenTileKeys * kTokenHeadDim * 2u,
              "the merge rows fit the stage memory");
static_assert(kTokenSmemTiles % 8 == 0, "tile records hold int64 offsets");
static_assert(kTokenSmemMergeBar % 8 == 0 && kTokenSmemRecvO % 16 == 0, "barrier and row alignment");

}  // namespace msa::detail::cuda::paged
