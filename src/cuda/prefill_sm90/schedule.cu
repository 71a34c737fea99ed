// Tile schedule and per-tile block lists of the Hopper prefill (see schedule.h).
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/arch/pdl.cuh"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/schedule.h"
#include "cuda/prefill_sm90/tile_common.cuh"
#include "cuda/runtime/check.cuh"
#include "cuda/runtime/launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {

namespace {

constexpr int kScheduleThreads = 256;
constexpr int kListThreads = 256;
constexpr int32_t kNoBlock = 0x7FFFFFFF;
constexpr int kListWarps = 4;                 // tiles per CTA of the warp kernel
constexpr int kListWarpMaxEntries = 32 * 16;  // entries (tile tokens x top-k) the warp kernel sorts

// Sums in 64 bits, stored saturated at INT32_MAX: device lengths the plan did not see (an unvalidated call) may
// add up past int32, and every reader relies on tile_cum and blk_cum being non-negative and non-decreasing (the
// plan's tile count, at most INT32_MAX / 2, bounds the tiles that run).
__global__ void __launch_bounds__(kScheduleThreads) tile_schedule_kernel(SeqParams seqs, int32_t tile_tokens,
                                                                         int32_t num_kv_heads, int32_t* tile_cum,
                                                                         int32_t* blk_cum, int32_t* counters,
                                                                         int32_t num_counters) {
  using Scan = cub::BlockScan<longlong2, kScheduleThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ longlong2 carry;
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  arch::allow_dependent_launch();
  for (int i = threadIdx.x; i < num_counters; i += blockDim.x) counters[i] = 0;
  if (threadIdx.x == 0) {
    carry = make_longlong2(0, 0);
    tile_cum[0] = 0;
    blk_cum[0] = 0;
  }
  __syncthreads();
  const auto add = [](longlong2 a, longlong2 b) { return make_longlong2(a.x + b.x, a.y + b.y); };
  const auto saturated = [](long long x) { return static_cast<int32_t>(min(x, static_cast<long long>(INT32_MAX))); };
  for (int base = 0; base < seqs.batch_size; base += kScheduleThreads) {
    const int b = base + threadIdx.x;
    longlong2 n = make_longlong2(0, 0);
    if (b < seqs.batch_size) {
      const SeqView v = load_seq(seqs, b);
      n = make_longlong2(static_cast<long long>((v.qo_len + tile_tokens - 1) / tile_tokens) * num_kv_heads,
                         static_cast<long long>(num_kv_blocks(v.kv_len)) * num_kv_heads);
    }
    longlong2 incl, total;
    Scan(scan_tmp).InclusiveScan(n, incl, add, total);
    if (b < seqs.batch_size) {
      tile_cum[b + 1] = saturated(carry.x + incl.x);
      blk_cum[b + 1] = saturated(carry.y + incl.y);
    }
    __syncthreads();
    if (threadIdx.x == 0) carry = add(carry, total);
    __syncthreads();
  }
}

// A tile's entry count and path; KV-major tiles are also counted per window (the KV-major launches
// of a window with none return at once), query-major ones appended to qm_tiles (where fewer than half
// the tiles are query-major, the query-major kernel claims from that list instead of walking every
// tile's flag: at M3-TP1 P-chunk `random`, where every tile goes KV-major, its 132 CTAs spent ~10 us
// in 15 dependent claim-and-flag trips each while holding the SMs the KV-major launches were waiting for).
__device__ __forceinline__ bool goes_kv_major(const TileListParams& p, int32_t reps, int32_t selections) {
  // reps block-steps of query-major against selections / tile_tokens useful ones.
  const bool wide =
      4 * static_cast<int64_t>(reps) * p.sched.tile_tokens > static_cast<int64_t>(p.union_ratio_x4) * selections;
  return p.rule == KvMajorRule::kAlways || (p.rule == KvMajorRule::kWideUnion && wide);
}

// The fp8 copy's flag of block `block` of the tile's request and KV head (fp8_copy.h).
__device__ __forceinline__ void flag_copy_block(const TileListParams& p, const TileCoord& c, int32_t block) {
  const int32_t hkv = p.sched.num_kv_heads;
  const int64_t page = static_cast<int64_t>(p.blk_cum[c.request] / hkv) + block;
  if (page < p.copy_pages) p.copy_flags[(page * hkv + c.kv_head) * kCopyFlagBytes] = 1;
}

__device__ __forceinline__ void finish_tile(const TileListParams& p, int32_t tile, int32_t reps, int32_t selections) {
  p.count[tile] = reps;
  const bool kv = goes_kv_major(p, reps, selections);
  p.kv_major[tile] = kv;
  if (kv && p.window_kv_tiles != nullptr) atomicAdd(p.window_kv_tiles + tile / p.window_tiles, 1);
  if (!kv && p.qm_tiles != nullptr) p.qm_tiles[atomicAdd(p.qm_count, 1)] = tile;
}

// One CTA per tile. The union is built by ranking: entry x is the representative of its block if
// no earlier entry holds the same block; a representative's slot in the sorted list is the number
// of representatives with a smaller block, its mask the OR of the tokens of all equal entries.
// O(entries^2 / threads): 128 entries (8 tokens x top-16) cost 64 compares per thread.
__global__ void __launch_bounds__(kListThreads) tile_lists_kernel(TileListParams p) {
  extern __shared__ int32_t list_smem[];
  int32_t* keys = list_smem;                 // [capacity]: block, or kNoBlock
  int32_t* is_rep = list_smem + p.capacity;  // [capacity]
  __shared__ int32_t reps, selections;
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  arch::allow_dependent_launch();
  const int32_t tile = blockIdx.x;
  const int32_t cap = p.capacity;
  if (tile >= live_tiles(p.sched, p.seqs.batch_size)) {
    if (threadIdx.x == 0) {
      p.count[tile] = 0;
      p.kv_major[tile] = 0;
    }
    return;
  }
  const TileCoord c = decode_tile(p.sched, p.seqs.batch_size, tile);
  const SeqView v = load_seq(p.seqs, c.request);
  if (threadIdx.x == 0) reps = selections = 0;
  __syncthreads();
  int32_t mine = 0;
  for (int x = threadIdx.x; x < cap; x += blockDim.x) {
    const int32_t e = contributing_block(p.block_idx, p.bi_stride_token, p.bi_stride_head, p.bi_stride_k, v,
                                         c.chunk * p.sched.tile_tokens + x / p.topk, c.kv_head, x % p.topk,
                                         p.causal);
    keys[x] = e >= 0 ? e : kNoBlock;
    mine += e >= 0;
  }
  if (mine) atomicAdd(&selections, mine);
  __syncthreads();
  for (int x = threadIdx.x; x < cap; x += blockDim.x) {
    const int32_t key = keys[x];
    int32_t rep = key != kNoBlock;
    for (int y = 0; y < x && rep; ++y) rep = keys[y] != key;
    is_rep[x] = rep;
  }
  __syncthreads();
  mine = 0;
  for (int x = threadIdx.x; x < cap; x += blockDim.x) {
    if (!is_rep[x]) continue;
    const int32_t key = keys[x];
    int32_t pos = 0;
    uint32_t tokens = 0;
    for (int y = 0; y < cap; ++y) {
      const int32_t ky = keys[y];
      pos += (is_rep[y] && ky < key);
      if (ky == key) tokens |= 1u << (y / p.topk);
    }
    p.entries[static_cast<int64_t>(tile) * cap + pos] = make_int2(key, static_cast<int32_t>(tokens));
    ++mine;
  }
  if (mine) atomicAdd(&reps, mine);
  __syncthreads();
  if (threadIdx.x == 0) finish_tile(p, tile, reps, selections);
  if (p.copy_flags != nullptr && !goes_kv_major(p, reps, selections))
    for (int x = threadIdx.x; x < cap; x += blockDim.x)
      if (is_rep[x]) flag_copy_block(p, c, keys[x]);
}

// The same lists, one warp per tile: each lane holds kItems (block << 5 | token) keys, the warp
// sorts them (bitonic network over 32 * kItems keys, invalid = ~0u last), and the runs of equal
// blocks are the union's entries, in ascending block order as above; a run's token mask is a
// segmented OR. Blocks < 2^24 (kv_len is int32) and tokens < 32, so a key fits 32 bits. At M3
// (128 entries a tile) this takes ~600 instructions a tile where the CTA kernel above took ~20 us.
template <int kItems>
__global__ void __launch_bounds__(kListWarps * 32) tile_lists_warp_kernel(TileListParams p) {
  constexpr int kKeys = 32 * kItems;
  constexpr uint32_t kInvalid = ~0u;
  const int lane = threadIdx.x & 31;
  const int32_t tile = blockIdx.x * kListWarps + static_cast<int32_t>(threadIdx.x >> 5);
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  arch::allow_dependent_launch();
  if (tile >= p.sched.num_tiles) return;
  if (tile >= live_tiles(p.sched, p.seqs.batch_size)) {
    if (lane == 0) {
      p.count[tile] = 0;
      p.kv_major[tile] = 0;
    }
    return;
  }
  const TileCoord c = decode_tile(p.sched, p.seqs.batch_size, tile);
  const SeqView v = load_seq(p.seqs, c.request);
  uint32_t key[kItems];
  int32_t selections = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int32_t x = lane * kItems + i;  // blocked: lane l holds keys l*kItems .. +kItems-1
    key[i] = kInvalid;
    if (x < p.capacity) {
      const int32_t tok = x / p.topk;
      const int32_t e = contributing_block(p.block_idx, p.bi_stride_token, p.bi_stride_head, p.bi_stride_k, v,
                                           c.chunk * p.sched.tile_tokens + tok, c.kv_head, x - tok * p.topk, p.causal);
      if (e >= 0) {
        key[i] = (static_cast<uint32_t>(e) << 5) | static_cast<uint32_t>(tok);
        ++selections;
      }
    }
  }
  // Bitonic sort, ascending: pairs (x, x ^ j) inside stage k; partners j >= kItems live in lane ^ (j / kItems).
#pragma unroll
  for (int k = 2; k <= kKeys; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= kItems) {
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
          const int x = lane * kItems + i;
          const uint32_t other = __shfl_xor_sync(~0u, key[i], j / kItems);
          const bool keep_min = ((x & j) == 0) == ((x & k) == 0);
          key[i] = keep_min ? min(key[i], other) : max(key[i], other);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
          if ((i & j) != 0) continue;
          const bool up = ((lane * kItems + i) & k) == 0;
          const uint32_t a = key[i], b = key[i | j];
          key[i] = up ? min(a, b) : max(a, b);
          key[i | j] = up ? max(a, b) : min(a, b);
        }
      }
    }
  }
  // Runs: a key starts one when its block differs from the previous key's (invalid keys form their
  // own block 0x7FFFFFF, never a valid one); a run of valid keys is one entry of the union.
  uint32_t starts = 0;  // bit i: key i starts a run
  const uint32_t before = __shfl_up_sync(~0u, key[kItems - 1], 1);
  int32_t heads = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const uint32_t prev = i > 0 ? key[i - 1] : before;
    const bool start = (lane == 0 && i == 0) || (prev >> 5) != (key[i] >> 5);
    starts |= static_cast<uint32_t>(start) << i;
    heads += start && key[i] != kInvalid;
  }
  const auto token_bit = [&](int i) { return key[i] != kInvalid ? 1u << (key[i] & 31) : 0u; };
  // Token masks: OR over each run (a segmented suffix OR; runs may span lanes). Per lane: the OR of
  // the keys before its first run start (what it adds to the run of the lanes before), and whether
  // it has a start (then nothing further right reaches the lanes before).
  uint32_t lead = 0;
  const bool has_start = starts != 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if ((starts & ((2u << i) - 1)) == 0) lead |= token_bit(i);
  }
  uint32_t reach = lead;  // OR of this lane's lead and, past lanes without a start, theirs
  bool stop = has_start;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const uint32_t r = __shfl_down_sync(~0u, reach, d);
    const bool s = __shfl_down_sync(~0u, stop, d);
    if (lane + d < 32 && !stop) {
      reach |= r;
      stop = s;
    }
  }
  uint32_t carry = __shfl_down_sync(~0u, reach, 1);  // what the lanes to the right add to this lane's last run
  if (lane == 31) carry = 0;
  // Places: heads before this lane, then in order inside it.
  int32_t place = heads;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t n = __shfl_up_sync(~0u, place, d);
    if (lane >= d) place += n;
  }
  const int32_t reps = __shfl_sync(~0u, place, 31);
  place -= heads;
  uint32_t run = carry;
  int32_t local = heads;
