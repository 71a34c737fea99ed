// The 16-bit copy of the fp8 blocks the query-major tiles read (fp8_copy.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/arch/fp8.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/fp8_copy.h"
#include "cuda/prefill_sm90/tile_common.cuh"
#include "cuda/runtime/launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {

namespace {

constexpr int kWidenThreads = 256;
constexpr int kWidenCtasPerSm = 4;
// Thread t moves 8 bytes (8 values) of rows t / 16 + 16 i of K and of V: 16 lanes read a 128-byte fp8 row and
// write its 256-byte 16-bit row, whole sectors both ways.
constexpr int kRowLanes = kHeadDim / 8;
constexpr int kRowsPerPass = kWidenThreads / kRowLanes;
constexpr int kPasses = kBlockKeys / kRowsPerPass;
static_assert(kBlockKeys % kRowsPerPass == 0, "the block's rows spread evenly");

// Eight e4m3 values -> eight values of T, exactly (arch::e4m3x16_to's halves).
template <typename T>
__device__ __forceinline__ uint4 widen8(uint2 w) {
  const uint2 a = arch::e4m3x4_to_f16x4_raw(w.x), b = arch::e4m3x4_to_f16x4_raw(w.y);
  return make_uint4(arch::f16x2_raw_to<T>(a.x), arch::f16x2_raw_to<T>(a.y), arch::f16x2_raw_to<T>(b.x),
                    arch::f16x2_raw_to<T>(b.y));
}

template <typename T>
__global__ void __launch_bounds__(kWidenThreads) fp8_copy_widen_kernel(const Fp8CopyParams p) {
  arch::grid_dependency_wait();  // the tile lists' flags and the schedule's blk_cum
  arch::allow_dependent_launch();
  const int32_t hkv = p.num_kv_heads, batch = p.seqs.batch_size;
  if (blockIdx.x == 0)
    for (int32_t b = threadIdx.x; b <= batch; b += kWidenThreads) p.copy_indptr[b] = p.blk_cum[b] / hkv;
  const int c = threadIdx.x % kRowLanes, r0 = threadIdx.x / kRowLanes;
  const int64_t plane = static_cast<int64_t>(p.copy_pages) * hkv * kBlockKeys * kHeadDim;  // K's elements
  const int32_t items = p.copy_pages * hkv;
  __shared__ int32_t go;
  for (int32_t item = blockIdx.x; item < items; item += gridDim.x) {
    // The flag is cleared as it is taken, so that every flag is 0 again after the run (one CTA per item).
    if (threadIdx.x == 0) {
      go = p.flags[item];
      if (go) p.flags[item] = 0;
    }
    __syncthreads();
    const bool take = go != 0;
    __syncthreads();  // every thread read go before thread 0 writes the next item's
    if (!take) continue;
    const int32_t page = item / hkv, h = item - page * hkv;
    int lo = 0, hi = batch;  // the request: the last b with blk_cum[b] / Hkv <= page
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (p.blk_cum[mid] / hkv <= page) lo = mid; else hi = mid;
    }
    const int32_t block = page - p.blk_cum[lo] / hkv;
    const SeqView v = load_seq(p.seqs, lo);
    const int32_t pool = block < num_kv_blocks(v.kv_len) ? physical_page(p.pages, lo, block / p.page_blocks) : -1;
    if (threadIdx.x == 0) p.copy_table[page] = pool >= 0 ? page : -1;  // every flagged head writes the same
    if (pool < 0) continue;
    const int32_t valid = min(kBlockKeys, v.kv_len - block * kBlockKeys);
    const int32_t key0 = (block % p.page_blocks) * kBlockKeys;
    const uint8_t* ks = static_cast<const uint8_t*>(p.k.data) + pool * p.k.stride_page + h * p.k.stride_head +
                        key0 * p.k.stride_token + 8 * c;
    const uint8_t* vs = static_cast<const uint8_t*>(p.v.data) + pool * p.v.stride_page + h * p.v.stride_head +
                        key0 * p.v.stride_token + 8 * c;
    T* kd = static_cast<T*>(p.copy) + (static_cast<int64_t>(page) * hkv + h) * kBlockKeys * kHeadDim + 8 * c;
    T* vd = kd + plane;
    uint2 kin[kPasses], vin[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {  // every load before the first conversion
      const int r = r0 + i * kRowsPerPass;
      const bool in = r < valid;  // zeros past kv_len: those keys are masked, and P = 0 meets V = 0 there
      kin[i] = in ? *reinterpret_cast<const uint2*>(ks + r * p.k.stride_token) : make_uint2(0, 0);
      vin[i] = in ? *reinterpret_cast<const uint2*>(vs + r * p.v.stride_token) : make_uint2(0, 0);
    }
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = r0 + i * kRowsPerPass;
      *reinterpret_cast<uint4*>(kd + r * kHeadDim) = widen8<T>(kin[i]);
      *reinterpret_cast<uint4*>(vd + r * kHeadDim) = widen8<T>(vin[i]);
    }
  }
}

}  // namespace

void launch_fp8_copy_widen(const Fp8CopyParams& p, bool bf16, int sm_count, cudaStream_t stream) {
  const int32_t items = p.copy_pages * p.num_kv_heads;
  const dim3 grid(std::max(1, std::min(items, kWidenCtasPerSm * std::max(sm_count, 1))));
  if (bf16)
    launch_kernel(true, fp8_copy_widen_kernel<__nv_bfloat16>, grid, dim3(kWidenThreads), 0, stream, p);
  else
    launch_kernel(true, fp8_copy_widen_kernel<__half>, grid, dim3(kWidenThreads), 0, stream, p);
}

}  // namespace msa::detail::cuda::prefill_sm90
