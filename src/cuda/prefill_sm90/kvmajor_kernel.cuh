// KV-major sparse prefill for sm_90a: for a key = (request, KV head, block), the block's K and V are
// loaded once and every token that selected it (up to kKvItemTokens per work item, gathered 128/G at
// a time into a 128-row Q tile, one TMA box of G heads per token) attends to it; each (token, slot,
// head) writes a partial (o, lse) that kv_merge_kernel combines. Used for tiles whose tokens share
// few blocks (`random`), where query-major would load ~100 blocks to use 16 per token.
//
// Warp-specialized like the query-major kernel: a scheduler warp fetches work items and loads their
// K/V into a kKvBlockStages ring, a producer warp gathers their Q tiles into a kKvQStages ring; two
// consumer warpgroups take 64 rows each and pipeline the Q tiles (see kv_consumer). One block per Q
// tile, so the softmax is exact.
//
// fp8 e4m3 K/V (kF8): the scheduler loads an item's two e4m3 tiles into the second halves of its 16-bit K and
// V stages, completing on kv_land; warps 2-3 of the producer warpgroup widen them in place (fp8_tiles.cuh)
// and arrive on kv_full. A block's widening is shared by the item's Q tiles (up to 8 at M3).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/arch/fast_math.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/arch/sm90.cuh"
#include "cuda/arch/sm90_wgmma.cuh"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/consumer_math.cuh"
#include "cuda/prefill_sm90/fp8_tiles.cuh"
#include "cuda/prefill_sm90/params.h"
#include "cuda/prefill_sm90/tile_common.cuh"