#pragma unroll
  for (int i = kItems - 1; i >= 0; --i) {
    run |= token_bit(i);
    if ((starts >> i) & 1u) {
      if (key[i] != kInvalid) {
        --local;
        p.entries[static_cast<int64_t>(tile) * p.capacity + place + local] =
            make_int2(static_cast<int32_t>(key[i] >> 5), static_cast<int32_t>(run));
      }
      run = 0;
    }
  }
  selections = __reduce_add_sync(~0u, selections);
  if (lane == 0) finish_tile(p, tile, reps, selections);
  if (p.copy_flags != nullptr && !goes_kv_major(p, reps, selections)) {
#pragma unroll
    for (int i = 0; i < kItems; ++i)
      if (((starts >> i) & 1u) && key[i] != kInvalid) flag_copy_block(p, c, static_cast<int32_t>(key[i] >> 5));
  }
}

}  // namespace

void launch_tile_schedule(const SeqParams& seqs, int32_t tile_tokens, int32_t num_kv_heads, int32_t* tile_cum,
                          int32_t* blk_cum, int32_t* counters, int32_t num_counters, cudaStream_t stream) {
  tile_schedule_kernel<<<1, kScheduleThreads, 0, stream>>>(seqs, tile_tokens, num_kv_heads, tile_cum, blk_cum,
                                                           counters, num_counters);
  MSA_CUDA_CHECK_LAUNCH();
}

