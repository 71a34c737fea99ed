// Geometry of the single-token decode kernel (token_kernel.cuh), in one place; read by the plan too.
//
// Why these numbers (H200): a 64-key tile of K and V is 32 KB; 3 stages (96 KB) keep two tiles in
// flight while one is consumed, and ~104 KB per CTA lets 2 CTAs share an SM (228 KB). At D-B1 a CTA
// holds one 128-key block (two tiles), so the ring is never the limit there; at larger batches a CTA
// walks several blocks and the depth matters as in the general kernel (3 stages, docs/decode.md).
#pragma once

#include <cstdint>

namespace msa::detail::cuda::decode {

// One 64-key tile of the CTA's share of the list: element offsets of its first K and V rows (page,
// offset in the page, KV head folded in) and how many of its keys are visible (1..64).
struct TokenTile {
  int64_t k_off;
  int64_t v_off;
  int32_t visible;
  int32_t pad;
};

constexpr int kTokenThreads = 128;   // 4 warps: 16 keys each for Q K^T, 32 head dims each for P V
constexpr int kTokenRows = 16;       // MMA rows: the query heads of one KV head (G <= 16, zero-padded)
constexpr int kTokenHeadDim = 128;
constexpr int kTokenTileKeys = 64;   // keys per pipeline stage: a page of >= 64 keys holds a whole tile
constexpr int kTokenStages = 3;
// fp8 K/V: up to 6 fp8 stages of 16 KB in the bytes of the 16-bit ring (token_fp8_loop.cuh). A plan cycles
// through 3 of them (two 64-key tiles in flight per warp, 32 KB per CTA) when its grid is at most
// kTokenFp8DeepWaves waves of CTAs, else through all 6 (five tiles, 80 KB): fewer bytes in flight stream faster
// where every CTA starts at once (H200, M3-TP1, 6 -> 3 stages: D-B64-fp8 41.0 -> 39.0 us, D-B128-fp8 77.2 -> 74.1,
// D-mixed-fp8 40.2 -> 38.1), a deeper ring where many waves of CTAs follow one another (D-mtp16-fp8, 7.8 waves:
// 232.8 us with 6, 240.8 with 3). On sm_90, a grid of at most one CTA per SM whose CTAs stream at least
// kTokenFp8LongListBlocks blocks each cycles through 5 (64 KB per SM, what two CTAs of 3 stages keep in flight):
// 3 -> 5 stages, same process, M3-TP1 D-B32-fp8 23.2 -> 22.6 us, M3-TP4 D-B128-fp8 23.25 -> 22.56, D-mtp-fp8
// 22.68 -> 22.14 (16 blocks a CTA); with 4 blocks a CTA no gain (M3-TP4 D-B32-fp8 11.67-11.81 -> 11.84-11.85,
// dense D-B1-fp8 14.38-14.47 -> 14.71), nor for sm_80 code, whose software widening bounds its issue rate (M3-TP1
// D-B32-fp8 27.5-27.9 -> 28.1-28.3 us).
constexpr int kTokenStagesFp8 = 6;
constexpr int kTokenStagesFp8AlonePerSm = 5;
constexpr int kTokenStagesFp8Shallow = 3;
constexpr int kTokenFp8DeepWaves = 4;
constexpr int kTokenFp8LongListBlocks = 8;

// The fp8 loop's merge buffer (token_fp8_loop.cuh): per warp 16 rows of 128 floats, the 16-byte chunk c of row r
// at chunk position token_fp8_merge_chunk(r, c) of its row. Each thread writes 32 contiguous dims of two rows as
// 8 + 8 float4; then either each thread reads 16 contiguous dims of one row of every warp (float4, the row runs) or,
// per row, 4 float2 of every warp's rows (the register layout). The swizzle spreads every phase over the banks: a
// float4 write phase (rows 2p, 2p + 1; the 4 threads of a row: chunks 8t + k), a float4 row-run phase (one row,
// chunks 4c + k of the 8 threads c) and a float2 read phase (rows 0-3 or 4-7, one half-chunk per thread) each meet
// every bank once (tests/cpp/test_token_layout.cpp).
constexpr int token_fp8_merge_chunk(int row, int c) {
  return (c & ~7) | ((c & 7) ^ (c >> 3) ^ ((row & 1) << 2) ^ (row & 2));
}

constexpr int kTokenMaxTopk = 32;    // one selected block per lane of warp 0
constexpr int kTokenMaxSplits = 16;  // splits merge inside one thread-block cluster
// Dense plans of more splits, without clusters: at most this many per item, their rows merged by a second kernel
// (token_merge_kernel.cu).
constexpr int kTokenMaxMergeParts = 256;
// MTP: tokens per request (grid.x = batch x max_qo_len rounded up to a power of two, one CTA or cluster
// per token), 1 to 16 as MiniMax's kernels take; longer rows go to the general kernel (tiles of one token
// as well).
constexpr int kTokenMaxQoLen = 16;

// Shared memory (bytes). The split's fp32 rows for the cluster merge reuse the stages at the end.
constexpr uint32_t kTokenSmemStages = 0;
constexpr uint32_t kTokenSmemQ = kTokenSmemStages + kTokenStages * 2u * kTokenTileKeys * kTokenHeadDim * 2u;
constexpr uint32_t kTokenSmemP = kTokenSmemQ + kTokenRows * kTokenHeadDim * 2u;
constexpr uint32_t kTokenSmemRedMax = kTokenSmemP + kTokenRows * kTokenTileKeys * 2u;
constexpr uint32_t kTokenSmemRedSum = kTokenSmemRedMax + 4u * kTokenRows * 4u;
constexpr uint32_t kTokenSmemTiles = kTokenSmemRedSum + 4u * kTokenRows * 4u;
constexpr uint32_t kTokenSmemCount = kTokenSmemTiles + 2u * kTokenMaxTopk * static_cast<uint32_t>(sizeof(TokenTile));
constexpr uint32_t kTokenSmemBytes = kTokenSmemCount + 16u;
// The push merge (the default, token_kernel.cuh) adds, past the above, its barrier, the lse values the
// other splits send, the merge weights of the owned rows (at most 8 rows when S >= 2: 16 split weights
// and the max), and last the rows the other splits send: S * ceil(16 / S) of them (16 for S = 2, 4,
// 8, 16; at most 30). Sized by S, a power-of-two split count takes 112.7 KB, so two CTAs share an SM
// (2 x (112.7 + 1) KB <= 228 KB) and clusters fit as the pull merge's do (M3-TP4 D-B32: 32 clusters
// of 4 fit with 112.7 KB, not with the 120.7 KB of 32 receive rows, which would send that plan to
// the pull merge and its ~3 us tail, token_trace).
constexpr int kTokenRecvRows = 32;
constexpr uint32_t kTokenSmemMergeBar = kTokenSmemBytes;
constexpr uint32_t kTokenSmemRecvLse = kTokenSmemMergeBar + 16u;
constexpr int kTokenMergeWStride = 17;
constexpr uint32_t kTokenSmemMergeW = kTokenSmemRecvLse + kTokenRecvRows * 4u;
constexpr uint32_t kTokenSmemRecvO = (kTokenSmemMergeW + 8u * kTokenMergeWStride * 4u + 15u) / 16u * 16u;
constexpr uint32_t token_push_smem_bytes(int splits) {
  return kTokenSmemRecvO + static_cast<uint32_t>(splits * ((kTokenRows + splits - 1) / splits)) * kTokenHeadDim * 4u;
}
constexpr uint32_t kTokenSmemPushBytes = kTokenSmemRecvO + kTokenRecvRows * kTokenHeadDim * 4u;  // any S <= 16

static_assert(kTokenRows * kTokenHeadDim * 4u + kTokenRows * 4u <=
                  kTokenStages * 2u * kTokenTileKeys * kTokenHeadDim * 2u,
              "the merge rows fit the stage memory");
static_assert(kTokenStagesFp8 * 2u * kTokenTileKeys * kTokenHeadDim <=
                  kTokenStages * 2u * kTokenTileKeys * kTokenHeadDim * 2u,
              "the fp8 ring fits the 16-bit ring's bytes");
static_assert(kTokenSmemTiles % 8 == 0, "tile records hold int64 offsets");
static_assert(kTokenSmemMergeBar % 8 == 0 && kTokenSmemRecvO % 16 == 0, "barrier and row alignment");
static_assert(token_push_smem_bytes(16) == token_push_smem_bytes(4) &&
                  2u * (token_push_smem_bytes(4) + 1024u) <= 228u * 1024u,
              "a power-of-two split count leaves room for two CTAs per SM");
static_assert(token_push_smem_bytes(15) <= kTokenSmemPushBytes, "30 receive rows at most");

}  // namespace msa::detail::cuda::decode