namespace msa::detail::cuda::prefill_sm90 {

inline constexpr int kKvMaxTileTokens = kTileRows / kKvMinGroup;

struct KvItemInfo {
  int32_t item;  // -1: no more work
  int32_t request, kv_head, block, start, count, valid;
  int32_t qo_start, qo_len, kv_len, offset;
};

struct KvQInfo {
  int32_t count;
  int32_t token[kKvMaxTileTokens];
  int32_t entry[kKvMaxTileTokens];
  int32_t lim[kKvMaxTileTokens];  // keys of the item's block visible to the token (0..128; 0: invalid page)
};

// Q tiles (and consumer jobs) of an item of `count` tokens: 128 / G tokens a tile, a power of two.
static_assert(kTileRows == 128, "tiles_of shifts by log2(kTileRows) = 7");
__device__ __forceinline__ int32_t tiles_of(int32_t count, int32_t group_shift) {
  return (count + (kTileRows >> group_shift) - 1) >> (7 - group_shift);
}

struct alignas(1024) KvMajorSmem {
  uint8_t q[kKvQStages][kTileBytes];
  uint8_t k[kKvBlockStages][kTileBytes];
  uint8_t v[kKvBlockStages][kTileBytes];
  // Partial outputs on their way out, per consumer warpgroup: two 64-dim halves of its 64 rows,
  // 128 B a row, 128B-swizzled as part_map expects (16-byte chunk c of row r at chunk c ^ (r % 8)).
  uint8_t part[kConsumerWarpgroups][kTileBytes / kConsumerWarpgroups];
  uint64_t q_full[kKvQStages], q_empty[kKvQStages];
  uint64_t kv_full[kKvBlockStages], kv_empty[kKvBlockStages];
  KvItemInfo item[kKvBlockStages];
  KvQInfo qinfo[kKvQStages];
  uint64_t ahead_full, ahead_go;  // scheduler <-> warp 0 hand-over of the next item (32 arrivals each)
  int2 ahead[32];                 // the handed-over item's first Q tile: (token, entry) per lane
  // fp8 K/V only: the e4m3 loads complete on kv_land (one arrival + bytes), the converter warps' widening on
  // kv_full (kF8ConvertThreads arrivals). Last, in the struct's padding: the 16-bit layout and size are unchanged.
  uint64_t kv_land[kKvBlockStages];
};
inline constexpr int kKvMajorSmemBytes = static_cast<int>(sizeof(KvMajorSmem)) + 1024;
static_assert(kKvMajorSmemBytes <= 227 * 1024, "Hopper allows 227 KiB of shared memory per CTA");

#ifdef MSA_SM90A_DEVICE

// Item claims (warp 1 of the producer warpgroup, "the scheduler", as in the query-major kernel): the
// next item's claim, record, K/V and its first Q tile's (token, entry) pairs, while warp 0 still
// gathers the current item's Q tiles. Done by warp 0 after an item's last Q tile, a claim is 4-5
// dependent trips (the claim, the item, its lengths and page, then the pairs) before the next
// item's first job can start. The scheduler starts when warp 0 issues the current item's Q tile
// ntiles - kTileLookaheadBlocks (an item has at most kKvItemTokens / (128 / G) = 8 tiles at M3).
// Claims are item indices up to split_from; past it, each of the window's last tail_items items is
// claimed as `subs` parts of sub_tokens tokens (config.h kKvTailItemsPerSm). A part is the item's record
// with its start and count narrowed (a part past the item's count is empty and skipped), so its jobs are
// the item's own Q tiles and the results do not depend on the split.
template <bool kF8>
__device__ __forceinline__ void kv_scheduler(const KvMajorParams& p, KvMajorSmem& s) {
  const int lane = threadIdx.x & 31;
  const KvLists& L = p.lists;
  const int32_t tile_tokens = kTileRows >> p.group_shift;
  const int32_t n_items = min(L.item_count[p.window], L.item_capacity);
  const KvWorkItem* items = L.items + static_cast<int64_t>(p.window) * L.item_capacity;
  const int32_t sub_tokens = kKvTailSubTiles * tile_tokens;
  const int32_t subs = (kKvItemTokens + sub_tokens - 1) / sub_tokens;
  const int32_t split_from = max(n_items - p.tail_items, 0);
  const int32_t n_claims = split_from + (n_items - split_from) * subs;
  const int2* pairs = L.pairs + static_cast<int64_t>(p.window) * L.window_tiles * L.list_capacity;
  for (uint32_t item_it = 0;; ++item_it) {
    if (item_it > 0) arch::mbarrier_wait(&s.ahead_go, (item_it - 1) & 1);  // warp 0 read the previous hand-over
    // Items without tokens are skipped here, so that every item the consumers see has a Q tile
    // (kv_scan never makes one; the consumers' pipeline relies on it).
    int32_t idx = 0;
    KvWorkItem w{};
    do {
      if (lane == 0) idx = atomicAdd(L.item_counter + p.window, 1);
      idx = __shfl_sync(~0u, idx, 0);
      if (idx < n_claims) {
        const bool part = idx >= split_from;
        const int32_t it = part ? split_from + (idx - split_from) / subs : idx;
        w = items[it];
        if (part) {
          const int32_t t0 = (idx - split_from) % subs * sub_tokens;
          w.start += t0;
          w.count = min(sub_tokens, w.count - t0);
        }
      }
    } while (idx < n_claims && w.count <= 0);
    KvItemInfo info{};
    info.item = -1;
    int32_t page = -1;
    int2 pr = make_int2(0, 0);
    if (idx < n_claims) {
      const SeqView v = load_seq(p.seqs, w.request);
      page = physical_page(p.pages, w.request, w.block / p.page_blocks);
      if (lane < min(tile_tokens, w.count)) pr = pairs[w.start + lane];
      info = KvItemInfo{idx, w.request, w.kv_head, w.block, w.start, w.count, page >= 0,
                        v.qo_start, v.qo_len, v.kv_len, v.offset};
    }
    const uint32_t kb = item_it % kKvBlockStages, kph = (item_it / kKvBlockStages) & 1;
    if (lane == 0) {
      arch::mbarrier_wait(&s.kv_empty[kb], kph ^ 1);
      s.item[kb] = info;
      if constexpr (kF8) {  // the e4m3 tiles into the stages' second halves; the end record for the converters
        if (info.item >= 0) {
          const int32_t key0 = (info.block % p.page_blocks) * kBlockKeys;
          const int32_t pc = page >= 0 ? page : 0;
          arch::mbarrier_arrive_expect_tx(&s.kv_land[kb], 2 * kF8TileBytes);
          arch::tma_load_4d(s.k[kb] + kHalfTileBytes, &p.k_map, 0, key0, info.kv_head, pc, &s.kv_land[kb]);
          arch::tma_load_4d(s.v[kb] + kHalfTileBytes, &p.v_map, 0, key0, info.kv_head, pc, &s.kv_land[kb]);
        } else {
          arch::mbarrier_arrive(&s.kv_land[kb]);
        }
      } else if (info.item >= 0) {
        const int32_t key0 = (info.block % p.page_blocks) * kBlockKeys;
        const int32_t pc = page >= 0 ? page : 0;  // no page: load page 0, the consumers mask it all
        arch::mbarrier_arrive_expect_tx(&s.kv_full[kb], 2 * kTileBytes);
        arch::tma_load_4d(s.k[kb], &p.k_map, 0, key0, info.kv_head, pc, &s.kv_full[kb]);
        arch::tma_load_4d(s.k[kb] + kHalfTileBytes, &p.k_map, kHalfDim, key0, info.kv_head, pc, &s.kv_full[kb]);
        arch::tma_load_4d(s.v[kb], &p.v_map, 0, key0, info.kv_head, pc, &s.kv_full[kb]);
        arch::tma_load_4d(s.v[kb] + kHalfTileBytes, &p.v_map, kHalfDim, key0, info.kv_head, pc, &s.kv_full[kb]);
      } else {
        arch::mbarrier_arrive(&s.kv_full[kb]);
      }
    }
    s.ahead[lane] = pr;
    arch::mbarrier_arrive(&s.ahead_full);  // each lane after its own writes (32 arrivals)
    if (info.item < 0) break;
  }
}

// fp8 (warps 2-3 of the producer warpgroup, ct = 0 .. kF8ConvertThreads - 1): each item's K and V tiles widened
// in place, in the scheduler's order; every converter thread arrives on kv_full after its own stores (on the
// end record too, which the consumers read).
template <bool kBf16>
__device__ __forceinline__ void kv_converter(KvMajorSmem& s, int ct) {
  for (uint32_t item_it = 0;; ++item_it) {
    const uint32_t kb = item_it % kKvBlockStages, kph = (item_it / kKvBlockStages) & 1;
    arch::mbarrier_wait(&s.kv_land[kb], kph);
    const bool end = s.item[kb].item < 0;
    if (!end) {
      widen_e4m3_tile<Element<kBf16>>(arch::smem_addr(s.k[kb]), ct);
      widen_e4m3_tile<Element<kBf16>>(arch::smem_addr(s.v[kb]), ct);
    }
    arch::mbarrier_arrive(&s.kv_full[kb]);
    if (end) break;
  }
}

// Q gathers (warp 0 of the producer warpgroup): each item's Q tiles into the kKvQStages ring, one TMA
// box of G heads per token; the first tile's pairs come from the scheduler.
__device__ __forceinline__ void kv_producer(const KvMajorParams& p, KvMajorSmem& s) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) tma_prefetch_qkv_maps(p);
  const KvLists& L = p.lists;
  const int32_t group = 1 << p.group_shift;
  const int32_t tile_tokens = kTileRows >> p.group_shift;
  const int2* pairs = L.pairs + static_cast<int64_t>(p.window) * L.window_tiles * L.list_capacity;
  uint32_t q_it = 0;
  for (uint32_t item_it = 0;; ++item_it) {
    arch::mbarrier_wait(&s.ahead_full, item_it & 1);
    const KvItemInfo& rec = s.item[item_it % kKvBlockStages];
    const int32_t item = rec.item, start = rec.start, count = rec.count, kv_head = rec.kv_head;
    // Each token's key limit goes into qinfo, so that the consumers read it instead of computing it:
    // lim = clamp(visible_key_end - key0, 0, 128), i.e. clamp(token + d, 0, cap) with d and cap formed
    // here (from the record, before this lane's ahead_go arrival, like the fields above; two values,
    // since the producer runs at 40 registers). The lists hold tokens of the item's request only.
    const int32_t key0 = rec.block * kBlockKeys;
    const int64_t d = p.causal ? static_cast<int64_t>(rec.offset) + 1 - rec.qo_start - key0 : int64_t{1} << 40;
    const int32_t cap = rec.valid ? max(min(rec.kv_len - key0, kBlockKeys), 0) : 0;
    const int2 first = s.ahead[lane];
    if (item < 0) break;
    const int32_t ntiles = tiles_of(count, p.group_shift);
    // Each lane's arrival on ahead_go (after its own reads above) lets the scheduler claim the next item.
    const int32_t trigger = max(ntiles - kTileLookaheadBlocks, 0);
    for (int32_t q = 0; q < ntiles; ++q, ++q_it) {
      const uint32_t qs = q_it % kKvQStages, qph = (q_it / kKvQStages) & 1;
      const int32_t n = min(tile_tokens, count - q * tile_tokens);
      int2 pr = first;
      if (q > 0) {
        pr = make_int2(0, 0);
        if (lane < n) pr = pairs[start + q * tile_tokens + lane];
      }
      if (q == trigger) arch::mbarrier_arrive(&s.ahead_go);
      const int32_t my_lim = lane < n ? static_cast<int32_t>(clamp64(pr.x + d, 0, cap)) : 0;
      if (lane == 0) arch::mbarrier_wait(&s.q_empty[qs], qph ^ 1);
      for (int32_t j = 0; j < n; ++j) {  // lane 0 writes everything it then releases
        const int32_t token = __shfl_sync(~0u, pr.x, j), entry = __shfl_sync(~0u, pr.y, j);
        const int32_t lim = __shfl_sync(~0u, my_lim, j);
        if (lane == 0) {
          s.qinfo[qs].token[j] = token;
          s.qinfo[qs].entry[j] = entry;
          s.qinfo[qs].lim[j] = lim;
        }
      }
      if (lane == 0) {
        s.qinfo[qs].count = n;
        arch::mbarrier_arrive_expect_tx(&s.q_full[qs], static_cast<uint32_t>(n * 2 * group * 128));
      }
      __syncwarp();
      if (lane < n) {  // each lane gathers one token's G heads (its two 64-dim halves)
        uint8_t* dst = s.q[qs] + lane * group * 128;
        arch::tma_load_3d(dst, &p.q_map, 0, kv_head * group, pr.x, &s.q_full[qs]);
        arch::tma_load_3d(dst + kHalfTileBytes, &p.q_map, kHalfDim, kv_head * group, pr.x, &s.q_full[qs]);
      }
    }
  }
}