void launch_tile_lists(const TileListParams& p, bool pdl, cudaStream_t stream) {
  if (p.sched.num_tiles == 0) return;
  const dim3 warp_grid((p.sched.num_tiles + kListWarps - 1) / kListWarps), warp_block(kListWarps * 32);
  if (p.capacity <= 32) {
    launch_kernel(pdl, tile_lists_warp_kernel<1>, warp_grid, warp_block, 0, stream, p);
  } else if (p.capacity <= 64) {
    launch_kernel(pdl, tile_lists_warp_kernel<2>, warp_grid, warp_block, 0, stream, p);
  } else if (p.capacity <= 128) {
    launch_kernel(pdl, tile_lists_warp_kernel<4>, warp_grid, warp_block, 0, stream, p);
  } else if (p.capacity <= 256) {
    launch_kernel(pdl, tile_lists_warp_kernel<8>, warp_grid, warp_block, 0, stream, p);
  } else if (p.capacity <= kListWarpMaxEntries) {
    launch_kernel(pdl, tile_lists_warp_kernel<16>, warp_grid, warp_block, 0, stream, p);
  } else {
    const size_t smem = 2 * sizeof(int32_t) * static_cast<size_t>(p.capacity);
    launch_kernel(pdl, tile_lists_kernel, dim3(p.sched.num_tiles), dim3(kListThreads), smem, stream, p);
  }
}

}  // namespace msa::detail::cuda::prefill_sm90
