// The portable KV-major sparse prefill kernel (sm_80+: cp.async, ldmatrix, mma.sync m16n8k16). See
// config.h for the tile sizes and docs/prefill_portable.md for the design.
//
// A persistent CTA of 8 warps claims work items of one window (KvWorkItem: a key = (request, KV head,
// block) and up to 64 of the (token, slot) entries that selected it) and runs their jobs back to back:
// job = the item's block against one Q tile of 128 / G tokens (128 rows). Per job:
//   wait for its Q tile (and, at an item's first job, its K/V), take Q into registers (ldmatrix);
//   issue the next job's Q gather (cp.async, each warp its own 16 rows: lands while this job computes);
//   2 KV stages: at the item's second-to-last job, the next item's K/V. The warps meet at a CTA barrier
//   once per item (its K/V, records and pairs landed; fp8: and at the widening's two), so within an item
//   they drift apart and their partial stores, softmax and MMAs overlap;
//   S = Q K^T (8 warps x 16 rows x 128 keys x 128 dims: 128 mma.sync a warp), mask each row to the keys
//   its token sees in the block, exact softmax in the exp2 domain (one block a row: no running maximum),
//   O = P V (128 mma.sync a warp), write the normalized partial o (q's dtype) and its lse (log2 domain).
// Rows attend alone, so the result does not depend on which CTA or in which order a job ran.
//
// Shared memory: KV_STAGES x {K, V} (128 rows of 256 B each, 16-byte chunk c of row r at c ^ (r & 7):
// the 8 rows an ldmatrix reads hit 8 bank groups), one Q tile (same layout), the item records.
// Keys past kv_len and keys of an invalid page are zero-filled (cp.async with src-size 0) and masked.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/arch/fast_math.cuh"
#include "cuda/arch/fp8.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/prefill_portable/config.h"
#include "cuda/prefill_portable/params.h"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/tile_common.cuh"

