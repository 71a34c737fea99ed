// Tile sizes and limits of the CUDA indexer (block_scores, select_topk), with the numbers behind them.
// Everything tunable lives here; docs/indexer.md has the derivations.
#pragma once

namespace msa::detail::cuda::indexer {

inline constexpr int kBlock = 128;    // keys per scored block (contract §4)
inline constexpr int kHeadDim = 128;  // index head dim the kernels are built for (M3: 128)

// ---- Decode scores (scores_stream.cuh): bandwidth-bound, keys as the mma M dimension.
// A request's keys are spread over CTAs of kStreamBlocksPerCta blocks; B=64 x 512 blocks gives 4096
// CTAs, ~10 waves of 3 resident CTAs per SM, so the tail wave costs little.
inline constexpr int kStreamWarps = 4;
inline constexpr int kStreamBlocksPerCta = 8;
inline constexpr int kStreamCols = 8;  // mma n: (token, head) columns per pass over the keys
// Bytes of index K each thread has in flight per step: 256 B = 2 tiles of 16 bf16 keys (64 registers).
// 16 warps/SM x 32 lanes x 256 B = 128 KB in flight per SM, ~3x what 4.8 TB/s x ~1 us latency needs.
inline constexpr int kStreamStepBytes = 256;
// Register budget: 3 CTAs (12 warps) per SM allow 168 registers, enough for the 64 registers of loads
// in flight, 16 of query fragments and the 64-bit row addresses without spilling; 12 warps x 8 KB in
// flight per SM still triple the ~36 KB that hide DRAM latency.
inline constexpr int kStreamMinCtasPerSm = 3;
// block_scores takes a decode kernel (ring or streaming) when total_q <= this many tokens per request.
inline constexpr int kStreamMaxTokensPerRequest = 4;

// ---- Decode scores on sm_90a (scores_ring.cuh): one persistent CTA per SM, a producer warp streams each
// visible 128-key block into a shared-memory ring with TMA, consumer warps score it from shared memory.
// The bytes in flight then no longer sit in registers: 224 KB of ring per SM (7 bf16 / 13 fp8 stages) is
// ~29 MB in flight over 132 SMs, ~6 us of the 4.8 TB/s peak, against ~1-2 us of loaded DRAM latency.
inline constexpr int kRingBytes = 224 * 1024;
// Consumer warps, and blocks per work item (request, chunk of blocks, index-K head); items go round-robin
// over the CTAs and a consumer warp scores its item's blocks one after the other, so the ring's items
// (13 fp8 / 7 bf16 stages of one block) bound the warps that have work. H200, B=64 x 512 blocks, 4 warps
// (with 6 bf16 / 11 fp8 stages): bf16 2 blocks 266 us vs 4: 266-273 vs 8: 268-270; fp8 4 blocks 150-152 us
// vs 2: 160-163 vs 8: 176-177. With 7 / 13 stages: bf16 264 us (0.99 of the copy ceiling), fp8 149 us
// (0.90). An fp8 block costs a warp ~500 instructions for 16 KB (the conversions, the per-key scales), so
// fp8 takes more warps on smaller items: one run, fp8 scores (HKT / THK us), warps x blocks: 4 x 4
// 148.1 / 150.0, 8 x 4 148.1 / 146.8, 6 x 2 145.9 / 145.8, 8 x 2 143.9 / 140.7, 8 x 1 146.0 / 148.5,
// 4 x 2 162.1 / 160.2.
inline constexpr int kRingConsumerWarps16 = 4;
inline constexpr int kRingConsumerWarpsF8 = 8;
inline constexpr int kRingItemBlocks16 = 2;
inline constexpr int kRingItemBlocksF8 = 2;
// Widest head group the ring kernel packs into one mma n=8 pass (wider groups take scores_stream).
inline constexpr int kRingMaxGroup = 8;

// ---- Prefill scores on sm_90a (scores_sm90.cuh): (token, head) rows as wgmma M, a 128-key block as N.
// 4 consumer warpgroups x m64 = 256 rows (64 tokens x 4 heads): each 32 KB key block staged once serves
// 256 rows, so P-32K reads 2.2 GB of keys from L2 (M=128 would need 4.3 GB).
inline constexpr int kSm90ConsumerWarpgroups = 4;
inline constexpr int kSm90Rows = 64 * kSm90ConsumerWarpgroups;
inline constexpr int kSm90Threads = 128 * kSm90ConsumerWarpgroups + 32;  // + one producer warp
inline constexpr int kSm90Stages = 4;                                     // 4 x 32 KB of keys + 64 KB of q
// Blocks per work item along the keys: no reduction crosses blocks, so splitting keys over CTAs is free
// and keeps P-chunk (64 tiles) from leaving SMs idle. H200, P-32K: 128 blocks beat 64 by 1-4% (HKT 1235
// vs 1285 us; fewer 64 KB query loads and pipeline fills) and 32 by 4-6%.
inline constexpr int kSm90RangeBlocks = 128;
// fp8 keys on fp8 wgmma (scores_sm90_fp8.cuh): the same 256-row tiles and ranges; a stage is a 16 KB
// block + 512 B of per-token scales, consumed twice as fast as a bf16 block, so twice the stages keep
// the same bytes in flight (8 x 17 KB + 32 KB of e4m3 queries: 170 KB of shared memory).
inline constexpr int kSm90F8Stages = 8;
// The portable kernel's range (the sm_90a kernel's measurement above was not repeated for it).
inline constexpr int kPrefillRangeBlocks = 64;

// ---- Prefill scores, portable (scores_portable.cuh, mma.sync, sm_80+; on sm_90 with MSA_INDEXER_PREFILL=portable).
inline constexpr int kPortableWarps = 4;
inline constexpr int kPortableRows = 16 * kPortableWarps;  // m16 per warp
inline constexpr int kPortableStages = 3;

// ---- select_topk (topk.cuh): a warp (or a CTA) per (token, head) row, the row's keys in registers.
inline constexpr int kTopkMaxK = 64;
// Batches with at most this many tokens per request take the decode form (speculative loads).
inline constexpr int kTopkDecodeTokensPerRequest = 4;
inline constexpr int kTopkMaxRegBlocks = 32 * 64;    // 64 keys per lane: rows up to 2048 blocks (256K tokens)
inline constexpr int kTopkMaxRowBlocks = 1 << 15;    // longer rows (up to 4M tokens): a CTA per row, 64 keys per lane
inline constexpr int kTopkRowWarps = 16;             // warps of that CTA

}  // namespace msa::detail::cuda::indexer
