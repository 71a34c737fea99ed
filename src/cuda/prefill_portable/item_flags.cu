// The paged kernel's skip flags from the tile-list pass's paths (see state.h, launch_item_flags).
#include <algorithm>

#include "cuda/arch/pdl.cuh"
#include "cuda/prefill_portable/state.h"
#include "cuda/prefill_sm90/tile_common.cuh"
#include "cuda/runtime/launch.cuh"

namespace msa::detail::cuda::prefill_portable {

namespace {

constexpr int kFlagThreads = 256;

__global__ void __launch_bounds__(kFlagThreads) item_flags_kernel(SeqParams seqs, prefill_sm90::TileSchedule sched,
                                                                  const int32_t* kv_major, int32_t* skip_items,
                                                                  int64_t paged_items) {
  arch::grid_dependency_wait();  // PDL: the tile lists first
  arch::allow_dependent_launch();
  const int32_t live = prefill_sm90::live_tiles(sched, seqs.batch_size);
  for (int32_t t = blockIdx.x * kFlagThreads + threadIdx.x; t < live; t += gridDim.x * kFlagThreads) {
    const prefill_sm90::TileCoord c = prefill_sm90::decode_tile(sched, seqs.batch_size, t);
    const int64_t x = sched.tile_cum[c.request] / sched.num_kv_heads + c.chunk;
    const int64_t item = x * sched.num_kv_heads + c.kv_head;
    if (item < paged_items) skip_items[item] = kv_major[t] != 0;
  }
}

}  // namespace

void launch_item_flags(const SeqParams& seqs, const prefill_sm90::TileSchedule& sched, const int32_t* kv_major,
                       int32_t* skip_items, int64_t paged_items, bool pdl, cudaStream_t stream) {
  if (sched.num_tiles == 0) return;
  const int grid = std::min((sched.num_tiles + kFlagThreads - 1) / kFlagThreads, 1024);
  launch_kernel(pdl, item_flags_kernel, dim3(grid), dim3(kFlagThreads), 0, stream, seqs, sched, kv_major, skip_items,
                paged_items);
}

}  // namespace msa::detail::cuda::prefill_portable
