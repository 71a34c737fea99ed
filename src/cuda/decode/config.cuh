// Tile geometry of the paged attention kernels, in one place.
//
// A CTA computes one work item: (tile of query tokens of one request, KV head g, split s). Its ROWS
// MMA rows are the tile's tokens x the GQA group padded to a power of two (row r -> token r / GP,
// query head g*G + r % GP; rows with r % GP >= G are padding). Keys stream through shared memory in
// tiles of KEYS keys (K and V, one cp.async stage each).
//
// Warps: ROWS / (16 x MT) row groups x WK key groups. With 16 rows (one decode token of a 16-head group)
// the KEYS / 16 warps (4; 2 at D=256) split each key tile (16 keys each) and their softmax states are
// combined at the end; with 64 rows each warp owns 16 rows and sees every key of the tile; 128-row tiles at
// D <= 128 (the portable prefill's) have 4 warps of 32 rows (MT = 2 m-tiles: FlashAttention-2's shape, 5-14%
// faster than 8 warps of 16 rows on the H200, docs/prefill_portable.md).
//
// Why these numbers (H200: 132 SMs, 228 KB shared memory per SM, ~16 B/clk/SM of HBM at the copy
// ceiling, ~1.5 us load latency => ~48-64 KB must be in flight per SM):
//  * a key tile of D=128 is 64 keys x 256 B x 2 (K, V) = 32 KB; 3 stages = 96 KB keep 2 tiles
//    (64 KB) in flight per CTA while the third is consumed, and ~100 KB per CTA fits 2 CTAs per SM,
//    so 128 KB are in flight per SM and one CTA's prologue hides behind the other's loads;
//  * D=256 halves KEYS to keep 32 KB stages; D=64 keeps 64 keys (16 KB stages) with 4 stages;
//  * the 4-warp 128-row tiles keep Q in shared memory (32 KB) and run 2 stages of 64 keys (~101 KB, 2
//    CTAs per SM on the H200), or 32-key stages where two such CTAs do not fit (A100); where no two 4-warp
//    CTAs fit at all (sm_86 / 89 / 120), the 8-warp tiles of 16 rows (plan.cu).
#pragma once

#include <cstddef>
#include <cstdint>

namespace msa::detail::cuda::decode {

constexpr int kBlock = 128;           // tokens per selectable block (the contract's block)
constexpr int kMaxTileTokens = 64;    // tokens per tile: one bit each in a 64-bit mask per block
constexpr int kMaxListEntries = 8192; // token x topk entries sorted per tile (decode: <= 16 x topk)
constexpr int kMaxSplits = 64;        // cap of the split count (workspace, and the last CTA's merge length)

// Keys per pipeline stage: 64, 32 at D=256 (32 KB stages).
__host__ __device__ constexpr int default_tile_keys(int d) { return d == 256 ? 32 : 64; }
// 16-row m-tiles per warp: 2 for 128-row tiles at D <= 128 (prefill: FlashAttention-2's shape, 4 warps of
// 32 rows, so that every K / V fragment feeds two MMAs; Q stays in shared memory and 2 CTAs share an SM),
// else 1. Devices that cannot hold two such CTAs on an SM take other instances (plan.cu): 32-key stages
// at D=128 where two of those fit (A100), else one m-tile a warp (8 warps of 16 rows: sm_86 / 89 / 120).
__host__ __device__ constexpr int default_tile_mtiles(int d, int rows) { return rows == 128 && d <= 128 ? 2 : 1; }

template <int D, int ROWS, int KEYS = default_tile_keys(D), int MT = default_tile_mtiles(D, ROWS)>
struct TileConfig {
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  static_assert(ROWS == 16 || ROWS == 64 || ROWS == 128, "16, 64 or 128 rows");
  static_assert(KEYS == 32 || KEYS == 64, "32 or 64 keys a stage");
  static_assert(MT == 1 || (MT == 2 && ROWS == 128 && D <= 128), "two m-tiles a warp: 128 rows, D <= 128");
  static constexpr int kHeadDim = D;
  static constexpr int kRows = ROWS;
  static constexpr int kMTiles = MT;  // 16-row m-tiles per warp
  static constexpr int kKeys = KEYS;
  static constexpr int kRowGroups = ROWS / (16 * kMTiles);     // warps along rows
  static constexpr int kKeyGroups = ROWS == 16 ? kKeys / 16 : 1;  // warps along the keys of a tile
  static constexpr int kWarps = kRowGroups * kKeyGroups;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpKeys = kKeys / kKeyGroups;         // keys per warp per tile (multiple of 16)
  static constexpr int kTilesPerBlock = kBlock / kKeys;
  static constexpr int kChunksPerRow = D * 2 / 16;             // 16-byte chunks per K/V/Q row (2-byte types)
  // 3 stages keep 2 CTAs per SM (1 CTA with 4-6 stages measured slower at B >= 32: docs/decode.md, alternatives).
  static constexpr int kMaxStages = D == 64 ? 4 : 3;
  // Q fragments live in registers for D <= 128 at one m-tile a warp (32 registers at D=128); at D=256 they
  // would take 64 and push the 128-register O accumulator into spills, so Q stays in shared memory there, as
  // with two m-tiles a warp (twice the fragments, beside twice the O accumulator).
  static constexpr bool kQInRegs = D <= 128 && kMTiles == 1;
  static constexpr int kMinBlocksPerSm = ((ROWS == 128 && kMTiles == 1) || D == 256) ? 1 : 2;
  // Tile loads: 8 threads per K or V row, thread t8 copying 16-byte chunks t8 + 8j, so each
  // instruction moves 128 contiguous bytes of a row and the thread's swizzled destination is a
  // per-thread base plus immediates (rows of one thread are kLoadRowsPerPass apart, a multiple of 8:
  // same row & 7).
  static constexpr int kLoadRowsPerPass = kThreads / 8;
  static constexpr int kLoadPasses = kKeys / kLoadRowsPerPass;
  static constexpr int kLoadChunks = kChunksPerRow / 8;
  // Padding of the fp32 epilogue rows: 8 floats shift consecutive rows by 8 banks, so the float2
  // stores of a half-warp (4 rows x 4 lanes) hit 32 distinct banks.
  static constexpr int kEpiStride = D + 8;

