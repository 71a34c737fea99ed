// KV-major sparse prefill for sm_90a: for a key = (request, KV head, block), the block's K and V are
// loaded once and every token that selected it (up to kKvItemTokens per work item, gathered 128/G at
// a time into a 128-row Q tile, one TMA box of G heads per token) attends to it; each (token, slot,
// head) writes a partial (o, lse) that kv_merge_kernel combines. Used for tiles whose tokens share
// few blocks (`random`), where query-major would load ~100 blocks to use 16 per token.
//
// Warp-specialized like the query-major kernel: a producer warp fetches work items, loads K/V into a
// kKvBlockStages ring and Q tiles into a kKvQStages ring; two consumer warpgroups take 64 rows each.
// One block per Q tile, so the softmax is exact (no running max).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/config.h"
#include "cuda/sm90/consumer_math.cuh"
#include "cuda/sm90/params.h"
#include "cuda/sm90/sync.cuh"
#include "cuda/sm90/tile_common.cuh"

namespace msa::detail::cuda::sm90 {

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
};

struct alignas(1024) KvMajorSmem {
  uint8_t q[kKvQStages][kTileBytes];
  uint8_t k[kKvBlockStages][kTileBytes];
  uint8_t v[kKvBlockStages][kTileBytes];
  uint64_t q_full[kKvQStages], q_empty[kKvQStages];
  uint64_t kv_full[kKvBlockStages], kv_empty[kKvBlockStages];
  KvItemInfo item[kKvBlockStages];
  KvQInfo qinfo[kKvQStages];
};
inline constexpr int kKvMajorSmemBytes = static_cast<int>(sizeof(KvMajorSmem)) + 1024;
static_assert(kKvMajorSmemBytes <= 227 * 1024, "Hopper allows 227 KiB of shared memory per CTA");

#ifdef MSA_SM90A_DEVICE

__device__ __forceinline__ void kv_producer(const KvMajorParams& p, KvMajorSmem& s) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    tma_prefetch_descriptor(&p.q_map);
    tma_prefetch_descriptor(&p.k_map);
    tma_prefetch_descriptor(&p.v_map);
  }
  const KvLists& L = p.lists;
  const int32_t group = 1 << p.group_shift;
  const int32_t tile_tokens = kTileRows >> p.group_shift;
  const int32_t n_items = min(L.item_count[p.window], L.item_capacity);
  const KvWorkItem* items = L.items + static_cast<int64_t>(p.window) * L.item_capacity;
  const int2* pairs = L.pairs + static_cast<int64_t>(p.window) * L.window_tiles * L.list_capacity;
  uint32_t item_it = 0, q_it = 0;
  while (true) {
    int32_t idx = 0;
    if (lane == 0) idx = atomicAdd(L.item_counter + p.window, 1);
    idx = __shfl_sync(~0u, idx, 0);
    KvItemInfo info{};
    info.item = -1;
    int32_t page = -1;
    if (idx < n_items) {
      const KvWorkItem w = items[idx];
      const SeqView v = load_seq(p.seqs, w.request);
      page = physical_page(p.pages, w.request, w.block / p.page_blocks);
      info = KvItemInfo{idx, w.request, w.kv_head, w.block, w.start, w.count, page >= 0,
                        v.qo_start, v.qo_len, v.kv_len, v.offset};
    }
    const uint32_t kb = item_it % kKvBlockStages, kph = (item_it / kKvBlockStages) & 1;
    ++item_it;
    if (lane == 0) {
      barrier_wait(&s.kv_empty[kb], kph ^ 1);
      s.item[kb] = info;
      if (info.item >= 0) {
        const int32_t key0 = (info.block % p.page_blocks) * kBlockKeys;
        const int32_t pc = page >= 0 ? page : 0;  // no page: load page 0, the consumers mask it all
        barrier_arrive_expect(&s.kv_full[kb], 2 * kTileBytes);
        tma_load_4d(s.k[kb], &p.k_map, 0, key0, info.kv_head, pc, &s.kv_full[kb]);
        tma_load_4d(s.k[kb] + kHalfTileBytes, &p.k_map, kHalfDim, key0, info.kv_head, pc, &s.kv_full[kb]);
        tma_load_4d(s.v[kb], &p.v_map, 0, key0, info.kv_head, pc, &s.kv_full[kb]);
        tma_load_4d(s.v[kb] + kHalfTileBytes, &p.v_map, kHalfDim, key0, info.kv_head, pc, &s.kv_full[kb]);
      } else {
        barrier_arrive(&s.kv_full[kb]);
      }
    }
    if (info.item < 0) break;

    const int32_t ntiles = (info.count + tile_tokens - 1) / tile_tokens;
    for (int32_t q = 0; q < ntiles; ++q, ++q_it) {
      const uint32_t qs = q_it % kKvQStages, qph = (q_it / kKvQStages) & 1;
      const int32_t n = min(tile_tokens, info.count - q * tile_tokens);
      int2 pr = make_int2(0, 0);
      if (lane < n) pr = pairs[info.start + q * tile_tokens + lane];
      if (lane == 0) barrier_wait(&s.q_empty[qs], qph ^ 1);
      for (int32_t j = 0; j < n; ++j) {  // lane 0 writes everything it then releases
        const int32_t token = __shfl_sync(~0u, pr.x, j), entry = __shfl_sync(~0u, pr.y, j);
        if (lane == 0) {
          s.qinfo[qs].token[j] = token;
          s.qinfo[qs].entry[j] = entry;
        }
      }
      if (lane == 0) {
        s.qinfo[qs].count = n;
        barrier_arrive_expect(&s.q_full[qs], static_cast<uint32_t>(n * 2 * group * 128));
      }
      __syncwarp();
      if (lane < n) {  // each lane gathers one token's G heads (its two 64-dim halves)
        uint8_t* dst = s.q[qs] + lane * group * 128;
        tma_load_3d(dst, &p.q_map, 0, info.kv_head * group, pr.x, &s.q_full[qs]);
        tma_load_3d(dst + kHalfTileBytes, &p.q_map, kHalfDim, info.kv_head * group, pr.x, &s.q_full[qs]);
      }
    }
  }
}