namespace msa::detail::cuda::prefill_portable {

// What a CTA knows of a claimed work item; written by thread 0, read by all after a barrier.
struct ItemRecord {
  int32_t item;  // -1: none (the window's items are exhausted)
  int32_t kv_head, block, count;
  int32_t qo_start, qo_len, kv_len, offset;  // the request's lengths (prefill_sm90::SeqView)
  int32_t valid_keys;                        // keys of the block that exist: 0 on an invalid page
  int64_t k_base, v_base;                    // element offset of the block's key 0 in the caches
};
// Three item slots: the running item, the next (its K/V and first Q tile load during the running one) and
// the one after, claimed during the running item's first job. Each slot holds its item's {q row, window
// entry} pairs, copied by cp.async at the claim, so no job waits on a global read before its Q gather.
inline constexpr int kItemSlots = 3;
inline constexpr uint32_t kPairsOffset = 256;  // bytes from the records to the pairs of slot 0
static_assert(kItemSlots * sizeof(ItemRecord) <= kPairsOffset, "item records fit before the pairs");
static_assert(kPairsOffset + kItemSlots * prefill_sm90::kKvItemTokens * sizeof(int2) <= kRecordBytes,
              "item records and their pairs fit their bytes");

// A claim in progress, in registers of warp 0's lane 0, issued in steps between a job's phases so that
// each step's reads land while the CTA computes.
struct Claim {
  int32_t index;  // the item's index in the window (atomic counter)
  KvWorkItem w;
  prefill_sm90::SeqView v;
  int32_t count, page;
  bool ok;
};

template <typename T, bool kF8, int KV_STAGES>
__global__ void __launch_bounds__(kThreads, 1) kvmajor_kernel(const __grid_constant__ KvParams p) {
  static_assert(KV_STAGES == 1 || KV_STAGES == 2, "one or two K/V stages");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200 && __CUDA_ARCH__ < 1300
  // sm_12x parts let a CTA have 99 KiB: the host never launches two K/V stages there (config.h), and the
  // fp8 two-stage body would spill 4 bytes there.
  if constexpr (KV_STAGES == 2) {
    __trap();
    return;
  }
#endif
  using prefill_sm90::SeqView;
  constexpr int kItemTokens = prefill_sm90::kKvItemTokens;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_base = arch::smem_addr(smem);
  const uint32_t q_buf = smem_base + KV_STAGES * 2 * kBlockBytes;
  unsigned char* records = smem + KV_STAGES * 2 * kBlockBytes + kQBytes;
  ItemRecord* rec = reinterpret_cast<ItemRecord*>(records);                       // [kItemSlots]
  const int2* rec_pairs = reinterpret_cast<const int2*>(records + kPairsOffset);  // [kItemSlots][kItemTokens]
  const uint32_t pairs_smem = smem_base + KV_STAGES * 2 * kBlockBytes + kQBytes + kPairsOffset;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const KvLists& L = p.lists;
  const int gshift = p.group_shift, G = 1 << gshift;
  const int TT = kRows >> gshift;  // tokens a job
  arch::grid_dependency_wait();  // the lists are the previous kernels' (PDL on sm_90+)
  const int32_t n_items = min(L.item_count[p.window], L.item_capacity);
  int32_t* counter = L.item_counter + p.window;
  const KvWorkItem* items = L.items + static_cast<int64_t>(p.window) * L.item_capacity;
  const int64_t window_entries = static_cast<int64_t>(L.window_tiles) * L.list_capacity;
  const int2* pairs = L.pairs + p.window * window_entries;
  const T* qg = static_cast<const T*>(p.q);
  const unsigned char* kg = static_cast<const unsigned char*>(p.k.data);
  const unsigned char* vg = static_cast<const unsigned char*>(p.v.data);
  constexpr int kElem = kF8 ? 1 : 2;  // bytes of a K/V element in the cache

  // The claim's steps. Lane 0 of warp 0 runs claim_index / claim_item / claim_page / claim_record; all of
  // warp 0 runs claim_pairs (it copies the item's pairs into the slot and reads the request's lengths).
  Claim cl;
  const auto claim_index = [&]() { cl.index = atomicAdd(counter, 1); };
  const auto claim_item = [&]() {
    cl.ok = cl.index < n_items;
    if (cl.ok) cl.w = items[cl.index];
  };
  const auto claim_pairs = [&](int slot) {  // warp 0
    int32_t start = 0, count = 0;
    if (lane == 0 && cl.ok) {
      cl.ok =
          cl.w.request >= 0 && cl.w.request < p.seqs.batch_size && cl.w.kv_head >= 0 && cl.w.kv_head < p.k.num_heads;
      start = max(cl.w.start, 0);
      const int64_t room = window_entries - start;  // entries of the window from start on
      count =
          cl.ok ? static_cast<int32_t>(prefill_sm90::clamp64(min(cl.w.count, kItemTokens), 0, room > 0 ? room : 0)) : 0;
      cl.count = count;
      if (cl.ok) cl.v = prefill_sm90::load_seq(p.seqs, cl.w.request);
    }
    start = __shfl_sync(~0u, start, 0);
    count = __shfl_sync(~0u, count, 0);
#pragma unroll
    for (int e = lane; e < kItemTokens; e += 32)
      if (e < count) arch::cp_async_8(pairs_smem + (slot * kItemTokens + e) * sizeof(int2), pairs + start + e, 8);
  };
  const auto claim_page = [&]() {
    if (cl.ok) cl.page = prefill_sm90::physical_page(p.pages, cl.w.request, cl.w.block / p.page_blocks);
  };
  const auto claim_record = [&](ItemRecord& r) {
    r.item = -1;
    if (!cl.ok) return;
    const int64_t key0 = static_cast<int64_t>(cl.w.block) * kBlockKeys;
    const int64_t koff = static_cast<int64_t>(cl.w.block % p.page_blocks) * kBlockKeys;
    const int32_t page = cl.page;
    r.item = cl.index;
    r.kv_head = cl.w.kv_head;
    r.block = cl.w.block;
    r.count = cl.count;
    r.qo_start = cl.v.qo_start;
    r.qo_len = cl.v.qo_len;
    r.kv_len = cl.v.kv_len;
    r.offset = cl.v.offset;
    r.valid_keys = page < 0 ? 0 : static_cast<int32_t>(prefill_sm90::clamp64(cl.v.kv_len - key0, 0, kBlockKeys));
    r.k_base = page < 0 ? 0 : page * p.k.stride_page + cl.w.kv_head * p.k.stride_head + koff * p.k.stride_token;
    r.v_base = page < 0 ? 0 : page * p.v.stride_page + cl.w.kv_head * p.v.stride_head + koff * p.v.stride_token;
  };
  // A whole claim at once (the prologue), by warp 0.
  const auto claim_now = [&](int slot) {
    if (lane == 0) {
      claim_index();
      claim_item();
    }
    claim_pairs(slot);
    if (lane == 0) {
      claim_page();
      claim_record(rec[slot]);
    }
  };

  // K and V of item r into KV stage `stage`. 16-bit: 16 threads a 256-byte row. fp8: 8 threads a 128-byte
  // row, into the second half of the 16-bit buffer (widened in place by widen()).
  const auto load_kv = [&](const ItemRecord& r, int stage) {
    const uint32_t kb = smem_base + stage * 2 * kBlockBytes, vb = kb + kBlockBytes;
    constexpr int kChunks = kF8 ? 8 : 16;  // 16-byte chunks of a cache row
    constexpr int kPasses = kBlockKeys * kChunks / kThreads;
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const int idx = tid + k * kThreads;
      const int row = idx / kChunks, c = idx % kChunks;
      const bool ok = row < r.valid_keys;
      const uint32_t dst =
          kF8 ? kBlockBytes / 2 + row * (kRowBytes / 2) + c * 16 : row * kRowBytes + ((c ^ (row & 7)) << 4);
      const unsigned char* ks = ok ? kg + (r.k_base + row * p.k.stride_token) * kElem + c * 16 : kg;
      const unsigned char* vs = ok ? vg + (r.v_base + row * p.v.stride_token) * kElem + c * 16 : vg;
      arch::cp_async_16(kb + dst, ks, ok ? 16 : 0);
      arch::cp_async_16(vb + dst, vs, ok ? 16 : 0);
    }
  };

