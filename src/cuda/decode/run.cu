// Run time for the paged family: fills the kernel parameters and launches. No allocation, no host
// synchronization, no host read of device memory: safe under CUDA graph capture.
#include <algorithm>

#include "cuda/runtime/check.cuh"
#include "cuda/decode/kernel_params.cuh"
#include "cuda/decode/kernel_table.h"
#include "cuda/decode/state.cuh"
#include "cuda/decode/token_merge_kernel.h"
#include "cuda/plan_state.h"
#include "msa/error.h"

namespace msa::detail::cuda::decode {

void run(const State& s, const Plan& plan, const AttentionParams& p, cudaStream_t stream, const int32_t* skip_items) {
  MSA_CHECK(s.unsupported.empty(), kNotImplemented, s.unsupported);
  const void* fn = s.token_kernel ? token_kernel_entry(p.dtype, p.kv_dtype, s.push_merge)
                                  : kernel_entry(p.dtype, p.kv_dtype, s.head_dim, s.rows, s.keys, s.mtiles);
  MSA_CHECK(fn != nullptr, kType, "msa.attention: arguments 'q' / 'k': the CUDA paged attention kernels take bfloat16 "
            "or float16 q with K/V of q's dtype or fp8 e4m3, got scalar types ", static_cast<int>(p.dtype), " / ",
            static_cast<int>(p.kv_dtype));
  MSA_CHECK(p.head_dim == s.head_dim && p.head_dim_v == s.head_dim, kValue,
            "msa.attention: argument 'q': head_dim ", p.head_dim, " differs from the plan's ", s.head_dim);

  KernelParams kp;
  kp.a = p;
  kp.scale_log2 = p.sm_scale * 1.4426950408889634f;
  kp.group_pad = s.group_pad;
  kp.tile_tokens = s.tile_tokens;
  kp.tiles_per_req = s.tiles_per_req;
  kp.scan_tiles = s.scan_tiles;
  kp.num_splits = s.splits;
  const uint32_t splits = static_cast<uint32_t>(std::max(s.splits, 1));
  kp.split_magic = (65536u + splits - 1u) / splits;
  kp.fixed_split_blocks = s.fixed_split_blocks;
  kp.num_stages = p.kv_dtype == ScalarType::kF8E4M3 ? s.stages_fp8 : s.stages;
  kp.list_cap = s.list_cap;
  kp.skip_items = skip_items;
  kp.spec_qo_len = s.spec_qo_len;
  kp.tq_shift = s.tq_shift;
  const int ps = p.k.page_size;
  kp.page_shift = ps > 0 && (ps & (ps - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(ps)) : -1;
  kp.cluster_merge = s.cluster_merge;
  kp.cluster_size = s.cluster_size;
  kp.prewait_prefetch = s.prewait_prefetch;
  if (kp.prewait_prefetch && p.pages.indptr == nullptr && ps > 0) {
    const int64_t pages = std::min(p.pages.row_capacity, (p.max_kv_len + ps - 1) / ps);
    kp.prefetch_page_entries = static_cast<int32_t>(std::clamp<int64_t>(pages, 0, kPrefetchPageEntries));
  }
  bool pdl = s.pdl;
  if (s.merge_kernel) {  // the splits' rows go to the workspace, token_merge_kernel.cu merges them
    kp.part_o = s.part_o.as<float>();
    kp.part_lse = s.part_lse.as<float>();
  } else if (s.splits > 1 && (!s.cluster_merge || s.cluster_size < s.splits)) {  // a workspace merge
    kp.part_o = s.part_o.as<float>();
    kp.part_lse = s.part_lse.as<float>();
    kp.counters = s.counters.as<uint32_t>();
    if (!s.counters_zeroed.load(std::memory_order_acquire)) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      MSA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
      MSA_CUDA_CHECK(cudaMemsetAsync(s.counters.get(), 0, s.counters.bytes(), stream));
      if (capture == cudaStreamCaptureStatusNone) s.counters_zeroed.store(true, std::memory_order_release);
      pdl = false;  // the kernel follows the memset in plain stream order
    }
  }
  // Programmatic dependent launch (sm_90): the grid may be scheduled while the previous kernel of
  // the stream finishes (the kernel waits for it before its first device read), which hides the
  // launch latency of back-to-back decode steps.
  cudaLaunchAttribute attrs[2]{};
  unsigned num_attrs = 0;
  if (pdl) {
    attrs[num_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[num_attrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (s.cluster_merge) {  // the splits of an item form clusters of cluster_size (split_merge.cuh)
    attrs[num_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[num_attrs].val.clusterDim.x = 1;
    attrs[num_attrs].val.clusterDim.y = 1;
    attrs[num_attrs++].val.clusterDim.z = static_cast<unsigned>(s.cluster_size);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(s.num_tiles), static_cast<unsigned>(s.num_kv_heads),
                     static_cast<unsigned>(s.splits));
  cfg.blockDim = dim3(s.threads);
  cfg.dynamicSmemBytes = s.smem_bytes;
  cfg.stream = stream;
  cfg.attrs = num_attrs > 0 ? attrs : nullptr;
  cfg.numAttrs = num_attrs;
  void* args[] = {&kp};
  MSA_CUDA_CHECK(cudaLaunchKernelExC(&cfg, fn, args));
  if (s.merge_kernel)
    launch_token_merge(kp, static_cast<unsigned>(s.num_tiles), static_cast<unsigned>(s.num_kv_heads), s.pdl, stream);
}

}  // namespace msa::detail::cuda::decode
