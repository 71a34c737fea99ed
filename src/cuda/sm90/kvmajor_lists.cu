// KV-major list building and the LSE merge (see kvmajor_lists.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_scan.cuh>
#include <algorithm>
#include <type_traits>

#include "cuda/common/check.cuh"
#include "cuda/sm90/config.h"
#include "cuda/sm90/kvmajor_lists.h"
#include "cuda/sm90/sync.cuh"
#include "cuda/sm90/tile_common.cuh"

namespace msa::detail::cuda::sm90 {

namespace {

constexpr int kEntryThreads = 128;
constexpr int kScanThreads = 256;
constexpr int kMergeThreads = 256;
// CTAs of the list passes (rank, fill), which stride over the tiles: ~2 waves of 132 SMs, so that
// runs where few or no tiles go KV-major cost a few microseconds instead of one CTA a tile.
constexpr int kStrideGrid = 2048;

__device__ __forceinline__ bool kv_major_tile(const KvListParams& p, int32_t tile) {
  return tile < live_tiles(p.sched, p.seqs.batch_size) && p.kv_major[tile] != 0;
}

__device__ __forceinline__ void rank_tile(const KvListParams& p, int32_t tile) {
  const KvLists& L = p.lists;
  const TileCoord c = decode_tile(p.sched, p.seqs.batch_size, tile);
  const SeqView v = load_seq(p.seqs, c.request);
  const int32_t window = tile / L.window_tiles;
  const int32_t sub = (tile - window * L.window_tiles) / L.subwindow_tiles;
  const int64_t key_base = static_cast<int64_t>(p.lists.blk_cum[c.request]) +
                           static_cast<int64_t>(c.kv_head) * num_kv_blocks(v.kv_len);
  for (int x = threadIdx.x; x < L.list_capacity; x += blockDim.x) {
    const int32_t e = contributing_block(p.block_idx, p.bi_stride_token, p.bi_stride_head, p.bi_stride_k, v,
                                         c.chunk * p.sched.tile_tokens + x / L.topk, c.kv_head, x % L.topk, p.causal);
    int32_t key = -1, rank = -1;
    if (e >= 0 && key_base + e < L.block_keys) {
      key = window * L.key_span + sub * L.block_keys + static_cast<int32_t>(key_base + e);
      rank = atomicAdd(&L.key_count[key], 1);
    }
    const int64_t entry = static_cast<int64_t>(tile) * L.list_capacity + x;
    L.entry_key[entry] = key;
    L.entry_rank[entry] = rank;
  }
}

__global__ void __launch_bounds__(kEntryThreads) kv_rank_kernel(KvListParams p) {
  for (int32_t tile = blockIdx.x; tile < p.sched.num_tiles; tile += gridDim.x) {
    if (kv_major_tile(p, tile)) rank_tile(p, tile);
  }
}

__global__ void __launch_bounds__(kScanThreads) kv_scan_kernel(KvListParams p) {
  using Scan = cub::BlockScan<int2, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int2 carry;
  const KvLists& L = p.lists;
  const int32_t window = blockIdx.x;
  const int32_t batch = p.seqs.batch_size;
  const int32_t keys = L.key_span;
  int32_t* count = L.key_count + static_cast<int64_t>(window) * L.key_span;
  int32_t* offset = L.key_offset + static_cast<int64_t>(window) * L.key_span;
  KvWorkItem* items = L.items + static_cast<int64_t>(window) * L.item_capacity;
  if (L.window_kv_tiles[window] == 0) {  // no KV-major tile here: no key was counted
    if (threadIdx.x == 0) L.item_count[window] = 0;
    return;
  }
  if (threadIdx.x == 0) carry = make_int2(0, 0);
  __syncthreads();
  const auto add = [](int2 a, int2 b) { return make_int2(a.x + b.x, a.y + b.y); };
  for (int32_t base = 0; base < keys; base += kScanThreads) {
    const int32_t k = base + threadIdx.x;
    const int32_t n = k < keys ? count[k] : 0;
    const int2 mine = make_int2(n, (n + kKvItemTokens - 1) / kKvItemTokens);
    int2 excl, total;
    Scan(scan_tmp).ExclusiveScan(mine, excl, make_int2(0, 0), add, total);
    const int2 at = add(carry, excl);
    if (k < keys) offset[k] = at.x;
    if (mine.y > 0) {  // only keys that some entry counted: k % block_keys < blk_cum[batch]
      const int32_t kb = k % L.block_keys;
      int lo = 0, hi = batch;  // the request of the key: last b with blk_cum[b] <= kb
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (L.blk_cum[mid] <= kb) lo = mid; else hi = mid;
      }
      const int32_t local = kb - L.blk_cum[lo];
      const int32_t nblk = (L.blk_cum[lo + 1] - L.blk_cum[lo]) / p.sched.num_kv_heads;
      for (int32_t j = 0; j < mine.y; ++j) {
        const int32_t idx = at.y + j;
        if (idx >= L.item_capacity) break;
        KvWorkItem w{};
        w.request = lo;
        w.kv_head = local / nblk;
        w.block = local % nblk;
        w.start = at.x + j * kKvItemTokens;
        w.count = min(kKvItemTokens, n - j * kKvItemTokens);
        items[idx] = w;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) carry = add(carry, total);
    __syncthreads();
  }
  if (threadIdx.x == 0) L.item_count[window] = min(carry.y, L.item_capacity);
}

__device__ __forceinline__ void fill_tile(const KvListParams& p, int32_t tile) {
  const KvLists& L = p.lists;
  const TileCoord c = decode_tile(p.sched, p.seqs.batch_size, tile);
  const SeqView v = load_seq(p.seqs, c.request);
  const int32_t window = tile / L.window_tiles;
  const int64_t window_entries = static_cast<int64_t>(L.window_tiles) * L.list_capacity;
  for (int x = threadIdx.x; x < L.list_capacity; x += blockDim.x) {
    const int64_t entry = static_cast<int64_t>(tile) * L.list_capacity + x;
    const int32_t rank = L.entry_rank[entry];
    if (rank < 0) continue;
    const int32_t token = v.qo_start + c.chunk * p.sched.tile_tokens + x / L.topk;
    const int64_t local_entry = entry - window * window_entries;
    L.pairs[window * window_entries + L.key_offset[L.entry_key[entry]] + rank] =
        make_int2(token, static_cast<int32_t>(local_entry));
  }
}

__global__ void __launch_bounds__(kEntryThreads) kv_fill_kernel(KvListParams p) {
  for (int32_t tile = blockIdx.x; tile < p.sched.num_tiles; tile += gridDim.x) {
    if (kv_major_tile(p, tile)) fill_tile(p, tile);
  }
}

// 4 consecutive elements (8 bytes) <-> float4.
template <typename Elem>
__device__ __forceinline__ float4 unpack4(uint2 raw) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(a.x, a.y, b.x, b.y);
  } else {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    return make_float4(a.x, a.y, b.x, b.y);
  }
}