  // fp8: the e4m3 rows of KV stage `stage` (landed, visible to the CTA) widened to T in place, exactly.
  // A thread widens the chunks it loaded; the barrier between the reads and the writes keeps a widened
  // row from overwriting raw bytes another thread has not read yet.
  const auto widen = [&](int stage) {
    unsigned char* kb = smem + stage * 2 * kBlockBytes;
    constexpr int kPasses = kBlockKeys * 8 / kThreads;
    uint4 raw[2][kPasses];
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const int idx = tid + k * kThreads, row = idx / 8, c = idx % 8;
#pragma unroll
      for (int kv = 0; kv < 2; ++kv)
        raw[kv][k] = *reinterpret_cast<const uint4*>(kb + kv * kBlockBytes + kBlockBytes / 2 + row * 128 + c * 16);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const int idx = tid + k * kThreads, row = idx / 8, c = idx % 8;
#pragma unroll
      for (int kv = 0; kv < 2; ++kv) {
        uint4 lo, hi;
        arch::e4m3x16_to<T>(raw[kv][k], lo, hi);
        unsigned char* rb = kb + kv * kBlockBytes + row * kRowBytes;
        *reinterpret_cast<uint4*>(rb + (((2 * c) ^ (row & 7)) << 4)) = lo;
        *reinterpret_cast<uint4*>(rb + (((2 * c + 1) ^ (row & 7)) << 4)) = hi;
      }
    }
    __syncthreads();
  };

  // This warp's 16 Q rows of job jj of the item in slot `slot` into the Q buffer (rows of absent tokens
  // zero-filled): a warp reads and refills only its own rows, so no CTA barrier guards the buffer. A lane pair
  // owns a row, lane b its chunks 2k + b: the row's address is formed once, and each cp.async of the pair reads
  // 32 contiguous bytes (one sector). Chunk c lands at c ^ (row & 7); the 4 pairs of a quarter warp (one
  // shared-memory wavefront of 16-byte stores) take rows whose (row >> 1) & 3 differ, so their 8 chunks hit
  // 8 bank groups (consecutive rows would hit 4, twice each).
  const auto gather_q = [&](int slot, int jj) {
    const ItemRecord& r = rec[slot];
    const int pair = lane >> 1;
    const int row = warp * 16 + (((pair & 3) << 1) | ((pair >> 2) & 1) | (pair & 8));
    const int t = row >> gshift, h = row & (G - 1);
    const int jt = jj * TT + t;
    const bool ok = jt < r.count;
    const int32_t qrow = ok ? rec_pairs[slot * kItemTokens + jt].x : 0;
    const T* src =
        qg + qrow * p.q_stride_token + static_cast<int64_t>(r.kv_head * G + h) * p.q_stride_head + (lane & 1) * 8;
    const uint32_t dst = q_buf + row * kRowBytes;
    const int x = (lane & 1) ^ (row & 7);
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k)
      arch::cp_async_16(dst + (((2 * k) ^ x) << 4), ok ? src + 16 * k : qg, ok ? 16 : 0);
  };

  // ldmatrix lane offsets (as the paged kernel's): every row a lane points at has (row & 7) == (lane & 7).
  uint32_t swz_a[4], swz_b[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    swz_a[q] = ((2 * q + (lane >> 4)) ^ (lane & 7)) << 4;
    swz_b[q] = ((2 * q + ((lane >> 3) & 1)) ^ (lane & 7)) << 4;
  }
  const uint32_t q_lane = q_buf + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes;
  const uint32_t k_lane = (((lane >> 4) << 3) + (lane & 7)) * kRowBytes;
  const uint32_t v_lane = kBlockBytes + ((((lane >> 3) & 1) << 3) + (lane & 7)) * kRowBytes;
  T* part_o = static_cast<T*>(L.part_o);

  // ---- prologue: the first two items (records and pairs), the first one's K/V and its first Q tile ------
  if (warp == 0) {
    claim_now(0);
    claim_now(1);
  }
  arch::cp_async_commit();
  arch::cp_async_wait<0>();
  __syncthreads();
  if (rec[0].item < 0) return;
  load_kv(rec[0], 0);
  arch::cp_async_commit();
  gather_q(0, 0);
  arch::cp_async_commit();

  int cur = 0, stage = 0;
  bool kv_ahead = false;       // a committed group after this job's Q is the next item's K/V, not needed yet
  bool pairs_ahead = false;    // warp 0: a committed group after it is a claim's pairs, not needed yet
  for (;;) {
    const int nxt = cur == kItemSlots - 1 ? 0 : cur + 1, far = nxt == kItemSlots - 1 ? 0 : nxt + 1;
    const ItemRecord& R = rec[cur];
    const ItemRecord& N = rec[nxt];
    const int njobs = max(1, (R.count + TT - 1) / TT);
    const int32_t blk_key0 = R.block * kBlockKeys;
    SeqView view;
    view.qo_start = R.qo_start;
    view.qo_len = R.qo_len;
    view.kv_len = R.kv_len;
    view.offset = R.offset;
    const int32_t valid_keys = R.valid_keys;
    for (int jj = 0; jj < njobs; ++jj) {
      arch::cp_async_wait_dyn(static_cast<int>(kv_ahead) + static_cast<int>(pairs_ahead));
      pairs_ahead = false;
      // An item's first job: its K/V, records and pairs landed for every thread (with two K/V stages the only
      // CTA barrier of an item besides fp8's widen()). Other jobs: this warp's own Q rows landed for all its lanes.
      if (jj == 0)
        __syncthreads();
      else
        __syncwarp();
      if constexpr (kF8) {
        if (jj == 0) widen(stage);
      }
      uint32_t qa[kHeadDim / 16][4];
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) arch::ldmatrix_x4(qa[kk], q_lane + (kk >> 2) * 128 + swz_a[kk & 3]);
      // This thread's two rows: the token's {q row, window entry}, the keys of the block it sees.
      int2 mine[2];
      int lim[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int row = warp * 16 + (lane >> 2) + 8 * j;
        const int jt = jj * TT + (row >> gshift);
        mine[j] = jt < R.count ? rec_pairs[cur * kItemTokens + jt] : make_int2(-1, -1);
        const int32_t i = mine[j].x - view.qo_start;
        const int32_t end = mine[j].x < 0 ? 0 : prefill_sm90::visible_key_end(view, i, p.causal);
        lim[j] = max(0, min(end - blk_key0, valid_keys));
      }
      __syncwarp();  // this warp's reads of its Q rows are done before its lanes refill them
      const bool next = N.item >= 0;
      if (jj + 1 < njobs) gather_q(cur, jj + 1);
      else if (next) gather_q(nxt, 0);
      arch::cp_async_commit();
      kv_ahead = false;
      if constexpr (KV_STAGES == 2) {
        if (next && jj == max(0, njobs - 2)) {
          load_kv(N, stage ^ 1);
          arch::cp_async_commit();
          kv_ahead = jj + 1 < njobs;  // the item's last job does not need it; the next item's first does
        }
      }
      // The item after the next one is claimed into the free slot during the first job, a step between
      // each phase (its slot's last reads, the previous item's, were before this item's first barrier).
      const bool claiming = jj == 0 && warp == 0;
      if (claiming && lane == 0) claim_index();

      // ---- S = Q K^T ----
      const uint32_t kb = smem_base + stage * 2 * kBlockBytes;
      float s[kBlockKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kBlockKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kBlockKeys / 16; ++np) {
          uint32_t bk[4];
          arch::ldmatrix_x4(bk, kb + k_lane + np * 16 * kRowBytes + (kk >> 2) * 128 + swz_b[kk & 3]);
          arch::mma_m16n8k16<T>(s[2 * np], qa[kk], bk[0], bk[1]);
          arch::mma_m16n8k16<T>(s[2 * np + 1], qa[kk], bk[2], bk[3]);
        }
      }
      if (claiming && lane == 0) claim_item();
      // ---- mask, exact softmax (exp2 domain) ----
      // The maximum is taken over the unscaled logits (scale_log2 > 0) and the scale folded into the exp2's FFMA.
      // Most jobs see their whole block (not the causal diagonal, not past kv_len): the warp then skips the mask.
      const float sl2 = p.scale_log2;
      float mx[2] = {-INFINITY, -INFINITY};
      if (__all_sync(~0u, lim[0] >= kBlockKeys && lim[1] >= kBlockKeys)) {
#pragma unroll
        for (int n = 0; n < kBlockKeys / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
      } else {
#pragma unroll
        for (int n = 0; n < kBlockKeys / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kl = n * 8 + (lane & 3) * 2 + (e & 1);
            s[n][e] = kl < lim[e >> 1] ? s[n][e] : -INFINITY;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
          }
        }
      }
      float l[2] = {0.f, 0.f}, base[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        mx[j] = fmaxf(mx[j], __shfl_xor_sync(~0u, mx[j], 1));
        mx[j] = fmaxf(mx[j], __shfl_xor_sync(~0u, mx[j], 2));
        base[j] = mx[j] == -INFINITY ? 0.f : mx[j] * sl2;  // a row that sees nothing: exp2(-inf - 0) = 0
      }
