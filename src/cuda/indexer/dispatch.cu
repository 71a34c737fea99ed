// The indexer entry points of the CUDA backend (core/backend.h): pick a kernel family from what the host
// knows (token and request counts, device, dtypes), never from device lengths, and launch on `stream`.
#include "core/backend.h"
#include "core/knobs.h"
#include "cuda/runtime/check.cuh"
#include "cuda/runtime/device_buffer.cuh"
#include "cuda/indexer/config.h"
#include "cuda/indexer/launch.h"
#include "msa/error.h"

namespace msa::detail::cuda {

namespace {

int device_of(const void* ptr, const char* fn) {
  cudaPointerAttributes attr{};
  MSA_CUDA_CHECK(cudaPointerGetAttributes(&attr, ptr));
  MSA_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged, kValue, fn,
            ": expected CUDA device memory, got a pointer of memory type ", static_cast<int>(attr.type));
  return attr.device;
}

}  // namespace

namespace indexer {

int page_shift(int page_size) {
  if (page_size <= 0 || (page_size & (page_size - 1))) return -1;
  int s = 0;
  while ((1 << s) < page_size) ++s;
  return s;
}

}  // namespace indexer

void block_scores(const BlockScoresParams& p, void* stream) {
  using namespace indexer;
  const char* fn = "msa.block_scores";
  MSA_CHECK(p.block_size == kBlock, kNotImplemented, fn, ": the CUDA kernels score blocks of ", kBlock,
            " keys, got block_size = ", p.block_size);
  MSA_CHECK(p.head_dim == kHeadDim, kNotImplemented, fn, ": argument 'q': the CUDA indexer is built for head_dim = ",
            kHeadDim, ", got ", p.head_dim);
  MSA_CHECK(p.seqs.total_q < (int64_t{1} << 31), kNotImplemented, fn, ": argument 'q': ", p.seqs.total_q,
            " tokens exceed the kernels' 32-bit token count");
  const int device = device_of(p.q, fn);
  DeviceGuard guard(device);
  auto st = static_cast<cudaStream_t>(stream);
  const int64_t T = p.seqs.total_q, B = p.seqs.batch_size;
  const int G = p.num_heads / p.k.num_heads;
  const bool fp8 = p.k_dtype == ScalarType::kF8E4M3;
  const bool sm90 = compute_capability(device) == 90;
  if (T <= kStreamMaxTokensPerRequest * B) {
    MSA_CHECK(B <= 0x7fffffffLL, kNotImplemented, fn, ": ", B, " requests exceed the CUDA grid");
    // MSA_INDEXER_DECODE=stream and MSA_INDEXER_PREFILL=portable (core/knobs.h) take the kernels of the
    // other GPUs on sm_90 too.
    const bool ring = sm90 && G <= kRingMaxGroup && !knobs::indexer_stream_decode(fn) && ring_scores_available(device);
    if (!ring || !launch_scores_ring(p, device, st)) launch_scores_stream(p, st);
  } else if (G <= kSm90Rows && sm90 && !knobs::indexer_portable_prefill(fn) &&
             (fp8 ? sm90_fp8_scores_available(device) : sm90_scores_available(device))) {
    // fp8 keys: fp8 wgmma with e4m3 queries (scores_sm90_fp8.cuh). MSA_INDEXER_PREFILL=portable takes the
    // exact path (keys converted to fp16).
    if (fp8)
      launch_scores_sm90_fp8(p, st);
    else
      launch_scores_sm90(p, st);
  } else if (G <= kPortableRows) {
    launch_scores_portable(p, st);
  } else {
    launch_scores_stream(p, st);  // head groups wider than a prefill tile: correct, not tuned
  }
}

void select_topk(const SelectTopkParams& p, void* stream) {
  using namespace indexer;
  const char* fn = "msa.select_topk";
  MSA_CHECK(p.block_size == kBlock, kNotImplemented, fn, ": the CUDA kernel selects blocks of ", kBlock,
            " keys, got block_size = ", p.block_size);
  MSA_CHECK(p.topk >= 1 && p.topk <= kTopkMaxK, kValue, fn, ": argument 'topk': expected 1..", kTopkMaxK, ", got ",
            p.topk);
  DeviceGuard guard(device_of(p.scores, fn));
  launch_select_topk(p, static_cast<cudaStream_t>(stream));
}

void merge_candidates(const MergeCandidatesParams& p, void* stream) {
  using namespace indexer;
  const char* fn = "msa.merge_candidates";
  MSA_CHECK(p.select.topk >= 1 && p.select.topk <= kTopkMaxK, kValue, fn, ": argument 'topk': expected 1..", kTopkMaxK,
            ", got ", p.select.topk);
  DeviceGuard guard(device_of(p.scores, fn));
  launch_merge_candidates(p, static_cast<cudaStream_t>(stream));
}

}  // namespace msa::detail::cuda