  static_assert(kWarpKeys % 16 == 0, "a warp's keys form whole MMA k-steps");
  static_assert(kThreads % kChunksPerRow == 0 && kKeys % (kThreads / kChunksPerRow) == 0, "tile load split");
  static_assert(kThreads >= kKeys && kKeys % 32 == 0, "one thread per key resolves page offsets");
  static_assert(kLoadRowsPerPass % 8 == 0 && kKeys % kLoadRowsPerPass == 0 && kChunksPerRow % 8 == 0, "load map");
  static_assert(!kQInRegs || ROWS <= 2 * kKeys, "Q is staged in the last K+V stage");
};

// Shared-memory layout, computed identically on the host (launch size) and in the kernel.
struct SmemLayout {
  uint32_t stages = 0;     // stages x (K tile, V tile); Q staging; the fp32 epilogue aliases it all
  uint32_t conv = 0;       // fp8 K/V: the converted 16-bit tile (and Q staging), before the fp8 stages
  uint32_t q = 0;          // Q tile (only when Q does not live in registers)
  uint32_t epi = 0;        // epilogue: WK x ROWS x (D+8) floats, then WK x ROWS m, l (one key group, unsplit:
                           // ROWS x (D+8) elements of q's type, epilogue_one_group)
  uint32_t part = 0;       // after the epilogue: a split's normalized rows (ROWS x D fp32, ROWS lse)
                           // for the merge inside a cluster; usable when part_end <= ring_off
  uint32_t part_end = 0;
  uint32_t ring_off = 0;   // (stages+1) x KEYS x {k row, v row} pointers (the tensor base when invalid)
  uint32_t ring_valid = 0; // (stages+1) x 64-bit key validity masks
  uint32_t sort_keys = 0;  // list_cap int32 (block << 6 | token), sorted
  uint32_t list_blk = 0;   // list_cap int32: unique selected blocks, ascending
  uint32_t list_mask = 0;  // list_cap uint64: tokens of the tile that selected each block
  uint32_t scratch = 0;    // 64 int32: scan partials and broadcasts
  uint32_t total = 0;
};

__host__ __device__ constexpr uint32_t align_up(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }

// fp8: num_stages fp8 stages (half the bytes each) after one 16-bit tile they are converted into
// (fp8_tile.cuh).
template <int D, int ROWS, int KEYS, int MT>
__host__ __device__ inline SmemLayout smem_layout(int num_stages, int list_cap, bool fp8 = false) {
  using C = TileConfig<D, ROWS, KEYS, MT>;
  SmemLayout s;
  const uint32_t stage_bytes = 2u * C::kKeys * D * 2u;
  uint32_t off = 0;
  if (fp8) {
    s.conv = off;
    off += stage_bytes;
    s.stages = off;
    off += num_stages * stage_bytes / 2;
  } else {
    s.stages = off;
    off += num_stages * stage_bytes;
  }
  if (!C::kQInRegs) {
    s.q = off;
    off += ROWS * D * 2u;
  }
  const uint32_t epi_bytes = C::kKeyGroups * ROWS * (C::kEpiStride + 2u) * 4u;
  s.epi = 0;
  s.part = align_up(epi_bytes, 16);
  s.part_end = s.part + ROWS * D * 4u + ROWS * 4u;
  off = align_up(off > epi_bytes ? off : epi_bytes, 16);
  s.ring_off = off;
  off += (num_stages + 1) * C::kKeys * 16u;
  s.ring_valid = off;
  off += (num_stages + 1) * 8u;
  s.list_mask = off;
  off += list_cap * 8u;
  s.sort_keys = off;
  off += list_cap * 4u;
  s.list_blk = off;
  off += list_cap * 4u;
  s.scratch = off;
  off += 64 * 4u;
  s.total = align_up(off, 16);
  return s;
}

}  // namespace msa::detail::cuda::decode