#pragma unroll
      for (int n = 0; n < kBlockKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = arch::exp2_approx(fmaf(s[n][e], sl2, -base[e >> 1]));
          l[e >> 1] += s[n][e];
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        l[j] += __shfl_xor_sync(~0u, l[j], 1);
        l[j] += __shfl_xor_sync(~0u, l[j], 2);
      }
      if (claiming) {
        claim_pairs(far);
        arch::cp_async_commit();
        pairs_ahead = jj + 1 < njobs;  // needed from the next item on: the item's next job need not wait for it
      }
      // ---- O = P V: two key n-tiles of S are the A fragment of one 16-key k-step ----
      const uint32_t vb = kb + v_lane;
      float o[kHeadDim / 8][4];
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kBlockKeys / 16; ++ks) {
        uint32_t pa[4];
        pa[0] = arch::pack2<T>(s[2 * ks][0], s[2 * ks][1]);
        pa[1] = arch::pack2<T>(s[2 * ks][2], s[2 * ks][3]);
        pa[2] = arch::pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]);
        pa[3] = arch::pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
        for (int np = 0; np < kHeadDim / 16; ++np) {
          uint32_t bv[4];
          arch::ldmatrix_x4_trans(bv, vb + ks * 16 * kRowBytes + (np >> 2) * 128 + swz_a[np & 3]);
          arch::mma_m16n8k16<T>(o[2 * np], pa, bv[0], bv[1]);
          arch::mma_m16n8k16<T>(o[2 * np + 1], pa, bv[2], bv[3]);
        }
      }
      if (claiming && lane == 0) claim_page();
      // ---- the partial rows: o / l in T, lse = m + log2(l) (o = 0, lse = -inf when the row saw nothing) ----
      // A partial row is stored quad-major (the merge's kQuadMajor order): lane q of the row's quad holds the
      // 2-dim pairs q of the 16 dim octets and writes them as 64 contiguous bytes, 4 stores of 16 bytes.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (mine[j].x < 0) continue;
        const int row = warp * 16 + (lane >> 2) + 8 * j;
        const int64_t prow = static_cast<int64_t>(mine[j].y) * G + (row & (G - 1));
        const float inv = l[j] > 0.f ? 1.f / l[j] : 0.f;
        uint4* dst = reinterpret_cast<uint4*>(part_o + prow * kHeadDim + (lane & 3) * (kHeadDim / 4));