template <typename Elem>
__device__ __forceinline__ void store4(Elem* p, float4 v) {
  uint2 raw;
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    raw = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  } else {
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    raw = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  }
  *reinterpret_cast<uint2*>(p) = raw;
}

// Slots of a row whose partials are loaded before any is used: the merge reads ~8.6 GB at M3-TP1
// P-32K `random`, and one 256-byte row read at a time per warp (a dependent chain of 16 loads per
// row) left it latency-bound; 16 loads in flight per warp make it bandwidth-bound.
constexpr int kMergeSlots = 16;
static_assert(kMaxTopk <= 64 && kMaxTopk % kMergeSlots == 0, "a merge warp holds 64 slots' lse in two registers");

// A warp merges kMergeRowsInFlight (token, head) rows at a time, and issues every load of them (slot
// ranks, lse values, the first kMergeSlots partial rows) before it uses any: one round trip per pair of
// rows, 8 KB in flight per warp. The first merge read a row in three dependent round trips (ranks, then
// the lse of the ranked slots, then the rows of the weighted slots), one row after the other, and moved
// the 8.6 GB of M3-TP1 P-32K `random` at 2.8 TB/s; this one took that workload from 230.4 to 260.2
// TFLOP/s, P-chunk from 197.8 to 238.2 (bench/results/prefill-20261129-f6c2538-merge-variants.md, same
// run, bitwise equal outputs). Partial rows of slots without a partial are read too (they lie inside the
// window's buffer) but never used: a slot of weight 0 is skipped, not multiplied, so garbage there can
// not reach the sum; sums are taken in slot order, so the result does not depend on timing.
constexpr int kMergeRowsInFlight = 2;

