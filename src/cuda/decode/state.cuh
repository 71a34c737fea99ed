// What a CUDA plan keeps for the paged kernel family: the launch geometry chosen at plan time and
// the split workspaces. Everything that depends on lengths is read by the kernel at run time, so a
// decode state depends only on (batch size, heads, top-k, limits).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "cuda/runtime/device_buffer.cuh"

namespace msa::detail::cuda::decode {

struct State {
  // Set when this family cannot serve the plan but another one (the Hopper prefill) does; run()
  // then reports it instead of launching.
  std::string unsupported;

  int head_dim = 0;
  int rows = 0;            // MMA rows per CTA: 16, 64 or 128
  int keys = 0;            // keys per pipeline stage (config.cuh, TileConfig)
  int mtiles = 1;          // 16-row m-tiles per warp (TileConfig)
  int threads = 0;
  int group_pad = 1;       // GQA group padded to a power of two (rows per token)
  int tile_tokens = 1;     // query tokens per tile
  int tiles_per_req = 1;   // decode: tiles of one request
  bool scan_tiles = false; // prefill: tiles located by a scan of qo_indptr
  int64_t num_tiles = 0;   // grid.x
  int num_kv_heads = 0;    // grid.y
  int splits = 1;          // grid.z
  int fixed_split_blocks = 0;
  int stages = 0;           // 16-bit K/V stages
  int stages_fp8 = 0;       // fp8 K/V stages of the same ring bytes (fp8_tile.cuh)
  int list_cap = 0;
  uint32_t smem_bytes = 0;
  int spec_qo_len = 0;     // decode: guessed tokens per request (KernelParams::spec_qo_len)
  int tq_shift = 0;        // the token kernel: log2 of its CTAs per request (KernelParams::tq_shift)
  bool pdl = false;        // launch with programmatic stream serialization (sm_90+)
  bool prewait_prefetch = false;  // decode: the L2 prefetch before the PDL wait (prewait_prefetch.cuh)
  bool cluster_merge = false;  // splits > 1 merge inside clusters of dims (1, 1, cluster_size) (sm_90)
  int cluster_size = 0;        // splits per cluster: splits (one level) or 16 (the general kernel's two levels)
  bool token_kernel = false;   // the single-token decode kernel (token_kernel.cuh) serves the plan
  bool push_merge = false;     // ... with its push split merge (where its clusters fit; else the pull merge)
  bool merge_kernel = false;   // ... with its splits merged by a second kernel (token_merge_kernel.cu)

  DeviceBuffer part_o;     // fp32 [items, parts, rows, head_dim]: parts = splits without a cluster merge,
                           // splits / cluster_size with the general kernel's two levels
  DeviceBuffer part_lse;   // fp32 [items, parts, rows]
  DeviceBuffer counters;   // uint32 [items], zero between launches
  // The counters are zeroed on the stream of the first eager run (a stream-ordered memset); a run
  // under graph capture before that records the memset into the graph instead.
  mutable std::atomic<bool> counters_zeroed{false};
};

}  // namespace msa::detail::cuda::decode