// What a consumer thread keeps of one job (one Q tile of a work item) until its partials are written:
// the stages it uses, and for its two rows the partial row group (-1: none) and the key limit.
struct KvJob {
  uint32_t qs, kb;
  bool last_of_item;  // the item's K/V stage is released after this job's PV product
  int32_t entry[2], lim[2];
};

// Consumers. The jobs of a CTA form one stream (items in fetch order, each cut into Q tiles), and
// each warpgroup software-pipelines it as the query-major kernel does its blocks: the QK^T of job j
// is issued together with the PV of job j - 1, the softmax of job j runs while that PV is on the
// tensor cores, and the two warpgroups take turns issuing (ping-pong), so that one's softmax and
// partial-output stores overlap the other's products. Every job starts a fresh exact softmax (one
// block per row) and writes its own partial (o, lse).
template <bool kBf16>
__device__ __forceinline__ void kv_consumer(const KvMajorParams& p, KvMajorSmem& s, int wg) {
  using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  const int tid = threadIdx.x & 127;
  const int lane = tid & 31;
  const int t = lane & 3;
  const int32_t group = 1 << p.group_shift;
  int32_t slot[2], head_in_group[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = wg * kWarpgroupRows + (tid >> 5) * 16 + (lane >> 2) + 8 * h;
    slot[h] = row >> p.group_shift;
    head_in_group[h] = row & (group - 1);
  }
  float* part_lse = p.lists.part_lse;
  const uint32_t q_off = wg * kWarpgroupRows * 128;

  const uint32_t my_turn = kIssueBarrier + wg, other_turn = kIssueBarrier + (wg ^ 1);
  if (wg == 1) arch::named_barrier_arrive(kIssueBarrier, 2 * 128);
  auto issue_begin = [&] { arch::named_barrier_sync(my_turn, 2 * 128); };
  auto issue_end = [&] { arch::named_barrier_arrive(other_turn, 2 * 128); };

  // The job stream. A new item: wait for its K/V, zero the V rows that must not enter PV (past
  // kv_len, or all of an invalid page's: 0 * NaN), then its Q tiles one by one.
  uint32_t item_it = 0, q_it = 0, kb = 0;
  int32_t jobs_left = 0;
  auto next_job = [&](KvJob& jb) -> bool {
    while (jobs_left == 0) {
      kb = item_it % kKvBlockStages;
      const uint32_t kph = (item_it / kKvBlockStages) & 1;
      ++item_it;
      arch::mbarrier_wait(&s.kv_full[kb], kph);
      const KvItemInfo info = s.item[kb];
      if (info.item < 0) return false;
      const int32_t first_bad = info.valid ? info.kv_len - info.block * kBlockKeys : 0;  // block * 128 <= kv_len
      if (first_bad < kBlockKeys) zero_v_rows(s.v[kb], first_bad);
      jobs_left = tiles_of(info.count, p.group_shift);  // >= 1: kv_scheduler skips empty items
    }
    const uint32_t qs = q_it % kKvQStages, qph = (q_it / kKvQStages) & 1;
    ++q_it;
    arch::mbarrier_wait(&s.q_full[qs], qph);
    const int32_t n = s.qinfo[qs].count;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool live = slot[h] < n;
      jb.entry[h] = live ? s.qinfo[qs].entry[slot[h]] : -1;
      jb.lim[h] = live ? s.qinfo[qs].lim[slot[h]] : 0;  // the producer's (kv_producer)
    }
    jb.qs = qs;
    jb.kb = kb;
    jb.last_of_item = --jobs_left == 0;
    return true;
  };

  // o / l of a finished job -> its partial rows (o normalized, lse in the log2 domain). The warp's 16
  // rows go to its slice of s.part (lane 0 first waits until its previous stores have read it) and lane 0
  // stores them with one TMA box per token and 64-dim half: rows of one token are contiguous in part_o
  // (row = entry * G + head), 16 rows of one token a warp when G >= 16, two tokens of 8 when G = 8.
  // 4-byte stores of the accumulator layout instead (8 L1 wavefronts each, 2048 per Q tile) ran M3-TP1
  // `random` at 198.9 TFLOP/s against 228.7 (P-32K) and 172.8 against 201.0 (P-chunk) on the H200.
  const int warp = tid >> 5;
  uint8_t* part_stage = s.part[wg] + warp * 16 * 128;  // + 8 KiB for dims 64..127
  // stmatrix addresses: lane 8i + r writes row r of matrix i = (h = i & 1, column chunk 2q + (i >> 1))
  // of step q, i.e. warp row r + 8h, 16-byte chunk (2q + (i >> 1)) ^ r in the 128B swizzle; chunk bit 0
  // is i >> 1 and bits 1-2 are q's, so the lane's chunk is ((i >> 1) ^ r) ^ 2q.
  const uint32_t st_row = arch::smem_addr(part_stage) + ((lane & 7) + 8 * ((lane >> 3) & 1)) * 128;
  const uint32_t st_chunk = (((lane >> 4) ^ (lane & 7)) << 4);
  auto store_partials = [&](const float (&o)[64], const float (&m)[2], float (&l)[2], const KvJob& jb) {
    if (lane == 0) arch::bulk_wait_read();
    __syncwarp();
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(~0u, l[h], 1);
      l[h] += __shfl_xor_sync(~0u, l[h], 2);
      inv[h] = l[h] > 0.f ? arch::rcp_approx(l[h]) : 0.f;
    }
    // 8 stmatrix of 4 matrices (two column chunks x the warp's two 8-row halves)
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const uint32_t addr = st_row + (q / 4) * (kHalfTileBytes / kConsumerWarpgroups) + (st_chunk ^ (32 * (q % 4)));
      arch::stmatrix_x4(addr, arch::pack2<Elem>(o[8 * q] * inv[0], o[8 * q + 1] * inv[0]),
                        arch::pack2<Elem>(o[8 * q + 2] * inv[1], o[8 * q + 3] * inv[1]),
                        arch::pack2<Elem>(o[8 * q + 4] * inv[0], o[8 * q + 5] * inv[0]),
                        arch::pack2<Elem>(o[8 * q + 6] * inv[1], o[8 * q + 7] * inv[1]));
    }
    arch::fence_proxy_async();
    __syncwarp();
    if (lane == 0) {  // rows 16 warp (+8): lane 0 holds both rows' entries
      const int32_t box_rows = min(group, 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if ((h == 1 && box_rows > 8) || jb.entry[h] < 0) continue;  // G >= 16: one box of 16 rows
        const int32_t row = jb.entry[h] * group + head_in_group[h];
        const uint8_t* src = part_stage + h * 8 * 128;
        arch::tma_store_2d(&p.part_map, 0, row, src);
        arch::tma_store_2d(&p.part_map, kHalfDim, row, src + kHalfTileBytes / kConsumerWarpgroups);
      }
      arch::bulk_commit();
    }
    // The lse after the fence above: fence.proxy.async is MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC in SASS,
    // and the membar waited for this global store when it came first.
    if (t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (jb.entry[h] >= 0)
          part_lse[static_cast<int64_t>(jb.entry[h]) * group + head_in_group[h]] =
              l[h] == 0.f ? -INFINITY : m[h] + arch::log2_approx(l[h]);  // NaN l (a NaN / Inf key): NaN
    }
  };

  KvJob cur, prev;
  if (!next_job(cur)) return;
  float sc[64], o[64];
  uint32_t pf[32];
  float m[2], l[2], alpha[2], prev_m[2], prev_l[2];

  issue_begin();
  arch::wgmma_fence();
  issue_qk<kBf16>(sc, arch::smem_addr(s.q[cur.qs]) + q_off, arch::smem_addr(s.k[cur.kb]));
  issue_end();
  arch::wgmma_wait<0>();
  arch::fence_regs(sc);
  arch::mbarrier_arrive(&s.q_empty[cur.qs]);  // every consumer thread: the Q tile and its own qinfo reads
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.f;
  mask_scores(sc, cur.lim, t);
  softmax_block(sc, m, l, alpha, p.scale_log2);
  scores_to_operand<kBf16>(sc, pf);
  prev = cur;
  prev_m[0] = m[0], prev_m[1] = m[1], prev_l[0] = l[0], prev_l[1] = l[1];

  while (next_job(cur)) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    issue_begin();
    arch::wgmma_fence();
    issue_qk<kBf16>(sc, arch::smem_addr(s.q[cur.qs]) + q_off, arch::smem_addr(s.k[cur.kb]));
    issue_pv<kBf16>(o, pf, arch::smem_addr(s.v[prev.kb]));
    issue_end();
    arch::fence_regs(pf);
    arch::wgmma_wait<1>();
    arch::fence_regs(sc);
    arch::mbarrier_arrive(&s.q_empty[cur.qs]);
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
    mask_scores(sc, cur.lim, t);
    softmax_block(sc, m, l, alpha, p.scale_log2);
    arch::wgmma_wait<0>();
    arch::fence_regs(o);
    arch::fence_regs(pf);
    if (prev.last_of_item) arch::mbarrier_arrive(&s.kv_empty[prev.kb]);  // every consumer thread, after its last PV
    store_partials(o, prev_m, prev_l, prev);
    scores_to_operand<kBf16>(sc, pf);
    prev = cur;
    prev_m[0] = m[0], prev_m[1] = m[1], prev_l[0] = l[0], prev_l[1] = l[1];
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  issue_begin();
  arch::wgmma_fence();
  issue_pv<kBf16>(o, pf, arch::smem_addr(s.v[prev.kb]));
  issue_end();
  arch::wgmma_wait<0>();
  arch::fence_regs(o);
  arch::fence_regs(pf);
  if (prev.last_of_item) arch::mbarrier_arrive(&s.kv_empty[prev.kb]);
  store_partials(o, prev_m, prev_l, prev);
  if (lane == 0) arch::bulk_wait_all();  // the stores read s.part until they complete
}

