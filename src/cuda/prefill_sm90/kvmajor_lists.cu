// KV-major list building and the LSE merge (see kvmajor_lists.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_scan.cuh>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/arch/fast_math.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/consumer_math.cuh"
#include "cuda/prefill_sm90/kvmajor_lists.h"
#include "cuda/prefill_sm90/tile_common.cuh"
#include "cuda/runtime/check.cuh"
#include "cuda/runtime/launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {

namespace {

constexpr int kEntryThreads = 128;
constexpr int kScanThreads = 256;
constexpr int kMergeThreads = 256;
// CTAs of the list passes (rank, fill), which stride over the tiles: about one wave of 132 SMs (16 CTAs of 128
// threads a SM at their 32-36 registers), so that runs where few or no tiles go KV-major cost a few microseconds
// instead of one CTA a tile.
constexpr int kStrideGrid = 2048;

__device__ __forceinline__ bool kv_major_tile(const KvListParams& p, int32_t tile) {
  return tile < live_tiles(p.sched, p.seqs.batch_size) && p.kv_major[tile] != 0;
}

// Each key's count is kept in 4 or 8 counters, a tile's entries ranked in stripe tile % stripes: with one
// counter per key, the ~256 entries of a key (top-16 over 256 blocks) queued on one address, and the rank
// pass took 11-20 us at P-chunk `random` (M3-TP1 1024 keys, M3-TP4 256: the fewer keys, the slower),
// against ~5 us when the same entries were spread over 4x the keys (four windows of the plan).
// 8 counters where a window has few keys (config.h).
__device__ __forceinline__ int32_t key_stripe(const KvLists& L, int32_t tile) { return tile & (L.key_stripes - 1); }
static_assert(kKeyStripes == 8, "key_total and fill_tile read a key's stripes as one or two int4");

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
      rank = atomicAdd(&L.key_count[static_cast<int64_t>(key) * L.key_stripes + key_stripe(L, tile)], 1);
    }
    const int64_t entry = static_cast<int64_t>(tile) * L.list_capacity + x;
    L.entry_key[entry] = key;
    L.entry_rank[entry] = rank;
  }
}

__global__ void __launch_bounds__(kEntryThreads) kv_rank_kernel(KvListParams p) {
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  arch::allow_dependent_launch();
  for (int32_t tile = blockIdx.x; tile < p.sched.num_tiles; tile += gridDim.x) {
    if (kv_major_tile(p, tile)) rank_tile(p, tile);
  }
}

// Keys of one thread in a scan pass: consecutive, so that the running prefix inside a thread is a loop
// and the counts come in as one 16-byte load; 256 x 4 = 1024 keys a pass.
constexpr int kScanKeys = 4;
constexpr int kScanTile = kScanThreads * kScanKeys;
// CTAs per window at most: a window's keys are cut into chunks of kScanTile keys or more, one CTA each.
constexpr int kScanMaxChunks = 32;
// Work items staged in shared memory per round (20 bytes each: request, kv_head, block, start | count);
// a pass of 1024 keys makes ~1600 at P-32K `random` (~64 entries a key).
constexpr int kScanStage = 1920;
// blk_cum entries staged in shared memory: batches of up to 2047 requests look their keys' requests up
// there; a larger batch reads blk_cum from the global memory.
constexpr int kScanCumShared = 2048;
static_assert(sizeof(KvWorkItem) == 32, "a work item is written as two 16-byte halves");

// Keys per CTA of a window of `span` keys: a multiple of kScanTile, at most kScanMaxChunks CTAs.
__host__ __device__ constexpr int32_t scan_chunk_keys(int32_t span) {
  const int32_t tiles = (span + kScanTile - 1) / kScanTile;
  return (tiles + kScanMaxChunks - 1) / kScanMaxChunks * kScanTile;
}

__device__ __forceinline__ int32_t items_of(int32_t n) { return (n + kKvItemTokens - 1) / kKvItemTokens; }

// The count of key k: the sum of its 4 or 8 stripes (one or two 16-byte loads; each window's row of
// key_span * stripes counts starts 16-byte aligned, the buffer being one cudaMalloc). The pitch is the
// counters used: one-int4 reads at a pitch of 8 cost the M3-TP1 P-chunk scan 5.3 -> 7.5 us (H200).
__device__ __forceinline__ int32_t key_total(const int32_t* count, int32_t k, bool wide) {
  const int4* c = reinterpret_cast<const int4*>(count + static_cast<int64_t>(k) * (wide ? 8 : 4));
  const int4 a = c[0];
  const int4 b = wide ? c[1] : make_int4(0, 0, 0, 0);
  return a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
}

