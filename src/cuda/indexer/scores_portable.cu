// Launch of the portable (mma.sync) prefill block-scores kernel: one instantiation per (q dtype, key dtype).
#include <type_traits>

#include "cuda/runtime/check.cuh"
#include "cuda/indexer/launch.h"
#include "cuda/indexer/scores_portable.cuh"
#include "msa/error.h"

namespace msa::detail::cuda::indexer {

namespace {

template <typename QT, typename KT>
void launch(const BlockScoresParams& p, cudaStream_t stream) {
  using Tr = PortableTraits<QT, KT>;
  const int G = p.num_heads / p.k.num_heads;
  const int tile_tokens = kPortableRows / G;
  const int64_t slots = p.seqs.total_q / tile_tokens + p.seqs.batch_size;
  const dim3 grid(static_cast<unsigned>(slots), (p.max_blocks + kPrefillRangeBlocks - 1) / kPrefillRangeBlocks,
                  p.k.num_heads);
  MSA_CHECK(slots <= 0x7fffffffLL && grid.y <= 65535u && grid.z <= 65535u, kNotImplemented,
            "msa.block_scores: ", p.seqs.total_q, " tokens x ", p.max_blocks, " blocks x ", p.k.num_heads,
            " index-K heads exceed the prefill grid");
  auto kernel = scores_portable_kernel<QT, KT>;
  MSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  kernel<<<grid, kPortableWarps * 32, Tr::kSmemBytes, stream>>>(p, tile_tokens, page_shift(p.k.page_size));
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_scores_portable(const BlockScoresParams& p, cudaStream_t stream) {
  with_score_types<Fp8Tag, __nv_bfloat16, __half>(p, [&](auto* q, auto* k) {
    launch<std::remove_pointer_t<decltype(q)>, std::remove_pointer_t<decltype(k)>>(p, stream);
  });
}

}  // namespace msa::detail::cuda::indexer