template <bool kBf16>
__device__ __forceinline__ void kv_consumer(const KvMajorParams& p, KvMajorSmem& s, int wg) {
  using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  const int tid = threadIdx.x & 127;
  const int lane = tid & 31;
  const int t = lane & 3;
  const int32_t group = 1 << p.group_shift;
  const int32_t tile_tokens = kTileRows >> p.group_shift;
  int32_t slot[2], head_in_group[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = wg * kWarpgroupRows + (tid >> 5) * 16 + (lane >> 2) + 8 * h;
    slot[h] = row >> p.group_shift;
    head_in_group[h] = row & (group - 1);
  }
  Elem* part_o = static_cast<Elem*>(p.lists.part_o);
  float* part_lse = p.lists.part_lse;
  uint32_t item_it = 0, q_it = 0;
  while (true) {
    const uint32_t kb = item_it % kKvBlockStages, kph = (item_it / kKvBlockStages) & 1;
    ++item_it;
    barrier_wait(&s.kv_full[kb], kph);
    const KvItemInfo info = s.item[kb];
    if (info.item < 0) break;
    const SeqView seq{info.qo_start, info.qo_len, info.kv_len, info.offset};
    const int64_t key0 = static_cast<int64_t>(info.block) * kBlockKeys;
    // V rows that must not enter PV (0 * NaN): past kv_len, or all of an invalid page's.
    const int64_t first_bad = info.valid ? info.kv_len - key0 : 0;
    if (first_bad < kBlockKeys) zero_v_rows(s.v[kb], static_cast<int32_t>(first_bad));
    const uint32_t k_addr = smem_u32(s.k[kb]), v_addr = smem_u32(s.v[kb]);
    const int32_t ntiles = (info.count + tile_tokens - 1) / tile_tokens;
    if (ntiles <= 0 && tid == 0) barrier_arrive(&s.kv_empty[kb]);

    for (int32_t q = 0; q < ntiles; ++q, ++q_it) {
      const uint32_t qs = q_it % kKvQStages, qph = (q_it / kKvQStages) & 1;
      barrier_wait(&s.q_full[qs], qph);
      const int32_t n = s.qinfo[qs].count;
      int32_t token[2], entry[2], lim[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool live = slot[h] < n;
        token[h] = live ? s.qinfo[qs].token[slot[h]] : 0;
        entry[h] = live ? s.qinfo[qs].entry[slot[h]] : -1;
        const int32_t kv_end = live ? visible_key_end(seq, token[h] - seq.qo_start, p.causal) : 0;
        lim[h] = info.valid ? static_cast<int32_t>(clamp64(kv_end - key0, 0, kBlockKeys)) : 0;
      }
      float sc[64];
      uint32_t pf[32];
      wgmma_fence();
      issue_qk<kBf16>(sc, smem_u32(s.q[qs]) + wg * kWarpgroupRows * 128, k_addr);
      wgmma_wait<0>();
      fence_regs(sc);
      if (tid == 0) barrier_arrive(&s.q_empty[qs]);
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
      mask_scores(sc, lim, t);
      softmax_block(sc, m, l, alpha, p.scale_log2);
      scores_to_operand<kBf16>(sc, pf);
      float o[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] = 0.f;
      wgmma_fence();
      issue_pv<kBf16>(o, pf, v_addr);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pf);
      if (q == ntiles - 1 && tid == 0) barrier_arrive(&s.kv_empty[kb]);

#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(~0u, l[h], 1);
        l[h] += __shfl_xor_sync(~0u, l[h], 2);
        if (entry[h] < 0) continue;
        const int64_t row = static_cast<int64_t>(entry[h]) * group + head_in_group[h];
        const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
        Elem* dst = part_o + row * kHeadDim + 2 * t;
#pragma unroll
        for (int j = 0; j < 16; ++j)
          *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack2<kBf16>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        if (t == 0) part_lse[row] = l[h] > 0.f ? m[h] + __log2f(l[h]) : -INFINITY;
      }
    }
  }
}

#endif  // MSA_SM90A_DEVICE

template <bool kBf16>
__global__ void __launch_bounds__(kThreads, 1) kvmajor_prefill_kernel(const __grid_constant__ KvMajorParams p) {
#ifdef MSA_SM90A_DEVICE
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
  KvMajorSmem& s = *reinterpret_cast<KvMajorSmem*>(smem_raw + pad);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kKvQStages; ++i) {
      barrier_init(&s.q_full[i], 1);
      barrier_init(&s.q_empty[i], kConsumerWarpgroups);
    }
    for (int i = 0; i < kKvBlockStages; ++i) {
      barrier_init(&s.kv_full[i], 1);
      barrier_init(&s.kv_empty[i], kConsumerWarpgroups);
    }
    barrier_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    regs_decrease<kProducerRegs>();
    if (threadIdx.x < 32) kv_producer(p, s);
  } else {
    regs_increase<kConsumerRegs>();
    kv_consumer<kBf16>(p, s, wg - 1);
  }
#endif
}

}  // namespace msa::detail::cuda::sm90