// Counts of keys first .. first + kScanKeys - 1 (0 from `end` on).
__device__ __forceinline__ void load_counts(int32_t (&c)[kScanKeys], const int32_t* count, int32_t first,
                                            int32_t end, bool wide) {
#pragma unroll
  for (int i = 0; i < kScanKeys; ++i) c[i] = first + i < end ? key_total(count, first + i, wide) : 0;
}

__device__ __forceinline__ int2 add2(int2 a, int2 b) { return make_int2(a.x + b.x, a.y + b.y); }

// Entries and items of this thread's share of keys [0, end): 4 x 4 keys in flight at a time (one at a
// time, the last CTA of a P-32K window waited on 7 round trips here).
__device__ __forceinline__ int2 sum_counts(const int32_t* count, int32_t first, int32_t end, bool wide) {
  constexpr int kLoads = 4;  // x kScanKeys keys x 4 or 8 counters: 16 or 32 16-byte loads
  int2 s = make_int2(0, 0);
  for (int32_t k = first; k < end; k += kLoads * kScanTile) {
    int32_t c[kLoads][kScanKeys];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) load_counts(c[u], count, k + u * kScanTile, end, wide);
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
#pragma unroll
      for (int i = 0; i < kScanKeys; ++i) s = add2(s, make_int2(c[u][i], items_of(c[u][i])));
  }
  return s;
}

// The request of block key kb: the last b < batch with cum[b] <= kb, searched in [from, batch),
// where cum[from] <= kb.
__device__ __forceinline__ int32_t find_request(const int32_t* cum, int32_t from, int32_t batch, int32_t kb) {
  int32_t lo = from, hi = batch;
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (cum[mid] <= kb) lo = mid; else hi = mid;
  }
  return lo;
}

