// Launch of the sm_90a prefill block-scores kernel for fp8 index keys on fp8 wgmma.
#include <mutex>
#include <vector>

#include "cuda/runtime/check.cuh"
#include "cuda/indexer/key_map.h"
#include "cuda/indexer/launch.h"
#include "cuda/indexer/scores_sm90_fp8.cuh"
#include "msa/error.h"

namespace msa::detail::cuda::indexer {

bool sm90_fp8_scores_available(int device) {
  // Per device: whether the binary holds the sm_90a body (a build without it compiles an empty kernel
  // of a few registers), and the dynamic shared-memory limit raised once.
  static std::mutex mu;
  static std::vector<int> state;  // 0 unknown, 1 available, 2 not
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(state.size())) state.resize(device + 1, 0);
  if (state[device] == 0) {
    const void* kernels[] = {reinterpret_cast<const void*>(scores_sm90_fp8_kernel<false>),
                             reinterpret_cast<const void*>(scores_sm90_fp8_kernel<true>)};
    bool ok = true;
    for (const void* k : kernels) {
      cudaFuncAttributes attr{};
      if (cudaFuncGetAttributes(&attr, k) != cudaSuccess || attr.numRegs < 32) {
        cudaGetLastError();
        ok = false;
        break;
      }
      MSA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, Sm90F8Layout::kSmemBytes));
    }
    state[device] = ok ? 1 : 2;
  }
  return state[device] == 1;
}

void launch_scores_sm90_fp8(const BlockScoresParams& p, cudaStream_t stream) {
  Sm90Args a{};
  a.p = p;
  const int G = p.num_heads / p.k.num_heads;
  a.tile_tokens = kSm90Rows / G;
  a.slots = p.seqs.total_q / a.tile_tokens + p.seqs.batch_size;
  a.ranges = (p.max_blocks + kSm90RangeBlocks - 1) / kSm90RangeBlocks;
  a.page_shift = page_shift(p.k.page_size);
  a.tma = keys_tma_ok(p) && encode_keys_map(&a.keys, p);  // else the cp.async producer (any page or stride)
  const int64_t items = a.slots * a.ranges;
  MSA_CHECK(items <= 0x7fffffffLL && p.k.num_heads <= 65535, kNotImplemented, "msa.block_scores: argument 'out': ",
            p.seqs.total_q, " tokens x ", p.max_blocks, " blocks x ", p.k.num_heads,
            " index-K heads exceed the prefill grid");
  const dim3 grid(static_cast<unsigned>(items), p.k.num_heads);
  if (p.q_dtype == ScalarType::kF16)
    scores_sm90_fp8_kernel<true><<<grid, kSm90Threads, Sm90F8Layout::kSmemBytes, stream>>>(a);
  else
    scores_sm90_fp8_kernel<false><<<grid, kSm90Threads, Sm90F8Layout::kSmemBytes, stream>>>(a);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::detail::cuda::indexer
