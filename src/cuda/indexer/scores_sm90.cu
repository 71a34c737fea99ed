// Launch of the sm_90a prefill block-scores kernel (bf16 and fp16 index keys).
#include <mutex>
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/indexer/launch.h"
#include "cuda/indexer/scores_sm90.cuh"
#include "msa/error.h"

namespace msa::detail::cuda::indexer {

bool sm90_scores_available(int device) {
  // Per device: whether the binary holds the sm_90a body (a build without it compiles an empty kernel
  // of a few registers), and the dynamic shared-memory limit raised once.
  static std::mutex mu;
  static std::vector<int> state;  // 0 unknown, 1 available, 2 not
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(state.size())) state.resize(device + 1, 0);
  if (state[device] == 0) {
    const void* kernels[] = {reinterpret_cast<const void*>(scores_sm90_kernel<false>),
                             reinterpret_cast<const void*>(scores_sm90_kernel<true>)};
    bool ok = true;
    for (const void* k : kernels) {
      cudaFuncAttributes attr{};
      if (cudaFuncGetAttributes(&attr, k) != cudaSuccess || attr.numRegs < 32) {
        cudaGetLastError();
        ok = false;
        break;
      }
      MSA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSm90SmemBytes));
    }
    state[device] = ok ? 1 : 2;
  }
  return state[device] == 1;
}

void launch_scores_sm90(const BlockScoresParams& p, cudaStream_t stream) {
  const int G = p.num_heads / p.k.num_heads;
  const int tile_tokens = kSm90Rows / G;
  const int64_t slots = p.seqs.total_q / tile_tokens + p.seqs.batch_size;
  const dim3 grid(static_cast<unsigned>(slots), (p.max_blocks + kPrefillRangeBlocks - 1) / kPrefillRangeBlocks,
                  p.k.num_heads);
  MSA_CHECK(grid.y <= 65535u && grid.z <= 65535u, kNotImplemented, "msa.block_scores: argument 'out': ",
            p.max_blocks, " blocks x ", p.k.num_heads, " index-K heads exceed the prefill grid");
  if (p.q_dtype == ScalarType::kF16)
    scores_sm90_kernel<true><<<grid, kSm90Threads, kSm90SmemBytes, stream>>>(p, tile_tokens, page_shift(p.k.page_size));
  else
    scores_sm90_kernel<false><<<grid, kSm90Threads, kSm90SmemBytes, stream>>>(p, tile_tokens,
                                                                              page_shift(p.k.page_size));
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::detail::cuda::indexer
