// The decode kernels' L2 prefetch before their PDL wait (KernelParams::prewait_prefetch). Launched with PDL,
// a decode grid is resident while the previous kernel of the stream runs; its first trips (the block indexes
// of its guessed token rows with the request's lengths, then the selected blocks' page ids) would be cold
// DRAM reads after the wait. Warp 0 names their lines to the L2 first. A prefetch reaches neither registers
// nor the L1, and the L2 is the device's point of coherence, so a line the previous kernel writes after it is
// read fresh after the wait: nothing is read early (docs/decode.md).
#pragma once

#include <cstdint>

#include "cuda/arch/pdl.cuh"
#include "cuda/decode/kernel_params.cuh"

namespace msa::detail::cuda::decode {

// Lane `lane` of warp 0, for request b, KV head g and the guessed token rows [tok, tok + ntok): their index
// rows, the request's lengths, and the first prefetch_page_entries entries of its page-table row.
__device__ __forceinline__ void prefetch_first_trips(const KernelParams& kp, int lane, int b, int g, int64_t tok,
                                                     int ntok) {
  const AttentionParams& p = kp.a;
  if (p.block_idx != nullptr) {
    for (int e = lane; e < ntok * p.topk; e += 32) {  // one lane per entry (a row is one line when bi_stride_k = 1)
      const int i = e / p.topk, k = e - i * p.topk;
      if (tok + i < p.seqs.total_q)
        arch::prefetch_l2(p.block_idx + (tok + i) * p.bi_stride_token + static_cast<int64_t>(g) * p.bi_stride_head +
                          static_cast<int64_t>(k) * p.bi_stride_k);
    }
  }
  if (lane == 31) arch::prefetch_l2(p.seqs.qo_indptr + b);
  if (lane == 30) arch::prefetch_l2(p.seqs.kv_lens + b);
  if (lane == 29 && p.seqs.qo_offset) arch::prefetch_l2(p.seqs.qo_offset + b);
  if (lane == 28 && p.pages.indptr) arch::prefetch_l2(p.pages.indptr + b);
  // Entries 32i of the dense row and its last (a row need not start on a line); n = 0 for the flat form.
  const int n = kp.prefetch_page_entries;
  const int32_t* row = p.pages.table + static_cast<int64_t>(b) * p.pages.row_stride;
  for (int i = lane; i <= (n + 31) / 32 && n > 0; i += 32) arch::prefetch_l2(row + min(32 * i, n - 1));
}

}  // namespace msa::detail::cuda::decode
