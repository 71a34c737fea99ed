// Tile sizes and pipeline depth of the portable (sm_80+, mma.sync) KV-major sparse prefill, in one place.
//
// A job is (work item, Q tile): up to 128 / G tokens of one key's list meet its K and V block. Its 128 MMA
// rows are (token, query head) pairs, 8 warps of 16 rows (M3, G = 16: one warp = one token's heads). Each
// row attends to exactly one block of 128 keys, so its softmax is exact (no running maximum) and it
// writes one partial (o, lse) per (token, slot, head), merged afterwards by the LSE merge of
// prefill_sm90/kvmajor_lists.cu.
//
// Shared memory per CTA: KV stages x (K + V block, 2 x 32 KiB: 128 keys x 128 dims x 16 bits, 128B-swizzled
// rows) + one Q tile (32 KiB) + the item records (2 KiB). fp8 e4m3 K/V land in the second half of their 16-bit
// buffers and are widened there, in place (the same bytes as 16-bit K/V). Q fragments are taken into
// registers at the start of a job (32 registers), so one Q buffer suffices: the next job's Q gather is
// issued right after and lands while the job computes.
//
// Per architecture family (shared memory a CTA may opt into; one CTA of 256 threads per SM, <= 255
// registers a thread everywhere):
//   sm_80 / sm_87 (A100, Orin: 163 KiB), sm_90 (227 KiB): 2 KV stages, 160 KiB + records: the next item's
//       K/V load while the current item's jobs run.
//   sm_86 / sm_89 / sm_120 (RTX 30xx, L40S / RTX 40xx, RTX 50xx: 99 KiB): 1 KV stage, 96 KiB + records: the
//       next item's K/V are issued after the current item's last P V and wait exposed (one 64 KiB load per
//       item of up to kItemTokens tokens: ~8 jobs at M3).
// The host picks the instance from the device's opt-in limit (not from the compiled arch: an sm_80 binary
// runs on sm_86 and sm_90 devices), so every instance is compiled for every arch.
#pragma once

#include <cstdint>

namespace msa::detail::cuda::prefill_portable {

inline constexpr int kHeadDim = 128;      // D = Dv
inline constexpr int kBlockKeys = 128;    // keys per block (the contract's block)
inline constexpr int kRows = 128;         // MMA rows of a job (tokens x G)
inline constexpr int kWarps = kRows / 16;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRowBytes = kHeadDim * 2;                 // one 16-bit K / V / Q row
inline constexpr int kBlockBytes = kBlockKeys * kRowBytes;     // 32 KiB: a K or a V block
inline constexpr int kQBytes = kRows * kRowBytes;              // 32 KiB
inline constexpr int kMinGroup = 8;       // G >= 8: at most 16 tokens a job (the tile lists' masks)

// The per-tile choice (KvMajorRule::kWideUnion): KV-major when the union of a tile's blocks exceeds this many
// quarters of its tokens' mean selection count. Measured on the H200 running sm_80 code (M3-TP1, quick bench,
// docs/prefill_portable.md): the paged kernel runs ~250-270 TFLOP/s of block-steps (`shared`), the KV-major
// kernel ~180-190 of useful work whatever the pattern, so KV-major wins past a ratio of ~1.4: `clustered`
// (~1.6) goes KV-major (P-chunk 181.5 vs 126-130 all on the paged kernel), `shared` (1.0) stays on the paged
// kernel (254.1 vs 188.0).
inline constexpr int kKvMajorUnionRatioX4 = 5;

// Item records (kernel.cuh: 3 slots, each with its item's <= 64 {q row, window entry} pairs).
inline constexpr uint32_t kRecordBytes = 2048;

__host__ __device__ constexpr uint32_t smem_bytes(int kv_stages) {
  return static_cast<uint32_t>(kv_stages) * 2u * kBlockBytes + kQBytes + kRecordBytes;
}
// The KV stages of a device whose CTAs may opt into `optin` bytes of shared memory: 2 where they fit,
// else 1; 0 where not even one does (no KV-major path).
inline int kv_stages_for(int optin) {
  if (static_cast<uint32_t>(optin) >= smem_bytes(2)) return 2;
  if (static_cast<uint32_t>(optin) >= smem_bytes(1)) return 1;
  return 0;
}

}  // namespace msa::detail::cuda::prefill_portable