// CTA (window, chunk) of 256 threads takes the chunk's keys 1024 a pass: thread t holds keys
// base + 4t .. base + 4t + 3, the CTA scans their sums (entries, items) once, and each thread walks
// its keys with a running prefix. Every CTA first sums the counts of its window's keys before its
// chunk itself (at most 31 chunks re-read, loads in flight together): no scratch buffer, no order
// between CTAs. A thread writes its keys' items into shared memory and the CTA copies them out in
// item order, a warp's lanes on consecutive 16-byte halves: written straight from the owning threads,
// every store of a warp hit 32 lines. The next pass's counts are loaded before this pass is scanned;
// blk_cum sits in shared memory, and a thread looks a request up only when its key leaves the last
// one it found.
// Chunks instead of one CTA per window: one CTA per window, 256 threads and one key each (a dependent
// load of count[k], a scan, a binary search over blk_cum in the global memory and two barriers per 256
// keys) is a chain of latency-bound passes: 48 us on H200 at P-chunk `random` (4096 keys, one window),
// 97 us at P-32K (4 windows of 8192). One CTA per window with 8192 keys a pass and the items staged
// still takes 16 us at P-32K (a window's ~400 KB of items leave through one SM). On synthetic counts
// shaped like those (~64 entries a key), in CUDA graphs: 4.2 / 4.4 us against 49 / 97 us for one CTA
// per window and one key a thread; outputs are the same bits (offsets of every key, the same items).
__global__ void __launch_bounds__(kScanThreads, 1) kv_scan_kernel(KvListParams p) {
  using Scan = cub::BlockScan<int4, kScanThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int4 stage_head[kScanStage];  // request, kv_head, block, start
  __shared__ int32_t stage_count[kScanStage];
  __shared__ int32_t cum_shared[kScanCumShared];
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  arch::allow_dependent_launch();
  const KvLists& L = p.lists;
  const int32_t window = blockIdx.x;
  const int32_t batch = p.seqs.batch_size;
  const int32_t keys = L.key_span;
  const int32_t chunk_keys = scan_chunk_keys(keys);
  const int32_t c0 = static_cast<int32_t>(blockIdx.y) * chunk_keys, c1 = min(keys, c0 + chunk_keys);
  const int32_t* count = L.key_count + static_cast<int64_t>(window) * L.key_span * L.key_stripes;
  const bool wide = L.key_stripes > 4;
  int32_t* offset = L.key_offset + static_cast<int64_t>(window) * L.key_span;
  KvWorkItem* items = L.items + static_cast<int64_t>(window) * L.item_capacity;
  const bool vec = keys % 4 == 0;
  const int32_t first = static_cast<int32_t>(threadIdx.x) * kScanKeys;
  const auto add = [](int4 a, int4 b) { return make_int4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); };
  // The counts are loaded before the window's tile count is used: one round trip, not two.
  const int32_t kv_tiles = L.window_kv_tiles[window];
  int32_t cur[kScanKeys];
  load_counts(cur, count, c0 + first, c1, wide);
  // This thread's share of the keys before the chunk, summed again by every later chunk's CTA.
  int2 before = sum_counts(count, first, c0, wide);
  if (kv_tiles == 0) {  // no KV-major tile here: no key was counted
    if (blockIdx.y == gridDim.y - 1 && threadIdx.x == 0) L.item_count[window] = 0;
    return;
  }
  const bool staged = batch + 1 <= kScanCumShared;
  if (staged) {
    for (int32_t b = threadIdx.x; b <= batch; b += kScanThreads) cum_shared[b] = L.blk_cum[b];
  }
  __syncthreads();  // cum_shared is complete
  const int32_t* cum = staged ? cum_shared : L.blk_cum;
  // The request of the last key this thread looked up: lo, its keys [cum_lo, cum_hi), nblk blocks per
  // head. cum_lo = INT32_MAX: none yet.
  int32_t lo = 0, cum_lo = INT32_MAX, cum_hi = 0, nblk = 1;
  int2 carry = make_int2(0, 0);  // entries and items before this pass; every thread holds it
  for (int32_t base = c0; base < c1; base += kScanTile) {
    int32_t next[kScanKeys];  // in flight during this pass
    load_counts(next, count, base + kScanTile + first, c1, wide);
    int2 mine = make_int2(0, 0);
#pragma unroll
    for (int i = 0; i < kScanKeys; ++i) mine = add2(mine, make_int2(cur[i], items_of(cur[i])));
    // One scan for both: in the first pass, the keys before the chunk come in as .zw (0 after).
    int4 excl, total;
    Scan(scan_tmp).ExclusiveScan(make_int4(mine.x, mine.y, before.x, before.y), excl, make_int4(0, 0, 0, 0), add,
                                 total);
    before = make_int2(0, 0);
    carry = add2(carry, make_int2(total.z, total.w));
    const int2 start = add2(carry, make_int2(excl.x, excl.y));  // entries and items before this thread's first key
    const int32_t k0 = base + first;
    const int32_t kb0 = k0 % L.block_keys;
    {
      int32_t o[kScanKeys];
      int32_t at = start.x;
#pragma unroll
      for (int i = 0; i < kScanKeys; ++i) {
        o[i] = at;
        at += cur[i];
      }
      if (vec) {
        if (k0 < c1) *reinterpret_cast<int4*>(offset + k0) = make_int4(o[0], o[1], o[2], o[3]);
      } else {
#pragma unroll
        for (int i = 0; i < kScanKeys; ++i)
          if (k0 + i < c1) offset[k0 + i] = o[i];
      }
    }
    // Items [carry.y, end) of this pass, kScanStage at a time: the owning threads stage theirs, then
    // the CTA writes them out. Items from item_capacity on are dropped.
    const int32_t end = min(carry.y + total.y, L.item_capacity);
    for (int32_t r0 = carry.y; r0 < end; r0 += kScanStage) {
      const int32_t r1 = min(r0 + kScanStage, end);
      if (r0 != carry.y) __syncthreads();  // the previous round's items are out
      if (start.y < r1 && start.y + mine.y > r0) {
        int2 at = start;
        int32_t kb = kb0;
#pragma unroll
        for (int i = 0; i < kScanKeys; ++i) {
          const int32_t n = cur[i], ni = items_of(n);
          const int32_t j0 = max(0, r0 - at.y), j1 = min(ni, r1 - at.y);
          if (j0 < j1) {
            // cum is nondecreasing: below cum_lo the request lies before lo (search from 0), at or
            // past cum_hi after it (search from lo + 1), else it is lo.
            if (kb < cum_lo || (lo + 1 < batch && cum_hi <= kb)) {
              lo = find_request(cum, kb < cum_lo ? 0 : lo + 1, batch, kb);
              cum_lo = cum[lo];
              cum_hi = cum[lo + 1];
              nblk = (cum_hi - cum_lo) / p.sched.num_kv_heads;
            }
            const int32_t local = kb - cum_lo;
            const int32_t kv_head = local / nblk, block = local % nblk;
            for (int32_t j = j0; j < j1; ++j) {
              const int32_t m = at.y + j - r0;
              stage_head[m] = make_int4(lo, kv_head, block, at.x + j * kKvItemTokens);
              stage_count[m] = min(kKvItemTokens, n - j * kKvItemTokens);
            }
          }
          at = add2(at, make_int2(n, ni));
          kb = kb + 1 == L.block_keys ? 0 : kb + 1;
        }
      }
      __syncthreads();
      // KvWorkItem{request, kv_head, block, start, count, unused = 0} as two 16-byte halves; items is
      // one cudaMalloc and a window's first item is 32-byte aligned.
      int4* out = reinterpret_cast<int4*>(items + r0);
      for (int32_t h = threadIdx.x; h < 2 * (r1 - r0); h += kScanThreads)
        out[h] = h & 1 ? make_int4(stage_count[h >> 1], 0, 0, 0) : stage_head[h >> 1];
    }
    carry = add2(carry, make_int2(total.x, total.y));
    __syncthreads();  // scan_tmp and the stage are free for the next pass
#pragma unroll
    for (int i = 0; i < kScanKeys; ++i) cur[i] = next[i];
  }
  if (blockIdx.y == gridDim.y - 1 && threadIdx.x == 0) L.item_count[window] = min(carry.y, L.item_capacity);
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
    const int32_t key = L.entry_key[entry];
    // The key's list holds its stripes one after another: this entry's stripe starts after the lower ones.
    const int4* kc = reinterpret_cast<const int4*>(L.key_count + static_cast<int64_t>(key) * L.key_stripes);
    const int32_t stripe = key_stripe(L, tile);
    const int4 a = kc[0];
    const int4 b = stripe > 4 ? kc[1] : make_int4(0, 0, 0, 0);
    const int32_t st[kKeyStripes - 1] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z};
    int32_t before = 0;
