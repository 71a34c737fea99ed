// Tile sizes and pipeline depth of the Hopper prefill kernels, in one place.
//
// A work tile is (request, KV head, a run of tokens) whose MMA rows are tokens x group heads:
// 128 rows = 128 / G tokens (G = query heads per KV head; M3: G = 16, 8 tokens). Two consumer
// warpgroups take 64 rows each (wgmma M = 64); warp w of a warpgroup owns rows 16w..16w+15, so
// with G = 16 one warp is exactly one token's 16 heads. A KV block is 128 keys = one TMA box of
// a 128-token page (or a 128-key slice of a larger page).
#pragma once

namespace msa::detail::cuda::prefill_sm90 {

inline constexpr int kHeadDim = 128;       // D = Dv: the only head dim these kernels take
inline constexpr int kBlockKeys = 128;     // keys per selectable block (the contract fixes 128)
inline constexpr int kTileRows = 128;      // MMA rows per work tile (tokens x G)
inline constexpr int kConsumerWarpgroups = 2;
inline constexpr int kWarpgroupRows = kTileRows / kConsumerWarpgroups;  // 64 = wgmma M
inline constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);        // producer WG + consumers
// Arrivals of every "empty" mbarrier: each consumer thread releases a buffer (and the record the
// producer wrote beside it) after its own last read of it (docs/prefill.md, "Barrier protocol").
inline constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;

// Query-major rings: Q tiles, K blocks and V blocks (32 KiB each, bf16). Two Q buffers let the next
// tile's Q land while the current tile runs, so the next tile's first QK^T can go out with the current
// tile's last PV; 2 x Q + 3 x K + 2 x V = 224 KiB of the 227 KiB a CTA may have. Measured (H200, M3-TP1):
// dense +4% (P-32K 545 -> 566-576 TFLOP/s); `shared` unchanged by this alone: it gains with the
// scheduler warp below, which removes the wait for the next tile's first K.
// At ~600 TFLOP/s over 132 SMs one block (128 rows x 128 keys x 128 x 4 FLOP = 8.4 MFLOP) takes
// ~1.9 us: 3 K stages give the producer ~4 us to land a K block fetched from a random page, and a V
// block is read one step after its K, so 2 V stages give it as long.
inline constexpr int kQStages = 2;
inline constexpr int kStages = 3;   // K stages
inline constexpr int kVStages = 2;
// The scheduler warp claims the next tile when warp 0 issues the current tile's block
// nblocks - kTileLookaheadBlocks: its ~5 dependent trips (~3-4 us) then run while the consumers work
// through ~kTileLookaheadBlocks + kStages block-steps (~1.9 us each at M3) of the current tile.
// Measured on the H200 (M3-TP1): the scheduler warp lifted `shared` 511-517 -> 522-543 TFLOP/s at
// P-chunk and `clustered` by ~5%; leads of 2, 3 and 6 blocks were within the spread of each other.
// The KV-major kernel uses the same lead in Q tiles.
inline constexpr int kTileLookaheadBlocks = 3;

// The half of a row that one 128B-swizzled TMA box and one wgmma K-major atom cover: 64 bf16.
inline constexpr int kHalfDim = 64;
inline constexpr int kHalfTileBytes = kTileRows * 128;    // 16 KiB: 128 rows x 128 B
inline constexpr int kTileBytes = 2 * kHalfTileBytes;     // 32 KiB: 128 rows x 256 B

// Register budgets after setmaxnreg: 128 x 40 + 256 x 232 = 64512 <= 65536 registers per SM,
// equal to the 168 x 384 the kernel is launched with (ptxas must report 168).
inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;

// fp8 K/V (docs/prefill.md, "fp8 K/V"): each e4m3 tile (one TMA box of 128 keys x 128 bytes, 16 KiB) lands in
// the second half of its 16-bit stage and is widened there, in place, by warps 2-3 of the producer warpgroup
// (idle in the 16-bit kernels), so the rings and the shared memory are those of the 16-bit kernels. A
// block-step (~1.9 us, ~3300 cycles at M3) widens K and V of one block, 2048 16-byte chunks: in SASS 32
// instructions per 2 chunks a thread into fp16 (one e4m3 -> f16x2 a pair), 512 issue slots of each converter
// warp a block-step; into bf16 150 per 4 chunks (32 a chunk convert: e4m3 -> f16x2, two f16 -> f32, f32x2 ->
// bf16x2 a pair), 1200. The query-major kernel widens to fp16 whatever q's type (bf16 Q tiles are rescaled into
// fp16 by their consumers); the KV-major kernel widens to q's type, its widening hidden behind the consumers.
inline constexpr int kF8ConvertWarp0 = 2;   // first converter warp of the producer warpgroup
inline constexpr int kF8ConvertWarps = 2;
inline constexpr int kF8ConvertThreads = 32 * kF8ConvertWarps;
inline constexpr int kF8TileBytes = kBlockKeys * kHeadDim;  // 16 KiB: one e4m3 tile
static_assert(kF8ConvertWarp0 >= 2 && kF8ConvertWarp0 + kF8ConvertWarps <= 4, "warps 0-1 load and schedule");

// Named barriers of the consumer warpgroups (0 is __syncthreads): the V-tail fix of both, and the
// issue turns of warpgroups 0 and 1 (kIssueBarrier, kIssueBarrier + 1).
inline constexpr int kVTailBarrier = 1;
inline constexpr int kIssueBarrier = 2;

// Sparse tiles: a token mask per block is one 32-bit word, so at most 32 tokens per tile (G >= 4).
inline constexpr int kMaxSparseTileTokens = 32;
// Largest top-k the union pre-pass takes (tokens x topk entries per tile).
inline constexpr int kMaxTopk = 64;

