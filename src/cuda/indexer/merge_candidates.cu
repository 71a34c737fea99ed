// Launch of merge_candidates: one warp per (token, head) row, each with a row of max_blocks keys in shared
// memory; as many warps per CTA as 48 KB hold (at most 8), one warp with the opt-in size for longer rows.
#include "cuda/indexer/launch.h"
#include "cuda/indexer/merge_candidates.cuh"
#include "cuda/runtime/check.cuh"
#include "cuda/runtime/launch.cuh"
#include "msa/error.h"

namespace msa::detail::cuda::indexer {

void launch_merge_candidates(const MergeCandidatesParams& p, cudaStream_t stream) {
  const char* fn = "msa.merge_candidates";
  const int64_t rows = p.select.seqs.total_q * p.select.num_heads;
  MSA_CHECK(rows <= 0x7fffffffLL, kNotImplemented, fn, ": argument 'cand_scores': ", rows,
            " rows (tokens x heads) exceed the CUDA grid");
  MSA_CHECK(p.select.max_blocks <= kTopkMaxSmemBlocks, kNotImplemented, fn, ": argument 'max_blocks': the CUDA kernel "
            "takes up to ", kTopkMaxSmemBlocks, " blocks per row, got ", p.select.max_blocks);
  const int row_words = (p.select.max_blocks + 31) / 32 * 32;
  const int row_bytes = row_words * static_cast<int>(sizeof(uint32_t));
  const int warps = std::max(1, std::min(8, (48 << 10) / row_bytes));
  const int smem = warps * row_bytes;
  if (smem > (48 << 10))
    MSA_CUDA_CHECK(cudaFuncSetAttribute(merge_candidates_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  launch_kernel(pdl_supported(device), merge_candidates_kernel, dim3(static_cast<unsigned>((rows + warps - 1) / warps)),
                dim3(warps * 32), smem, stream, p, row_words);
}

}  // namespace msa::detail::cuda::indexer