#pragma unroll
    for (int i = 0; i < kKeyStripes - 1; ++i) before += i < stripe ? st[i] : 0;
    L.pairs[window * window_entries + L.key_offset[key] + before + rank] =
        make_int2(token, static_cast<int32_t>(local_entry));
  }
}

__global__ void __launch_bounds__(kEntryThreads) kv_fill_kernel(KvListParams p) {
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  arch::allow_dependent_launch();
  for (int32_t tile = blockIdx.x; tile < p.sched.num_tiles; tile += gridDim.x) {
    if (kv_major_tile(p, tile)) fill_tile(p, tile);
  }
}

// 8 consecutive elements (16 bytes) -> 8 floats. bf16 -> f32 is a shift of each half into the high
// bits (one integer op an element).
template <typename Elem>
__device__ __forceinline__ void unpack8(uint4 raw, float (&x)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      x[2 * i] = a.x;
      x[2 * i + 1] = a.y;
    }
  }
}

// A warp merges the rows of two heads of one token at a time: lanes 0-15 the first head, 16-31 the second,
// lane l dims 8 (l % 16) .. + 7, so each partial row is one 16-byte load a lane and the 16 slots' weights
// are one lse a lane. The merge is bound by its instructions, not by the HBM: M3-TP4 P-chunk `random` under
// ncu, one head per warp takes 44.1 M warp instructions (673 a row, 42 a slot: 64-bit addresses, shuffles,
// and conversions of 8 bytes at a time), the issue slots 63% busy and the HBM at 67% (90 us); this form
// needs ~18 a slot for twice the bytes: 76 us, issue 37% busy, HBM 79% (same ncu section set; in graph
// replay the call takes 277-279 us against 280-282, M3-TP1 P-chunk `random` 916 against 925-928). All loads
// of a pair (slot ranks, lse values, the first kMergeSlots partial rows: 8 KB a warp) are issued before any
// is used, one round trip a pair. Partial rows of slots without a partial are read too (they lie inside the
// window's buffer) but never used: a slot of weight 0 is skipped, not multiplied, so garbage there cannot
// reach the sum; sums are taken in slot order, so the result does not depend on timing.
constexpr int kMergeSlots = 16;
static_assert(kMaxTopk <= 4 * kMergeSlots && kMaxTopk % kMergeSlots == 0, "a lane holds <= 4 slots' lse");
static_assert(kKvMinGroup % 2 == 0, "a merge warp takes two heads of one token");