// KV-major path. A tile goes KV-major when query-major would run more than this many block-steps
// per useful one (union of the tile's blocks / mean selections per token), in quarters. Measured on the
// H200 (M3-TP1 P-32K, docs/prefill.md): query-major runs ~500-530 TFLOP/s of block-steps, KV-major
// ~190-200 TFLOP/s of useful work whatever the pattern, so KV-major wins past a ratio of ~2.6:
// `random` (~4.6) goes KV-major (10.7 vs 18.5 ms), `clustered` (~1.6) stays query-major (6.7 vs 10.6 ms).
inline constexpr int kKvMajorUnionRatioX4 = 8;
// KV-major takes G >= 8, so that one token's TMA box of G heads is a whole number of 8-row
// 128B-swizzle atoms inside the Q tile.
inline constexpr int kKvMinGroup = 8;
// Tokens of one key's list handled by one KV-major work item (the K/V block is loaded once for them).
inline constexpr int kKvItemTokens = 64;
// The end of a KV-major window: its last kKvTailItemsPerSm x (SM count) work items are claimed in parts
// of kKvTailSubTiles Q tiles (kv_scheduler), so that the CTAs run out of work together. Whole items (8 Q
// tiles at M3, ~20 us each) claimed in order leave CTAs idle for up to an item at the end, and the calls
// vary with the claim order: M3-TP4 P-chunk `random` timed calls of one run spread over 264-278 us. H200,
// one process, alternating variants: whole items 276.4-276.7 us; parts of 2 tiles of the last 1, 2, 3 x 132
// items 270.6 / 264.4-264.7 / 263.5-263.9; 4 tiles of the last 2 / 4 x 132 266.6-266.8 / 265.5-266.2; single
// tiles 271.4 (a part's claim chain no longer hides behind its jobs). M3-TP1 (4x the items) 920-921 -> 915.5.
inline constexpr int kKvTailItemsPerSm = 3;
inline constexpr int kKvTailSubTiles = 2;
static_assert(kKvTailItemsPerSm >= 1 && kKvTailSubTiles >= 1, "kv_scheduler always splits a window's tail");
// Q tiles in flight in the KV-major kernel, and K/V blocks (one per work item) in flight.
inline constexpr int kKvQStages = 2;
inline constexpr int kKvBlockStages = 2;
// Sub-windows of a KV-major window: its work items are ordered sub-window by sub-window, so that
// the Q rows being gathered (512 tiles x 32 KiB = 16 MiB) stay in the 50 MB L2 while every block
// they selected passes by; `random` would otherwise read each token's Q from HBM 16 times. Smaller
// sub-windows re-read K/V more often (each sub-window touches most blocks: 64 MiB at M3-TP1, 32K).
inline constexpr int kKvSubwindowTiles = 512;
// Counters per KV-major key in the rank pass (kvmajor_lists.cu, key_stripe), at most kKeyStripes: a plan
// uses 8 where a window has at most kKeyStripesWideKeys keys, else 4 (one 16-byte load per key in the scan
// and the fill instead of two). M3-TP4 P-chunk `random` (256 keys): rank pass 9 -> 6 us with 8; M3-TP1
// P-chunk (1024 keys): rank pass unchanged, scan 5 -> 8 us (H200, `bench/prefill.py --timeline`).
inline constexpr int kKeyStripes = 8;
inline constexpr int kKeyStripesWideKeys = 512;
// Partial outputs of one window (bf16: 256 B per (token, slot, head)); windows of canonical tiles
// are sized to fit: 2 GiB = 4096 tiles of 8 tokens x 16 heads x top-16.
inline constexpr long long kKvPartialBudgetBytes = 2ll << 30;
// The 16-bit copy of an fp8 cache's blocks for the query-major tiles (fp8_copy.h): K and V of every block of
// the plan's requests, 64 KiB per (block, KV head); a plan that needs more widens in the kernel instead.
// 512 MiB: M3-TP1 up to 262144 tokens of context (P-32K: 64 MiB).
inline constexpr long long kFp8CopyBudgetBytes = 512ll << 20;
// Plans of at most this many (block, KV head) pairs widen every block into the copy, beside the tile lists,
// instead of the blocks the lists flag after them (fp8_copy.h); the KV-major kernel then reads the copy too. The
// lists' time (5-9 us) leaves the critical path, and every block costs its bytes (96 KiB moved), read or not: a
// gain that is fixed against a cost that grows with the pairs. H200, fp8 us, flags -> every block:
// M3-TP4 P-chunk (256 pairs) `shared` 141.4 -> 134.6 (bf16 cache: 131.6), `clustered` 213.1 -> 208.0, `random`
// 267.8-270.4 -> 262.0; M3-TP1 P-chunk (1024) `shared` 489.1 -> 479.5, `clustered` 772.4 -> 763.8, `random` 912.8
// -> 918.4; M3-TP4 P-128K (1024) `shared` 269.0 -> 262.0, `clustered` 417.5 -> 405.0, `random` 493.3 -> 510.9;
// M3-TP1 P-128K (4096) `shared` 963.1 -> 995.3, `random` 2093.8 -> 2109.9: past 1024 pairs the flags win.
inline constexpr int kCopyEveryBlockMaxItems = 1024;
// Bytes between two copy flags (each a byte, then padding): each flag its own L2 sector. Every query-major tile
// sets the flag of each block of its union, so at `shared` selections thousands of tiles store to the same few
// flags; byte flags packed 32 to a sector serialized those stores (M3-TP1 P-chunk: tile lists 11.9 -> 9.0 us).
inline constexpr int kCopyFlagBytes = 32;

}  // namespace msa::detail::cuda::prefill_sm90
