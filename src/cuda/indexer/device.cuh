// Device helpers shared by the indexer kernels: request and page-table lookups that never read out of
// bounds whatever the device values, and fp8 / fp16 conversions (the instructions they issue are in
// cuda/arch/).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/params.h"
#include "cuda/arch/fp8.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/indexer/config.h"

namespace msa::detail::cuda::indexer {

inline constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T clamp_to(T v, T lo, T hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}
__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---------------------------------------------------------------------------------------------
// Requests. Device lengths are unchecked (graph replay): every value is clamped before use.
struct Request {
  int64_t q_begin = 0;  // first token of the request in [0, total_q]
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t offset = 0;   // absolute position of the first query
};

// A request's values as stored (the loads alone), and the clamped Request made from them: code that wants
// the loads in flight across other work issues the first and finishes later.
struct RequestRaw {
  int32_t q0 = 0, q1 = 0, kv_len = 0, offset = 0;
};

__device__ __forceinline__ RequestRaw load_request_raw(const SeqParams& s, int b) {
  return {s.qo_indptr[b], s.qo_indptr[b + 1], s.kv_lens[b], s.qo_offset ? s.qo_offset[b] : 0};
}

__device__ __forceinline__ Request finish_request(const SeqParams& s, const RequestRaw& raw) {
  Request r;
  const int64_t T = s.total_q;
  const int64_t q0 = clamp_to<int64_t>(raw.q0, 0, T);
  const int64_t q1 = clamp_to<int64_t>(raw.q1, q0, T);
  r.q_begin = q0;
  r.q_len = q1 - q0;
  r.kv_len = raw.kv_len > 0 ? raw.kv_len : 0;
  r.offset = s.qo_offset ? static_cast<int64_t>(raw.offset) : r.kv_len - r.q_len;
  return r;
}

__device__ __forceinline__ Request load_request(const SeqParams& s, int b) {
  return finish_request(s, load_request_raw(s, b));
}

// Keys [0, visible_end) are visible to the query at absolute position pos.
__device__ __forceinline__ int64_t visible_end(const Request& r, int64_t pos, bool causal) {
  const int64_t hi = causal ? (pos + 1 < r.kv_len ? pos + 1 : r.kv_len) : r.kv_len;
  return hi > 0 ? hi : 0;
}

// Largest b in [0, n) with key(b) <= x (key non-decreasing in b), or -1; the whole warp calls it and
// gets the same answer. Two rounds of 32 probes cover 1024 requests; each round is one load per lane.
template <typename Key>
__device__ __forceinline__ int warp_last_le(int n, int64_t x, Key key) {
  const int lane = threadIdx.x & 31;
  int lo = 0, len = n;
  while (len > 32) {
    const int step = (len + 31) / 32;
    const int idx = lo + lane * step;
    const bool ok = idx < lo + len && key(idx) <= x;
    const unsigned m = __ballot_sync(kFullMask, ok);
    if (m == 0) return -1;
    lo += (31 - __clz(m)) * step;
    len = min(step, n - lo);
  }
  const bool ok = lane < len && key(lo + lane) <= x;
  const unsigned m = __ballot_sync(kFullMask, ok);
  return m ? lo + 31 - __clz(m) : -1;
}

// Token tiles of a ragged batch without host lengths: request b's tiles start at slot
// floor(qo_indptr[b] / tile) + b, which never overlaps request b+1's (see docs/indexer.md), so a grid of
// floor(total_q / tile) + B slots covers every tile. Returns b (or -1) and the tile index within it.
__device__ __forceinline__ int slot_to_request(const SeqParams& s, int64_t slot, int tile_tokens, int64_t* tile) {
  const int64_t T = s.total_q;
  auto start = [&](int b) { return clamp_to<int64_t>(s.qo_indptr[b], 0, T) / tile_tokens + b; };
  const int b = warp_last_le(s.batch_size, slot, start);
  if (b >= 0) *tile = slot - start(b);
  return b;
}

// ---------------------------------------------------------------------------------------------
// Paged keys.
struct PageRow {
  const int32_t* entries = nullptr;
  int64_t len = 0;
};

__device__ __forceinline__ PageRow page_row(const PageTableParams& pt, int b) {
  PageRow r;
  if (pt.indptr) {
    const int64_t cap = pt.row_capacity;
    const int64_t s = clamp_to<int64_t>(pt.indptr[b], 0, cap);
    const int64_t e = clamp_to<int64_t>(pt.indptr[b + 1], s, cap);
    r.entries = pt.table + s;
    r.len = e - s;
  } else {
    r.entries = pt.table + static_cast<int64_t>(b) * pt.row_stride;
    r.len = pt.row_capacity;
  }
  return r;
}

// Page-table entry of logical page lp as stored, or -1 outside the row; page_in_pool checks it against
// the pool. Split so that a lookup can be issued early and checked later.
__device__ __forceinline__ int page_entry(const PageRow& r, int64_t lp) {
  return lp >= 0 && lp < r.len ? __ldg(r.entries + lp) : -1;
}
__device__ __forceinline__ int page_in_pool(int entry, int num_pages) {
  return entry >= 0 && entry < num_pages ? entry : -1;
}
// Physical page of logical page lp, or -1 when the entry is outside the row or the pool.
__device__ __forceinline__ int page_of(const PageRow& r, int64_t lp, int num_pages) {
  return page_in_pool(page_entry(r, lp), num_pages);
}

// Logical page and slot of key j: a shift for power-of-two page sizes, a division otherwise.
struct PageDiv {
  int size = 1;
  int shift = -1;  // log2(size) when size is a power of two
  __device__ __forceinline__ void split(int64_t j, int64_t* lp, int* off) const {
    if (shift >= 0) {
      *lp = j >> shift;
      *off = static_cast<int>(j & (size - 1));
    } else {
      *lp = j / size;
      *off = static_cast<int>(j - *lp * size);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// 32-bit word i (0..3) of a 16-byte load; i is a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// ---------------------------------------------------------------------------------------------
// fp8 e4m3 keys become fp16 for the mma (arch/fp8.cuh: e4m3x4_to_f16x4_raw, e4m3_f16_unscale).
// Query rows into fp16 range for the fp8 paths (arch/fp8.cuh).
using arch::amax_of;
using arch::chunk_amax;
using arch::chunk_to_scaled_f16;
using arch::exp2_int;
using arch::fp16_row_exponent;
using arch::to_float2;
using arch::ld_shared_f32x2;
using arch::st_shared_v4;

__device__ __forceinline__ float warp_max_xor(float v, int from, int to) {
  for (int m = from; m <= to; m <<= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

}  // namespace msa::detail::cuda::indexer