#endif  // MSA_SM90A_DEVICE

// kF8: K and V are fp8 e4m3 (one TMA box of 128 keys x 128 bytes a block), widened to kBf16's type.
template <bool kBf16, bool kF8 = false>
__global__ void __launch_bounds__(kThreads, 1) kvmajor_prefill_kernel(const __grid_constant__ KvMajorParams p) {
#ifdef MSA_SM90A_DEVICE
  arch::grid_dependency_wait();  // PDL: the previous kernel's writes first (launch.h)
  arch::allow_dependent_launch();
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - (arch::smem_addr(smem_raw) & 1023u)) & 1023u;
  KvMajorSmem& s = *reinterpret_cast<KvMajorSmem*>(smem_raw + pad);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kKvQStages; ++i) {
      arch::mbarrier_init(&s.q_full[i], 1);
      arch::mbarrier_init(&s.q_empty[i], kConsumerThreads);
    }
    for (int i = 0; i < kKvBlockStages; ++i) {
      arch::mbarrier_init(&s.kv_full[i], kF8 ? kF8ConvertThreads : 1);
      arch::mbarrier_init(&s.kv_empty[i], kConsumerThreads);
      if constexpr (kF8) arch::mbarrier_init(&s.kv_land[i], 1);
    }
    arch::mbarrier_init(&s.ahead_full, 32);
    arch::mbarrier_init(&s.ahead_go, 32);
    arch::fence_mbarrier_init();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    arch::regs_decrease<kProducerRegs>();
    if (threadIdx.x < 32) kv_producer(p, s);
    else if (threadIdx.x < 64) kv_scheduler<kF8>(p, s);
    else if constexpr (kF8) kv_converter<kBf16>(s, threadIdx.x - 32 * kF8ConvertWarp0);
  } else {
    arch::regs_increase<kConsumerRegs>();
    kv_consumer<kBf16>(p, s, wg - 1);
  }
#endif
}

}  // namespace msa::detail::cuda::prefill_sm90
