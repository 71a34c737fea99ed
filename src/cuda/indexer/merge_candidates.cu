// Launch of merge_candidates: one warp per (token, head) row of up to kTopkMaxRegBlocks blocks, each with its row's
// keys in shared memory, as many warps per CTA as 48 KB hold (at most 8); a CTA per longer row (up to 128 KB of
// keys: the opt-in size).
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
  MSA_CHECK(p.select.max_blocks <= kTopkMaxRowBlocks, kNotImplemented, fn, ": argument 'max_blocks': the CUDA kernel "
            "takes up to ", kTopkMaxRowBlocks, " blocks per row, got ", p.select.max_blocks);
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  const int row_words = (p.select.max_blocks + 31) / 32 * 32;
  const int row_bytes = row_words * static_cast<int>(sizeof(uint32_t));
  if (p.select.max_blocks > kTopkMaxRegBlocks) {  // a CTA per row, 8..64 keys per lane
    constexpr int kRowKeys = 32 * kTopkRowWarps;
    with_keys_per_lane<8, kTopkMaxRowBlocks / kRowKeys>((p.select.max_blocks + kRowKeys - 1) / kRowKeys, [&](auto c) {
      const auto kernel = merge_candidates_row_cta_kernel<decltype(c)::value>;
      if (row_bytes > (48 << 10))
        MSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, row_bytes));
      launch_kernel(pdl_supported(device), kernel, dim3(static_cast<unsigned>(rows)), dim3(kRowKeys), row_bytes,
                    stream, p);
    });
    return;
  }
  const int warps = std::max(1, std::min(8, (48 << 10) / row_bytes));
  const int smem = warps * row_bytes;
  launch_kernel(pdl_supported(device), merge_candidates_kernel, dim3(static_cast<unsigned>((rows + warps - 1) / warps)),
                dim3(warps * 32), smem, stream, p, row_words);
}

}  // namespace msa::detail::cuda::indexer
