// msa.write_cache on the GPU (contract §7): row (i, h) of src goes to slot slots[i] of the paged cache,
// copied, or quantized to e4m3 with a per-tensor or a per-row scale.
//
// The slot ids are read on the device only (no host synchronization: capturable in a CUDA graph, and a
// replay writes wherever the ids then say); a negative id or one past the cache skips its row. A row is
// served by a group of threads, each with 16-byte chunks: a plain copy moves 8 elements per chunk, an fp8
// row 16 (two 16-byte loads of src, one 16-byte store of e4m3). Tensors not 16-byte aligned (pointer,
// strides, or a row length not a whole number of chunks) take the same kernels with one element per chunk.
// The per-row scale is the max of the group, reduced with warp shuffles; the group then re-reads its
// chunks (from L1) to convert them.
//
// The conversion is __nv_cvt_float2_to_fp8x2 with __NV_SATFINITE: cvt.rn.satfinite.e4m3x2.f32 on sm_89+,
// cuda_fp8.h's software rounding on sm_80 (the same rounding: nearest even, saturating at +-448). The
// quotient src / scale is __fdiv_rn, IEEE division, as the CPU backend's, so both write the same bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/backend.h"
#include "cuda/arch/memory.cuh"
#include "cuda/runtime/check.cuh"

namespace msa::detail::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 8192;
constexpr uint16_t kE4m3NaN = 0x7f;

// The slot of token i, or -1 when its row is skipped (negative, or past the cache).
__device__ __forceinline__ int64_t slot_of(const WriteCacheParams& p, int64_t i) {
  const int64_t at = i * p.slot_stride;
  const int64_t s = p.slots_i64 ? static_cast<const int64_t*>(p.slots)[at] : static_cast<const int32_t*>(p.slots)[at];
  return s >= 0 && s < p.num_pages * p.page_size ? s : -1;
}

__device__ __forceinline__ int64_t cache_offset(const WriteCacheParams& p, int64_t slot, int h) {
  return (slot / p.page_size) * p.stride_page + h * p.stride_head + (slot % p.page_size) * p.stride_token;
}

// A plain copy of 2-byte elements: one thread per chunk of 8 elements (kVec) or of one.
template <bool kVec>
__global__ void copy_rows_kernel(const WriteCacheParams p) {
  constexpr int kElems = kVec ? 8 : 1;
  const int chunks = p.dim / kElems;
  const int64_t n = p.num_tokens * p.num_heads * chunks;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(idx % chunks);
    const int64_t row = idx / chunks;
    const int h = static_cast<int>(row % p.num_heads);
    const int64_t i = row / p.num_heads;
    const int64_t slot = slot_of(p, i);
    if (slot < 0) continue;
    const uint16_t* src = static_cast<const uint16_t*>(p.src) + i * p.src_stride_token + h * p.src_stride_head;
    uint16_t* dst = static_cast<uint16_t*>(p.cache) + cache_offset(p, slot, h);
    if constexpr (kVec)
      reinterpret_cast<uint4*>(dst)[c] = arch::ld_global_nc_v4(src + c * kElems);
    else
      dst[c] = src[c];
  }
}

__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// Two floats to two e4m3 bytes (x in the low byte); NaN as 0x7f whatever its sign.
__device__ __forceinline__ uint16_t e4m3x2(float x, float y) {
  uint16_t b = __nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3);
  if (isnan(x)) b = static_cast<uint16_t>((b & 0xff00u) | kE4m3NaN);
  if (isnan(y)) b = static_cast<uint16_t>((b & 0x00ffu) | (kE4m3NaN << 8));
  return b;
}

__device__ __forceinline__ float finite_abs(float x) { return isfinite(x) ? fabsf(x) : 0.f; }

// One chunk of a row: 16 elements of T (kVec) or one.
template <typename T, bool kVec>
struct Chunk {
  static constexpr int kElems = kVec ? 16 : 1;
  using Pair = typename std::conditional<std::is_same<T, __half>::value, __half2, __nv_bfloat162>::type;
  float v[kElems];

  __device__ __forceinline__ void load(const T* src) {
    if constexpr (kVec) {
      for (int half = 0; half < 2; ++half) {
        const uint4 raw = arch::ld_global_nc_v4(src + half * 8);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = to_float2(*reinterpret_cast<const Pair*>(&w[k]));
          v[half * 8 + 2 * k] = f.x;
          v[half * 8 + 2 * k + 1] = f.y;
        }
      }
    } else {
      v[0] = to_float(*src);
    }
  }

  __device__ __forceinline__ float amax() const {
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < kElems; ++k) m = fmaxf(m, finite_abs(v[k]));
    return m;
  }

  __device__ __forceinline__ void store_e4m3(uint8_t* dst, float scale) const {
    if constexpr (kVec) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t lo = e4m3x2(__fdiv_rn(v[4 * k], scale), __fdiv_rn(v[4 * k + 1], scale));
        const uint32_t hi = e4m3x2(__fdiv_rn(v[4 * k + 2], scale), __fdiv_rn(v[4 * k + 3], scale));
        w[k] = lo | (hi << 16);
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      *dst = static_cast<uint8_t>(e4m3x2(__fdiv_rn(v[0], scale), 0.f) & 0xffu);
    }
  }
};