template <typename Elem>
__device__ __forceinline__ void merge_tile(const KvMergeParams& p, int32_t local_tile) {
  const KvLists& L = p.lists;
  const int32_t tile = p.window * L.window_tiles + local_tile;
  if (tile >= live_tiles(p.sched, p.seqs.batch_size) || p.kv_major[tile] == 0) return;
  const TileCoord c = decode_tile(p.sched, p.seqs.batch_size, tile);
  const SeqView v = load_seq(p.seqs, c.request);
  const int32_t group = 1 << p.group_shift;
  const int lane = threadIdx.x & 31;
  const int64_t slot_stride = static_cast<int64_t>(group) * kHeadDim;
  constexpr int kWarps = kMergeThreads / 32;
  constexpr int R = kMergeRowsInFlight;
  for (int r0 = threadIdx.x >> 5; r0 < kTileRows; r0 += kWarps * R) {
    bool valid[R];
    int32_t rank_lo[R], rank_hi[R], head[R], qi[R];
    float lse_lo[R], lse_hi[R];
    int64_t local0[R];
    uint2 raw[R][kMergeSlots];
#pragma unroll
    for (int k = 0; k < R; ++k) {  // issue every load of the R rows
      const int r = r0 + k * kWarps;
      const int32_t i = r >> p.group_shift;
      head[k] = r & (group - 1);
      qi[k] = c.chunk * p.sched.tile_tokens + i;
      valid[k] = r < kTileRows && qi[k] < v.qo_len;  // warp-uniform
      const int64_t entry0 = static_cast<int64_t>(tile) * L.list_capacity + i * L.topk;
      local0[k] = static_cast<int64_t>(local_tile) * L.list_capacity + i * L.topk;
      rank_lo[k] = rank_hi[k] = -1;
      lse_lo[k] = lse_hi[k] = -INFINITY;
      if (!valid[k]) continue;
      if (lane < L.topk) {
        rank_lo[k] = L.entry_rank[entry0 + lane];
        lse_lo[k] = L.part_lse[(local0[k] + lane) * group + head[k]];
      }
      if (lane + 32 < L.topk) {
        rank_hi[k] = L.entry_rank[entry0 + lane + 32];
        lse_hi[k] = L.part_lse[(local0[k] + lane + 32) * group + head[k]];
      }
      const Elem* src = static_cast<const Elem*>(L.part_o) + (local0[k] * group + head[k]) * kHeadDim + 4 * lane;
#pragma unroll
      for (int j = 0; j < kMergeSlots; ++j)
        raw[k][j] = j < L.topk ? *reinterpret_cast<const uint2*>(src + j * slot_stride) : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (!valid[k]) continue;
      // Lane l weighs slots l and l + 32 (exp2 of lse - max); the sums take them by shuffle.
      float w_lo = rank_lo[k] >= 0 ? lse_lo[k] : -INFINITY, w_hi = rank_hi[k] >= 0 ? lse_hi[k] : -INFINITY;
      float mx = fmaxf(w_lo, w_hi);
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, d));
      const float base = mx == -INFINITY ? 0.f : mx;
      w_lo = fast_exp2(w_lo - base);  // -inf -> 0
      w_hi = fast_exp2(w_hi - base);
      const Elem* src = static_cast<const Elem*>(L.part_o) + (local0[k] * group + head[k]) * kHeadDim + 4 * lane;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      float wsum = 0.f;
      for (int s0 = 0; s0 < L.topk; s0 += kMergeSlots) {
        if (s0 > 0) {  // top-k above kMergeSlots: the further slots, a chunk at a time
#pragma unroll
          for (int j = 0; j < kMergeSlots; ++j)
            raw[k][j] = s0 + j < L.topk ? *reinterpret_cast<const uint2*>(src + (s0 + j) * slot_stride)
                                        : make_uint2(0u, 0u);
        }
#pragma unroll
        for (int j = 0; j < kMergeSlots; ++j) {  // slot order
          const int sl = s0 + j;                 // <= 63: w_hi covers slots 32..63
          float w = __shfl_sync(~0u, sl < 32 ? w_lo : w_hi, sl & 31);
          if (sl >= L.topk) w = 0.f;
          wsum += w;
          // A weight-0 slot's row may be garbage: skipped, never multiplied. Any other weight, NaN
          // included (a NaN lse), is multiplied: NaN stays NaN.
          if (w != 0.f) {
            const float4 x = unpack4<Elem>(raw[k][j]);
            acc.x = fmaf(w, x.x, acc.x);
            acc.y = fmaf(w, x.y, acc.y);
            acc.z = fmaf(w, x.z, acc.z);
            acc.w = fmaf(w, x.w, acc.w);
          }
        }
      }
      const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
      const int64_t tok = static_cast<int64_t>(v.qo_start) + qi[k];
      const int64_t hq = static_cast<int64_t>(c.kv_head) * group + head[k];
      store4(static_cast<Elem*>(p.o) + tok * p.o_stride_token + hq * p.o_stride_head + 4 * lane,
             make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
      if (p.lse != nullptr && lane == 0)
        p.lse[tok * p.lse_stride_token + hq * p.lse_stride_head] =
            wsum > 0.f ? (base + log2f(wsum)) * 0.69314718055994531f : -INFINITY;
    }
  }
}

