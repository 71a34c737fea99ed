// Launch of select_topk: the register capacity per lane is picked from the scores' block extent (a warp per
// row up to kTopkMaxRegBlocks blocks, a CTA per row beyond), the decode form (speculative request guess and row
// loads) from the token and request counts, the instance with the options' code (finite_only, block_map,
// out_scores) when any is given.
#include "cuda/indexer/launch.h"
#include "cuda/indexer/topk.cuh"
#include "cuda/runtime/check.cuh"
#include "cuda/runtime/device_buffer.cuh"
#include "cuda/runtime/launch.cuh"
#include "msa/error.h"

namespace msa::detail::cuda::indexer {

namespace {

// Launches with programmatic dependent launch where the code runs as sm_90+ (pdl_supported; the kernel waits
// for the previous kernel of the stream before its first read): a decode step's top-k then starts while the
// scores kernel drains instead of after it.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, unsigned grid, unsigned threads, cudaStream_t stream, const Args&... args) {
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  launch_kernel(pdl_supported(device), kernel, dim3(grid), dim3(threads), 0, stream, args...);
}

template <int CAP>
void launch_cap(const SelectTopkParams& p, bool token_fastest, int64_t rows, cudaStream_t stream) {
  // Many rows (prefill): 16 warps per CTA, so that 16 consecutive tokens of an HKT layout share each
  // 128-byte line of scores in L1. Few rows (decode, 256 at B=64): 2 warps per CTA, one CTA per SM.
  const int warps = rows >= 132 * 64 ? 16 : (rows >= 132 * 8 ? 4 : 2);
  const auto grid = static_cast<unsigned>((rows + warps - 1) / warps);
  const bool decode = p.seqs.total_q <= kTopkDecodeTokensPerRequest * static_cast<int64_t>(p.seqs.batch_size);
  const bool options = p.finite_only || p.block_map || p.out_scores;
  auto kernel = decode ? (options ? &select_topk_kernel<CAP, true, true> : &select_topk_kernel<CAP, true, false>)
                       : (options ? &select_topk_kernel<CAP, false, true> : &select_topk_kernel<CAP, false, false>);
  launch(kernel, grid, warps * 32, stream, p, token_fastest);
}

template <int C>
void launch_row_cta(const SelectTopkParams& p, bool token_fastest, int64_t rows, cudaStream_t stream) {
  const bool decode = p.seqs.total_q <= kTopkDecodeTokensPerRequest * static_cast<int64_t>(p.seqs.batch_size);
  const bool options = p.finite_only || p.block_map || p.out_scores;
  auto kernel = options ? &select_topk_row_cta_kernel<C, true> : &select_topk_row_cta_kernel<C, false>;
  launch(kernel, static_cast<unsigned>(rows), kTopkRowWarps * 32, stream, p, token_fastest, decode);
}

}  // namespace

void launch_select_topk(const SelectTopkParams& p, cudaStream_t stream) {
  const int64_t rows = p.seqs.total_q * p.num_heads;
  MSA_CHECK(rows <= 0x7fffffffLL, kNotImplemented, "msa.select_topk: argument 'scores': ", rows,
            " rows (tokens x heads) exceed the CUDA grid");
  // HKT-like layouts (tokens contiguous): consecutive warps take consecutive tokens of one head.
  const bool token_fastest = p.s_stride_token == 1 && p.s_stride_block != 1;
  if (p.max_blocks <= kTopkMaxRegBlocks) {  // a warp per row, 1..64 keys per lane
    with_keys_per_lane<1, kTopkMaxRegBlocks / 32>((p.max_blocks + 31) / 32,
                                                  [&](auto c) { launch_cap<decltype(c)::value>(p, token_fastest, rows, stream); });
  } else {  // a CTA per row, 8..64 keys per lane
    MSA_CHECK(p.max_blocks <= kTopkMaxRowBlocks, kNotImplemented, "msa.select_topk: argument 'scores': ",
              p.max_blocks, " blocks per row; the CUDA kernel takes up to ", kTopkMaxRowBlocks);
    constexpr int kRowKeys = 32 * kTopkRowWarps;
    with_keys_per_lane<8, kTopkMaxRowBlocks / kRowKeys>((p.max_blocks + kRowKeys - 1) / kRowKeys, [&](auto c) {
      launch_row_cta<decltype(c)::value>(p, token_fastest, rows, stream);
    });
  }
}

}  // namespace msa::detail::cuda::indexer