template <typename Elem, bool kQuadMajor>
__device__ __forceinline__ void merge_tile(const KvMergeParams& p, int32_t local_tile) {
  const KvLists& L = p.lists;
  const int32_t tile = p.window * L.window_tiles + local_tile;
  if (tile >= live_tiles(p.sched, p.seqs.batch_size) || p.kv_major[tile] == 0) return;
  const TileCoord c = decode_tile(p.sched, p.seqs.batch_size, tile);
  const SeqView v = load_seq(p.seqs, c.request);
  const int32_t group = 1 << p.group_shift;
  const int lane = threadIdx.x & 31, half = lane >> 4, sub = lane & 15;
  const int64_t slot_stride = static_cast<int64_t>(group) * kHeadDim;
  const int32_t topk = L.topk;
  constexpr int kWarps = kMergeThreads / 32, kPasses = kMaxTopk / kMergeSlots;
  for (int pair = threadIdx.x >> 5; pair < kTileRows / 2; pair += kWarps) {
    const int r = 2 * pair + half;
    const int32_t i = r >> p.group_shift;  // the same token in both halves (group even)
    const int32_t head = r & (group - 1);
    const int32_t qi = c.chunk * p.sched.tile_tokens + i;
    if (qi >= v.qo_len) break;  // warp-uniform; later pairs hold later tokens
    const int64_t entry0 = static_cast<int64_t>(tile) * L.list_capacity + i * topk;
    const int64_t local0 = static_cast<int64_t>(local_tile) * L.list_capacity + i * topk;
    const Elem* src = static_cast<const Elem*>(L.part_o) + (local0 * group + head) * kHeadDim + 8 * sub;
    uint4 raw[kMergeSlots];
#pragma unroll
    for (int j = 0; j < kMergeSlots; ++j)
      raw[j] = j < topk ? *reinterpret_cast<const uint4*>(src + j * slot_stride) : make_uint4(0u, 0u, 0u, 0u);
    // Lane sub of each half weighs slots sub, sub + 16, ... of its head (exp2 of lse - max).
    float w[kPasses];
    bool ranked[kPasses];
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      const int32_t sl = q * kMergeSlots + sub;
      ranked[q] = sl < topk && L.entry_rank[entry0 + sl] >= 0;
      w[q] = ranked[q] ? L.part_lse[(local0 + sl) * group + head] : -INFINITY;
    }
    float mx = w[0];
#pragma unroll
    for (int q = 1; q < kPasses; ++q) mx = fmaxf(mx, w[q]);
#pragma unroll
    for (int d = 8; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, d));
    const float base = mx == -INFINITY ? 0.f : mx;
#pragma unroll
    for (int q = 0; q < kPasses; ++q) w[q] = arch::exp2_approx(w[q] - base);  // -inf -> 0
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float wsum = 0.f;
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      if (q * kMergeSlots >= topk) break;
      if (q > 0) {  // top-k above kMergeSlots: the further slots, a pass at a time
#pragma unroll
        for (int j = 0; j < kMergeSlots; ++j) {
          const int32_t sl = q * kMergeSlots + j;
          raw[j] = sl < topk ? *reinterpret_cast<const uint4*>(src + sl * slot_stride) : make_uint4(0u, 0u, 0u, 0u);
        }
      }
      // Every slot of the pass has a partial (the common case: M3 tokens past their first 16 blocks):
      // each row was written by the KV-major kernel, finite for finite inputs (its masked V rows are
      // zeroed), so it is multiplied whatever its weight, without a branch a slot.
      if (__all_sync(~0u, ranked[q] && q * kMergeSlots + kMergeSlots <= topk)) {
#pragma unroll
        for (int j = 0; j < kMergeSlots; ++j) {  // slot order
          const float wj = __shfl_sync(~0u, w[q], j, 16);
          wsum += wj;
          float x[8];
          unpack8<Elem>(raw[j], x);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] = fmaf(wj, x[e], acc[e]);
        }
        continue;
      }