// Quantization to e4m3: a group of `group` threads (a power of two <= 32) per row, so that the per-row
// scale (kPerSlot) is a shuffle reduction within the group. The loop over rows is uniform per warp: every
// lane reaches the shuffles.
template <typename T, bool kVec, bool kPerSlot>
__global__ void quantize_rows_kernel(const WriteCacheParams p, int group) {
  using C = Chunk<T, kVec>;
  const int chunks = p.dim / C::kElems;
  const int lane = threadIdx.x & 31, lg = lane & (group - 1);
  const int rows_per_warp = 32 / group;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t base = warp * rows_per_warp; base < rows; base += warps * rows_per_warp) {
    const int64_t row = base + lane / group;
    const int h = static_cast<int>(row % p.num_heads);
    const int64_t i = row / p.num_heads;
    const int64_t slot = row < rows ? slot_of(p, i) : -1;
    const T* src = static_cast<const T*>(p.src) + i * p.src_stride_token + h * p.src_stride_head;
    uint8_t* dst = static_cast<uint8_t*>(p.cache) + (slot >= 0 ? cache_offset(p, slot, h) : 0);
    float scale = p.scale;
    if constexpr (kPerSlot) {
      float amax = 0.f;
      if (slot >= 0)
        for (int c = lg; c < chunks; c += group) {
          C chunk;
          chunk.load(src + c * C::kElems);
          amax = fmaxf(amax, chunk.amax());
        }
      for (int off = group / 2; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      scale = __fdiv_rn(amax, 448.0f);
      if (!(scale > 0.f)) scale = 1.f;
      if (slot >= 0 && lg == 0)
        p.slot_scale[(slot / p.page_size) * p.ss_stride_page + h * p.ss_stride_head +
                     (slot % p.page_size) * p.ss_stride_token] = scale;
    }
    if (slot < 0) continue;
    for (int c = lg; c < chunks; c += group) {
      C chunk;
      chunk.load(src + c * C::kElems);
      chunk.store_e4m3(dst + c * C::kElems, scale);
    }
  }
}

bool aligned16(const void* ptr, int elem_bytes, std::initializer_list<int64_t> strides) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16) return false;
  for (int64_t s : strides)
    if ((s * elem_bytes) % 16) return false;
  return true;
}

unsigned grid_for(int64_t threads) {
  return static_cast<unsigned>(std::clamp<int64_t>((threads + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

template <typename T, bool kVec>
void launch_quantize(const WriteCacheParams& p, cudaStream_t stream) {
  const int chunks = p.dim / Chunk<T, kVec>::kElems;
  int group = 1;
  while (group < chunks && group < 32) group *= 2;
  const int64_t rows = p.num_tokens * p.num_heads;
  const unsigned grid = grid_for((rows + 32 / group - 1) / (32 / group) * 32);
  if (p.slot_scale)
    quantize_rows_kernel<T, kVec, true><<<grid, kThreads, 0, stream>>>(p, group);
  else
    quantize_rows_kernel<T, kVec, false><<<grid, kThreads, 0, stream>>>(p, group);
}

template <typename T>
void launch_quantize(const WriteCacheParams& p, cudaStream_t stream) {
  const bool vec = p.dim % 16 == 0 && aligned16(p.src, 2, {p.src_stride_token, p.src_stride_head}) &&
                   aligned16(p.cache, 1, {p.stride_page, p.stride_head, p.stride_token});
  if (vec)
    launch_quantize<T, true>(p, stream);
  else
    launch_quantize<T, false>(p, stream);
}

}  // namespace

void write_cache(const WriteCacheParams& p, void* stream) {
  const int64_t rows = p.num_tokens * p.num_heads;
  if (rows == 0 || p.dim == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.cache_dtype == p.src_dtype) {
    const bool vec = p.dim % 8 == 0 && aligned16(p.src, 2, {p.src_stride_token, p.src_stride_head}) &&
                     aligned16(p.cache, 2, {p.stride_page, p.stride_head, p.stride_token});
    if (vec)
      copy_rows_kernel<true><<<grid_for(rows * (p.dim / 8)), kThreads, 0, s>>>(p);
    else
      copy_rows_kernel<false><<<grid_for(rows * p.dim), kThreads, 0, s>>>(p);
  } else if (p.src_dtype == ScalarType::kBF16) {
    launch_quantize<__nv_bfloat16>(p, s);
  } else {
    launch_quantize<__half>(p, s);
  }
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::detail::cuda