#pragma unroll
        for (int m = 0; m < kHeadDim / 32; ++m)
          dst[m] = make_uint4(arch::pack2<T>(o[4 * m][2 * j] * inv, o[4 * m][2 * j + 1] * inv),
                              arch::pack2<T>(o[4 * m + 1][2 * j] * inv, o[4 * m + 1][2 * j + 1] * inv),
                              arch::pack2<T>(o[4 * m + 2][2 * j] * inv, o[4 * m + 2][2 * j + 1] * inv),
                              arch::pack2<T>(o[4 * m + 3][2 * j] * inv, o[4 * m + 3][2 * j + 1] * inv));
        if ((lane & 3) == 0) L.part_lse[prow] = l[j] == 0.f ? -INFINITY : base[j] + arch::log2_approx(l[j]);
      }
      if (claiming && lane == 0) claim_record(rec[far]);  // visible to all after the next item's first barrier
      if constexpr (KV_STAGES == 1) {
        if (jj + 1 == njobs && next) {
          __syncthreads();  // every warp's reads of the K/V stage are done
          load_kv(N, 0);
          arch::cp_async_commit();
        }
      }
    }
    if (N.item < 0) break;
    cur = nxt;
    if constexpr (KV_STAGES == 2) stage ^= 1;
  }
  arch::cp_async_wait<0>();
}

}  // namespace msa::detail::cuda::prefill_portable