#pragma unroll
      for (int j = 0; j < kMergeSlots; ++j) {  // slot order
        float wj = __shfl_sync(~0u, w[q], j, 16);
        if (q * kMergeSlots + j >= topk) wj = 0.f;
        wsum += wj;
        // A weight-0 slot's row may be garbage: skipped, never multiplied. Any other weight, NaN
        // included (a NaN lse), is multiplied: NaN stays NaN.
        if (wj != 0.f) {
          float x[8];
          unpack8<Elem>(raw[j], x);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] = fmaf(wj, x[e], acc[e]);
        }
      }
    }
    const float inv = wsum > 0.f ? (1.f / wsum) * p.v_scale : 0.f;
    const int64_t tok = static_cast<int64_t>(v.qo_start) + qi;
    const int64_t hq = static_cast<int64_t>(c.kv_head) * group + head;
    // o's strides are multiples of 8 elements (each family's can_run) and its pointer 16-byte aligned
    // (core/dispatch.cpp).
    Elem* orow = static_cast<Elem*>(p.o) + tok * p.o_stride_token + hq * p.o_stride_head;
    if constexpr (kQuadMajor) {  // this lane's 16 bytes: dims 32m + 8i + 2q, +1 (i = 0..3), q = sub / 4, m = sub % 4
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint32_t*>(orow + 32 * (sub & 3) + 8 * i + 2 * (sub >> 2)) =
            arch::pack2<Elem>(acc[2 * i] * inv, acc[2 * i + 1] * inv);
    } else {
      *reinterpret_cast<uint4*>(orow + 8 * sub) =
          make_uint4(arch::pack2<Elem>(acc[0] * inv, acc[1] * inv), arch::pack2<Elem>(acc[2] * inv, acc[3] * inv),
                     arch::pack2<Elem>(acc[4] * inv, acc[5] * inv), arch::pack2<Elem>(acc[6] * inv, acc[7] * inv));
    }
    if (p.lse != nullptr && sub == 0)
      p.lse[tok * p.lse_stride_token + hq * p.lse_stride_head] =
          wsum == 0.f ? -INFINITY : (base + log2f(wsum)) * 0.69314718055994531f;
  }
}

// One CTA per tile of the window. A window without KV-major tiles returns
// at once. (A grid of 2048 CTAs striding over the tiles ran 3.19 ms at M3-TP1 P-32K `random` where one
// CTA a tile had run 2.90 ms, in separate runs.) Held to 128 registers: 2 CTAs, 16 warps per SM (142
// unbounded, i.e. 1 CTA per SM).
template <typename Elem, bool kQuadMajor>
__global__ void __launch_bounds__(kMergeThreads, 2) kv_merge_kernel(KvMergeParams p) {
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  arch::allow_dependent_launch();
  if (p.lists.window_kv_tiles[p.window] == 0) return;
  merge_tile<Elem, kQuadMajor>(p, blockIdx.x);
}

}  // namespace

void launch_kv_rank(const KvListParams& p, bool pdl, cudaStream_t stream) {
  launch_kernel(pdl, kv_rank_kernel, dim3(std::min(p.sched.num_tiles, kStrideGrid)), dim3(kEntryThreads), 0, stream, p);
}

void launch_kv_scan(const KvListParams& p, bool pdl, cudaStream_t stream) {
  const int32_t span = p.lists.key_span, chunk = scan_chunk_keys(span);
  const int32_t chunks = span > 0 ? (span + chunk - 1) / chunk : 1;
  launch_kernel(pdl, kv_scan_kernel, dim3(p.lists.num_windows, chunks), dim3(kScanThreads), 0, stream, p);
}

void launch_kv_fill(const KvListParams& p, bool pdl, cudaStream_t stream) {
  launch_kernel(pdl, kv_fill_kernel, dim3(std::min(p.sched.num_tiles, kStrideGrid)), dim3(kEntryThreads), 0, stream, p);
}

void launch_kv_merge(const KvMergeParams& p, bool pdl, cudaStream_t stream) {
  const int32_t first = p.window * p.lists.window_tiles;
  const int32_t tiles = std::min(p.lists.window_tiles, p.sched.num_tiles - first);
  if (tiles <= 0) return;
  const bool bf16 = p.dtype == ScalarType::kBF16;
  const auto kernel = p.quad_major_partials
                          ? (bf16 ? kv_merge_kernel<__nv_bfloat16, true> : kv_merge_kernel<__half, true>)
                          : (bf16 ? kv_merge_kernel<__nv_bfloat16, false> : kv_merge_kernel<__half, false>);
  launch_kernel(pdl, kernel, dim3(tiles), dim3(kMergeThreads), 0, stream, p);
}

}  // namespace msa::detail::cuda::prefill_sm90
