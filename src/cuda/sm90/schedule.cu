// Tile schedule and per-tile block lists of the Hopper prefill (see schedule.h).
#include <cub/block/block_scan.cuh>

#include "cuda/common/check.cuh"
#include "cuda/sm90/config.h"
#include "cuda/sm90/schedule.h"
#include "cuda/sm90/tile_common.cuh"

namespace msa::detail::cuda::sm90 {

namespace {

constexpr int kScheduleThreads = 256;
constexpr int kListThreads = 256;
constexpr int32_t kNoBlock = 0x7FFFFFFF;

__global__ void __launch_bounds__(kScheduleThreads) tile_schedule_kernel(SeqParams seqs, int32_t tile_tokens,
                                                                         int32_t num_kv_heads, int32_t* tile_cum,
                                                                         int32_t* blk_cum, int32_t* counters,
                                                                         int32_t num_counters) {
  using Scan = cub::BlockScan<int2, kScheduleThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int2 carry;
  for (int i = threadIdx.x; i < num_counters; i += blockDim.x) counters[i] = 0;
  if (threadIdx.x == 0) {
    carry = make_int2(0, 0);
    tile_cum[0] = 0;
    blk_cum[0] = 0;
  }
  __syncthreads();
  const auto add = [](int2 a, int2 b) { return make_int2(a.x + b.x, a.y + b.y); };
  for (int base = 0; base < seqs.batch_size; base += kScheduleThreads) {
    const int b = base + threadIdx.x;
    int2 n = make_int2(0, 0);
    if (b < seqs.batch_size) {
      const SeqView v = load_seq(seqs, b);
      n = make_int2((v.qo_len + tile_tokens - 1) / tile_tokens * num_kv_heads, num_kv_blocks(v.kv_len) * num_kv_heads);
    }
    int2 incl, total;
    Scan(scan_tmp).InclusiveScan(n, incl, add, total);
    if (b < seqs.batch_size) {
      tile_cum[b + 1] = carry.x + incl.x;
      blk_cum[b + 1] = carry.y + incl.y;
    }
    __syncthreads();
    if (threadIdx.x == 0) carry = add(carry, total);
    __syncthreads();
  }
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
  if (threadIdx.x == 0) {
    p.count[tile] = reps;
    // reps block-steps of query-major against selections / tile_tokens useful ones.
    const bool wide = static_cast<int64_t>(reps) * p.sched.tile_tokens > kKvMajorUnionRatio * selections;
    p.kv_major[tile] = p.rule == KvMajorRule::kAlways || (p.rule == KvMajorRule::kWideUnion && wide);
  }
}

}  // namespace

void launch_tile_schedule(const SeqParams& seqs, int32_t tile_tokens, int32_t num_kv_heads, int32_t* tile_cum,
                          int32_t* blk_cum, int32_t* counters, int32_t num_counters, cudaStream_t stream) {
  tile_schedule_kernel<<<1, kScheduleThreads, 0, stream>>>(seqs, tile_tokens, num_kv_heads, tile_cum, blk_cum,
                                                           counters, num_counters);
  MSA_CUDA_CHECK_LAUNCH();
}

void launch_tile_lists(const TileListParams& p, cudaStream_t stream) {
  if (p.sched.num_tiles == 0) return;
  const size_t smem = 2 * sizeof(int32_t) * static_cast<size_t>(p.capacity);
  tile_lists_kernel<<<p.sched.num_tiles, kListThreads, smem, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::detail::cuda::sm90
