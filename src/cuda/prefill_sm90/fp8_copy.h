// The 16-bit copy of an fp8 K/V cache's blocks that the query-major tiles of a sparse prefill read.
//
// With fp8 e4m3 K/V the query-major kernel can widen each block in shared memory per block-step (its
// converter warps, fp8_tiles.cuh), but a block that many tiles select (`shared` selections: every tile of a
// 128-token query block) is then widened by every CTA that reads it, and the widening's issue slots and
// shared-memory traffic cost those tiles 11-20% against a 16-bit cache. Instead, before the query-major
// kernel, each block some query-major tile reads is widened once, exactly, into a plan-owned copy in q's
// dtype, and the 16-bit query-major kernel reads that copy:
//   the tile lists (schedule.h, copy_flags): every query-major tile flags (copy page, KV head) of each block of
//          its union (a byte, each flag in its own L2 sector);
//   widen: one launch between the lists and the query-major kernel, one wave of CTAs striding over the
//          (copy page, KV head) pairs; a CTA takes a pair's flag and clears it (so the flags are all 0 for the
//          next run: zeroed once, by the plan's first eager run),
//          widens the pair's rows (zeros past kv_len) and writes the copy page's table entry (-1 where the
//          pool's page is invalid, so those keys stay invisible as in the pool); CTA 0 also writes the copy's
//          flat page-table rows (indptr = blk_cum / Hkv).
// A flag left set (a stale one) only widens a block no tile reads: correctness needs every block a tile reads
// flagged, nothing more.
// A plan of few blocks (config.h, kCopyEveryBlockMaxItems) has no flags: the widen kernel takes every pair (in
// units of a quarter, a half or the whole of it: 64, 128 or 256 of its K-then-V rows, the smallest that gives
// every CTA of the grid one), runs beside the tile lists instead of after them, and waits for them at its end, so
// that the query-major kernel's wait on it covers the lists too; the KV-major kernel then reads the copy as well
// (its side stream forks after the widen kernel).
// The copy is [copy_pages, Hkv, 128, 128] for K, then the same for V, page p of request b being its block
// p - blk_cum[b] / Hkv. With flags, KV-major tiles read the fp8 pool (each of their blocks widened once per work
// item there): the lists flag no block for them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"
#include "cuda/prefill_sm90/params.h"

namespace msa::detail::cuda::prefill_sm90 {

struct Fp8CopyParams {
  SeqParams seqs;
  const int32_t* blk_cum = nullptr;  // [B + 1]: prefix of ceil(kv_len / 128) * Hkv (schedule kernel)
  PageTableParams pages;        // the pool's table
  CacheParams k, v;             // the fp8 pools (strides in elements: bytes)
  int32_t page_blocks = 1;      // the pool's page_size / 128
  int32_t num_kv_heads = 0;
  int32_t copy_pages = 0;       // the plan's extent: sum over requests of ceil(kv_len / 128)
  // [copy_pages * Hkv] flags, a byte each kCopyFlagBytes apart, 0 between runs; null: every block widened
  uint8_t* flags = nullptr;
  int32_t* copy_indptr = nullptr;  // [B + 1]
  int32_t* copy_table = nullptr;   // [copy_pages]
  void* copy = nullptr;         // K then V, q's dtype
  int32_t unit_parts = 1;       // a CTA's unit: 1/unit_parts of a (copy page, KV head), 1 with flags; set at launch
};

// Launched with PDL after the tile lists; sm_count sizes the grid (one wave of CTAs).
void launch_fp8_copy_widen(const Fp8CopyParams& p, bool bf16, int sm_count, cudaStream_t stream);

}  // namespace msa::detail::cuda::prefill_sm90
