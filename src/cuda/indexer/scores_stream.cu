// Launch of the decode (streaming) block-scores kernel: one instantiation per (q dtype, key dtype).
#include <type_traits>

#include "cuda/runtime/check.cuh"
#include "cuda/indexer/launch.h"
#include "cuda/indexer/scores_stream.cuh"
#include "msa/error.h"

namespace msa::detail::cuda::indexer {

namespace {

template <typename QT, typename KT>
void launch(const BlockScoresParams& p, cudaStream_t stream) {
  const int G = p.num_heads / p.k.num_heads;
  const int head_chunks = G > kStreamCols ? (G + kStreamCols - 1) / kStreamCols : 1;
  const dim3 grid(p.seqs.batch_size, (p.max_blocks + kStreamBlocksPerCta - 1) / kStreamBlocksPerCta,
                  p.k.num_heads * head_chunks);
  MSA_CHECK(grid.y <= 65535u && grid.z <= 65535u, kNotImplemented, "msa.block_scores: argument 'out': ",
            p.max_blocks, " blocks x ", p.k.num_heads * head_chunks, " head chunks exceed the decode grid");
  scores_stream_kernel<QT, KT><<<grid, kStreamWarps * 32, 0, stream>>>(p, head_chunks, page_shift(p.k.page_size));
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_scores_stream(const BlockScoresParams& p, cudaStream_t stream) {
  with_score_types<Fp8Tag, __nv_bfloat16, __half>(p, [&](auto* q, auto* k) {
    launch<std::remove_pointer_t<decltype(q)>, std::remove_pointer_t<decltype(k)>>(p, stream);
  });
}

}  // namespace msa::detail::cuda::indexer
