// Launch of the sm_90a decode block-scores kernel (TMA ring): one instantiation per (q dtype, key dtype).
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "cuda/runtime/check.cuh"
#include "cuda/indexer/key_map.h"
#include "cuda/indexer/launch.h"
#include "cuda/indexer/scores_ring.cuh"
#include "msa/error.h"

namespace msa::detail::cuda::indexer {

namespace {

template <typename QT, bool kF8>
const void* kernel_ptr() {
  return reinterpret_cast<const void*>(scores_ring_kernel<QT, kF8>);
}

template <typename QT, bool kF8>
void launch(const RingArgs& a, int grid, cudaStream_t stream) {
  scores_ring_kernel<QT, kF8><<<grid, RingLayout<kF8>::kThreads, RingLayout<kF8>::kSmemBytes, stream>>>(a);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool ring_scores_available(int device) {
  // Per device: whether the binary holds the sm_90a bodies (a build without them compiles empty kernels
  // of a few registers), and the dynamic shared-memory limits raised once.
  static std::mutex mu;
  static std::vector<int> state;  // 0 unknown, 1 available, 2 not
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(state.size())) state.resize(device + 1, 0);
  if (state[device] == 0) {
    const std::pair<const void*, int> kernels[] = {
        {kernel_ptr<__nv_bfloat16, false>(), RingLayout<false>::kSmemBytes},
        {kernel_ptr<__half, false>(), RingLayout<false>::kSmemBytes},
        {kernel_ptr<__nv_bfloat16, true>(), RingLayout<true>::kSmemBytes},
        {kernel_ptr<__half, true>(), RingLayout<true>::kSmemBytes}};
    bool ok = true;
    for (const auto& [k, smem] : kernels) {
      cudaFuncAttributes attr{};
      if (cudaFuncGetAttributes(&attr, k) != cudaSuccess || attr.numRegs < 32) {
        cudaGetLastError();
        ok = false;
        break;
      }
      MSA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    state[device] = ok ? 1 : 2;
  }
  return state[device] == 1;
}

bool launch_scores_ring(const BlockScoresParams& p, int device, cudaStream_t stream) {
  RingArgs a{};
  if (!keys_tma_ok(p) || !encode_keys_map(&a.keys, p)) return false;
  a.p = p;
  const bool fp8 = p.k_dtype == ScalarType::kF8E4M3, f16 = p.q_dtype == ScalarType::kF16;
  const int item_blocks = fp8 ? RingLayout<true>::kItemBlocks : RingLayout<false>::kItemBlocks;
  a.chunks = (p.max_blocks + item_blocks - 1) / item_blocks;
  a.items = static_cast<int64_t>(p.seqs.batch_size) * p.k.num_heads * a.chunks;
  a.page_shift = page_shift(p.k.page_size);
  const int grid = static_cast<int>(a.items < sm_count(device) ? a.items : sm_count(device));
  if (fp8)
    f16 ? launch<__half, true>(a, grid, stream) : launch<__nv_bfloat16, true>(a, grid, stream);
  else
    f16 ? launch<__half, false>(a, grid, stream) : launch<__nv_bfloat16, false>(a, grid, stream);
  return true;
}

}  // namespace msa::detail::cuda::indexer
