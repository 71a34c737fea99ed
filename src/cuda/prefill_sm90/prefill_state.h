// What a prefill plan holds for the Hopper kernels: the decomposition chosen from the host lengths
// (tile shape, tile count, KV-major windows) and every workspace the run-time passes write.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>

#include "cuda/runtime/device_buffer.cuh"
#include "cuda/runtime/stream_fork.h"
#include "cuda/plan_state.h"
#include "cuda/prefill_sm90/kvmajor_state.h"
#include "cuda/prefill_sm90/schedule.h"

namespace msa::detail::cuda::prefill_sm90 {

// The tile lists and KV-major lists (KvListState), and what only the Hopper kernels need.
struct PrefillState : KvListState {
  int sm_count = 0;
  int32_t batch_size = 0;
  int32_t page_blocks = 1;   // page_size / 128
  bool f8_ready = false;     // the fp8 K/V kernels of the plan's paths hold sm_90a code and are configured
  DeviceBuffer qm_tiles;  // [num_tiles] with a KV-major path: the query-major tiles, compacted
  // The TMA map of part_o for bf16 and fp16 q, encoded at plan time: part_o is the plan's, so a run need not
  // encode it (~1-2 us of host time a map on the H200 machine, bench/run_host.py).
  CUtensorMap part_map_bf16{}, part_map_f16{};
  // fp8 K/V: the 16-bit copy of the blocks the query-major tiles read (fp8_copy.h), for sparse plans with
  // query-major tiles whose copy fits kFp8CopyBudgetBytes; copy_pages 0: none (the kernel widens its tiles).
  int32_t copy_pages = 0;
  DeviceBuffer fp8_copy;     // K [copy_pages, Hkv, 128, 128], then V, in q's dtype
  bool copy_every_block = false;  // the widen kernel takes every block, beside the tile lists (no flags)
  DeviceBuffer copy_flags;   // [copy_pages * Hkv] flags of kCopyFlagBytes, cleared by the widen kernel; none: every block
  mutable std::atomic<bool> copy_flags_zeroed{false};  // by the first eager run (a captured run records it)
  DeviceBuffer copy_indptr;  // [B + 1]
  DeviceBuffer copy_table;   // [copy_pages]
  CUtensorMap copy_k_map_bf16{}, copy_v_map_bf16{}, copy_k_map_f16{}, copy_v_map_f16{};
  // The KV-major launches on a side stream beside the query-major kernel (both read the tile lists and
  // write disjoint rows of o / lse); empty when the plan has no KV-major path.
  StreamFork fork;
};

}  // namespace msa::detail::cuda::prefill_sm90