// One CTA per tile of the window; lane l merges dims 4l..4l+3. A window without KV-major tiles returns
// at once. (A grid of 2048 CTAs striding over the tiles ran 3.19 ms at M3-TP1 P-32K `random` where one
// CTA a tile had run 2.90 ms, in separate runs.) Held to 128 registers: 2 CTAs, 16 warps per SM (142
// unbounded, i.e. 1 CTA per SM).
template <typename Elem>
__global__ void __launch_bounds__(kMergeThreads, 2) kv_merge_kernel(KvMergeParams p) {
  if (p.lists.window_kv_tiles[p.window] == 0) return;
  merge_tile<Elem>(p, blockIdx.x);
}

}  // namespace

void launch_kv_rank(const KvListParams& p, cudaStream_t stream) {
  kv_rank_kernel<<<std::min(p.sched.num_tiles, kStrideGrid), kEntryThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

void launch_kv_scan(const KvListParams& p, cudaStream_t stream) {
  kv_scan_kernel<<<p.lists.num_windows, kScanThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

void launch_kv_fill(const KvListParams& p, cudaStream_t stream) {
  kv_fill_kernel<<<std::min(p.sched.num_tiles, kStrideGrid), kEntryThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

void launch_kv_merge(const KvMergeParams& p, cudaStream_t stream) {
  const int32_t first = p.window * p.lists.window_tiles;
  const int32_t tiles = std::min(p.lists.window_tiles, p.sched.num_tiles - first);
  if (tiles <= 0) return;
  const bool bf16 = p.dtype == ScalarType::kBF16;
  bf16 ? kv_merge_kernel<__nv_bfloat16><<<tiles, kMergeThreads, 0, stream>>>(p)
       : kv_merge_kernel<__half><<<tiles, kMergeThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::detail::cuda::sm90
