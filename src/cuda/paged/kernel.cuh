// The paged attention kernel (sm_80+): decode and the portable prefill path, sparse (top-k blocks)
// and dense, any page size and page strides, optional LSE, split-KV with a fused merge.
//
// One CTA = one work item (tile of query tokens of request b, KV head g, split s); see config.cuh
// for the tile geometry. Its steps:
//  1. find the tile (decode: from blockIdx; prefill: scan of qo_indptr) and clamp every length read
//     from the device (nothing here trusts a value: lengths, indptr, pages and blocks are bounded);
//  2. start the Q tile load (cp.async), build the tile's block list (sparse: union of the tokens'
//     valid entries, sorted, with a token mask per block; dense: blocks 0 .. ceil(kv_hi/128)-1) and
//     take this split's contiguous range of it;
//  3. stream the range's key tiles through a multi-stage cp.async pipeline: one thread per key
//     resolves the key's page through the page table one tile ahead of its load, into a ring of
//     offsets; invisible keys (past the causal frontier or kv_len, bad page) are zero-filled;
//  4. per warp: S = Q K^T (mma.sync m16n8k16), mask, online softmax in the exp2 domain, O += P V;
//  5. combine the key-group warps, normalize, write o / lse (one split) or an fp32 partial; the last
//     split of an item to finish (arrival counter) merges the partials in split order and resets
//     the counter for the next launch (CUDA graph replay).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "cuda/paged/block_list.cuh"
#include "cuda/paged/config.cuh"
#include "cuda/paged/kernel_params.cuh"
#include "cuda/paged/merge_math.cuh"
#include "cuda/paged/ptx.cuh"

namespace msa::detail::cuda::paged {

// int32 slots of SmemLayout::scratch past the 32 the scan uses.
constexpr int kScratchTileReq = 40;
constexpr int kScratchTileIdx = 41;
constexpr int kScratchIsLast = 42;

__device__ __forceinline__ uint64_t low_bits(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

__device__ __forceinline__ int clamp_pos(int64_t pos) {
  return static_cast<int>(pos < -1 ? -1 : (pos > INT_MAX ? INT_MAX : pos));
}

// Request b's query rows [q0, q1), clamped into [0, total_q).
__device__ __forceinline__ void request_rows(const SeqParams& s, int b, int64_t& q0, int64_t& q1) {
  int64_t a = s.qo_indptr[b], c = s.qo_indptr[b + 1];
  a = a < 0 ? 0 : (a > s.total_q ? s.total_q : a);
  c = c < a ? a : (c > s.total_q ? s.total_q : c);
  q0 = a;
  q1 = c;
}

// Prefill grids hold sum_b ceil(qo_len_b / T) tiles (from the plan's host lengths); tile x belongs to
// the request whose running tile count passes x. Returns false when x is past the device lengths.
template <int THREADS>
__device__ bool find_scan_tile(const SeqParams& s, int tile_tokens, int64_t x, int* scratch, int& b_out,
                               int& tile_out) {
  if (threadIdx.x == 0) {
    scratch[kScratchTileReq] = -1;
    scratch[kScratchTileIdx] = 0;
  }
  int64_t base = 0;
  for (int c0 = 0; c0 < s.batch_size; c0 += THREADS) {
    const int b = c0 + static_cast<int>(threadIdx.x);
    int tiles = 0;
    if (b < s.batch_size) {
      int64_t q0, q1;
      request_rows(s, b, q0, q1);
      tiles = static_cast<int>((q1 - q0 + tile_tokens - 1) / tile_tokens);
    }
    int total = 0;
    const int before = block_exclusive_scan<THREADS>(tiles, scratch, &total);  // barriers order the init
    if (tiles > 0 && x >= base + before && x < base + before + tiles) {
      scratch[kScratchTileReq] = b;
      scratch[kScratchTileIdx] = static_cast<int>(x - base - before);
    }
    base += total;
    if (base > x) break;
  }
  __syncthreads();
  b_out = scratch[kScratchTileReq];
  tile_out = scratch[kScratchTileIdx];
  return b_out >= 0;
}

template <typename T, int D, int ROWS>
__global__ void __launch_bounds__(TileConfig<D, ROWS>::kThreads, TileConfig<D, ROWS>::kMinBlocksPerSm)
    paged_attention_kernel(const __grid_constant__ KernelParams kp) {
  using C = TileConfig<D, ROWS>;
  using M = Mma<T>;
  constexpr int kThreads = C::kThreads;
  constexpr int kKeys = C::kKeys;
  constexpr int kWK = C::kKeyGroups;
  constexpr int kKW = C::kWarpKeys;
  constexpr int kNT = kKW / 8;        // key n-tiles of S per warp
  constexpr int kDT = D / 8;          // dv n-tiles of O
  constexpr int kCpr = C::kChunksPerRow;
  constexpr int kTPB = C::kTilesPerBlock;
  constexpr int kStageElems = 2 * kKeys * D;
  constexpr int kMaxNS = C::kMaxStages;

  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionParams& p = kp.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp / kWK, wk = warp % kWK;
  const int NS = kp.num_stages;
  const SmemLayout L = smem_layout<D, ROWS>(NS, kp.list_cap);
  int* scratch = reinterpret_cast<int*>(smem + L.scratch);
  constexpr uint32_t kRowBytes = D * 2;  // one K/V/Q row in shared memory
  constexpr uint32_t kStageBytes = kStageElems * 2;
  const uint32_t stages = smem_addr(smem) + L.stages;  // shared-window byte addresses from here on
  longlong2* ring = reinterpret_cast<longlong2*>(smem + L.ring_off);
  uint64_t* ring_valid = reinterpret_cast<uint64_t*>(smem + L.ring_valid);
  int32_t* sort_buf = reinterpret_cast<int32_t*>(smem + L.sort_keys);
  int32_t* list_blk = reinterpret_cast<int32_t*>(smem + L.list_blk);
  uint64_t* list_mask = reinterpret_cast<uint64_t*>(smem + L.list_mask);

  // ---- 1. the tile and its request -------------------------------------------------------------
  const int g = blockIdx.y, split = blockIdx.z, S = kp.num_splits;
  int b, tile;
  if (kp.scan_tiles) {
    if (!find_scan_tile<kThreads>(p.seqs, kp.tile_tokens, blockIdx.x, scratch, b, tile)) return;
  } else {
    b = blockIdx.x / kp.tiles_per_req;
    tile = blockIdx.x % kp.tiles_per_req;
  }
  int64_t q0, q1;
  request_rows(p.seqs, b, q0, q1);
  const int kv_len = max(p.seqs.kv_lens[b], 0);
  const int64_t qo_off = p.seqs.qo_offset ? static_cast<int64_t>(p.seqs.qo_offset[b]) : kv_len - (q1 - q0);
  const int64_t first = static_cast<int64_t>(tile) * kp.tile_tokens;
  const int64_t left = q1 - q0 - first;
  const int nt = static_cast<int>(left <= 0 ? 0 : (left < kp.tile_tokens ? left : kp.tile_tokens));
  if (nt == 0) return;  // every split of this item returns here too: its counter stays untouched
  const int64_t tok_base = q0 + first;   // global token index of the tile's token 0
  const int64_t pos_base = qo_off + first;  // its absolute position
  const int kv_hi = p.causal ? max(0, min(kv_len, clamp_pos(pos_base + nt))) : kv_len;  // keys any row sees
  const int nblk = static_cast<int>((static_cast<int64_t>(kv_len) + kBlock - 1) / kBlock);
  const int G = p.group_size, GP = kp.group_pad, gp_shift = __ffs(GP) - 1;

  // ---- 2a. Q tile -> shared (the last stage when Q then moves to registers) ---------------------
  // Rows are stored with their 16-byte chunks swizzled (chunk c of row r at c ^ (r & 7)), so the 8
  // rows an ldmatrix reads hit 8 different bank groups.
  const uint32_t qs = C::kQInRegs ? stages + (NS - 1) * kStageBytes : smem_addr(smem) + L.q;
  {
    const T* qg = static_cast<const T*>(p.q);
    for (int idx = tid; idx < ROWS * kCpr; idx += kThreads) {
      const int r = idx / kCpr, c = idx % kCpr;
      const int i = r >> gp_shift, h = r & (GP - 1);
      const bool ok = i < nt && h < G;
      const T* src = ok ? qg + (tok_base + i) * p.q_stride_token + static_cast<int64_t>(g * G + h) * p.q_stride_head + c * 8
                        : qg;
      cp_async_16(qs + r * kRowBytes + ((c ^ (r & 7)) << 4), src, ok ? 16 : 0);
    }
    cp_async_commit();
  }

  // ---- 2b. block list and this split's range ---------------------------------------------------
  const bool sparse = p.block_idx != nullptr;
  int n_list;
  if (sparse) {
    const int topk = p.topk, n_ent = nt * topk;  // <= list_cap: nt <= tile_tokens
    for (int e = tid; e < kp.list_cap; e += kThreads) {
      int32_t key = kNoEntry;
      if (e < n_ent) {
        const int i = e / topk, k = e - i * topk;
        const int32_t blk = p.block_idx[(tok_base + i) * p.bi_stride_token + static_cast<int64_t>(g) * p.bi_stride_head +
                                        static_cast<int64_t>(k) * p.bi_stride_k];
        // A block past the token's own causal frontier shows it nothing: the token does not select it.
        if (blk >= 0 && blk < nblk && (!p.causal || static_cast<int64_t>(blk) * kBlock <= pos_base + i))
          key = (blk << 6) | i;
      }
      sort_buf[e] = key;
    }
    __syncthreads();
    sort_keys<kThreads>(sort_buf, kp.list_cap);
    n_list = compact_runs<kThreads>(sort_buf, kp.list_cap, list_blk, list_mask, scratch);
    __syncthreads();
  } else {
    n_list = static_cast<int>((static_cast<int64_t>(kv_hi) + kBlock - 1) / kBlock);
  }
  int lb, le;
  if (kp.fixed_split_blocks > 0) {
    const int64_t F = kp.fixed_split_blocks;
    lb = static_cast<int>(min(static_cast<int64_t>(n_list), split * F));
    le = split == S - 1 ? n_list : static_cast<int>(min(static_cast<int64_t>(n_list), lb + F));
  } else {
    const int chunk = (n_list + S - 1) / S;
    lb = min(n_list, split * chunk);
    le = min(n_list, lb + chunk);
  }
  const int n_tiles = (le - lb) * kTPB;
  const uint64_t all_tokens = low_bits(nt);

  // ---- the two MMA rows of this thread: token, position; the warp's tokens and last position -------
  int tok_of[2], pos_of[2];
  uint64_t my_tokens = 0;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = wr * 16 + (lane >> 2) + 8 * j;
    const int i = r >> gp_shift, h = r & (GP - 1);
    const bool ok = i < nt && h < G;
    tok_of[j] = ok ? i : -1;
    pos_of[j] = ok ? clamp_pos(pos_base + i) : -1;
    my_tokens |= ok ? 1ull << i : 0ull;
  }
  const uint64_t warp_tokens =
      static_cast<uint64_t>(__reduce_or_sync(kFullMask, static_cast<unsigned>(my_tokens))) |
      (static_cast<uint64_t>(__reduce_or_sync(kFullMask, static_cast<unsigned>(my_tokens >> 32))) << 32);
  const int warp_pos_max = __reduce_max_sync(kFullMask, max(pos_of[0], pos_of[1]));

  // ---- 3. key offsets through the page table, one thread per key of a tile ---------------------
  const int page_size = p.k.page_size;
  int64_t row_base, row_len;
  if (p.pages.indptr) {
    int64_t a = p.pages.indptr[b], c = p.pages.indptr[b + 1];
    a = a < 0 ? 0 : (a > p.pages.row_capacity ? p.pages.row_capacity : a);
    c = c < a ? a : (c > p.pages.row_capacity ? p.pages.row_capacity : c);
    row_base = a;
    row_len = c - a;
  } else {
    row_base = static_cast<int64_t>(b) * p.pages.row_stride;
    row_len = p.pages.row_capacity;
  }
  struct KeyFetch {
    int32_t page = -1;
    int32_t off = 0;
    bool ok = false;
  };
  // Issues the page-table load of key `tid` of tile x; the value is consumed in fetch_end, after
  // the current tile's math, so the load's latency hides behind it.
  const auto fetch_begin = [&](int x) {
    KeyFetch f;
    if (x < n_tiles) {
      const int u = lb + x / kTPB;
      const int blk = sparse ? list_blk[u] : u;
      // int64: the last block of a kv_len near 2^31 would overflow int32 past kv_len.
      const int64_t j = static_cast<int64_t>(blk) * kBlock + (x % kTPB) * kKeys + tid;
      if (j < kv_hi) {
        const int64_t lp = j / page_size;
        if (lp < row_len) {
          f.page = __ldg(p.pages.table + row_base + lp);
          f.off = static_cast<int32_t>(j - lp * page_size);
          f.ok = true;
        }
      }
    }
    return f;
  };
  const auto fetch_end = [&](const KeyFetch& f, int slot) {
    const bool ok = f.ok && f.page >= 0 && f.page < p.pages.num_pages;
    longlong2 o;
    o.x = ok ? f.page * p.k.stride_page + g * p.k.stride_head + f.off * p.k.stride_token : -1;
    o.y = ok ? f.page * p.v.stride_page + g * p.v.stride_head + f.off * p.v.stride_token : -1;
    ring[slot * kKeys + tid] = o;
    const unsigned bits = __ballot_sync(kFullMask, ok);
    if (lane == 0) reinterpret_cast<uint32_t*>(ring_valid + slot)[warp] = bits;
  };
  const T* kg = static_cast<const T*>(p.k.data);
  const T* vg = static_cast<const T*>(p.v.data);
  const auto load_tile = [&](int stage, int slot) {
    const uint32_t ks = stages + stage * kStageBytes;
    const uint32_t vs = ks + kKeys * kRowBytes;
    const longlong2* offs = ring + slot * kKeys;
    const int c = tid % kCpr;
    constexpr int kRowStep = kThreads / kCpr;
    // 4 rows per batch of offset reads: full unrolling (16 rows at D=256 with 2 warps) would keep
    // every row's offsets live at once and spill.
#pragma unroll 4
    for (int it = 0; it < kKeys / kRowStep; ++it) {
      const int r = tid / kCpr + it * kRowStep;
      const longlong2 o = offs[r];
      const uint32_t dst = r * kRowBytes + ((c ^ (r & 7)) << 4);
      cp_async_16(ks + dst, o.x >= 0 ? kg + o.x + c * 8 : kg, o.x >= 0 ? 16 : 0);
      cp_async_16(vs + dst, o.y >= 0 ? vg + o.y + c * 8 : vg, o.y >= 0 ? 16 : 0);
    }
  };

  // Prologue: offsets of tiles 0..NS-1, loads of tiles 0..NS-2 (cp.async groups after Q's).
  if (tid < kKeys) {
    KeyFetch f[kMaxNS];
#pragma unroll
    for (int x = 0; x < kMaxNS; ++x)
      if (x < NS) f[x] = fetch_begin(x);
#pragma unroll
    for (int x = 0; x < kMaxNS; ++x)
      if (x < NS) fetch_end(f[x], x);
  }
  __syncthreads();
  for (int x = 0; x < NS - 1; ++x) {
    if (x < n_tiles) load_tile(x, x);
    cp_async_commit();
  }
  cp_async_wait_dyn(NS - 1);  // the Q group
  __syncthreads();
  // ldmatrix lane addresses. Every row a lane points at has (row & 7) == (lane & 7), so logical
  // chunk 8*hi + lo sits at byte 128*hi + ((lo ^ (lane & 7)) << 4): four per-lane swizzles (lo = 2q
  // or 2q + 1) and compile-time offsets cover every fragment of the unrolled loops.
  uint32_t swz_a[4], swz_b[4];  // lo = 2q + (lane >> 4) (Q, V), 2q + ((lane >> 3) & 1) (K)
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    swz_a[q] = ((2 * q + (lane >> 4)) ^ (lane & 7)) << 4;
    swz_b[q] = ((2 * q + ((lane >> 3) & 1)) ^ (lane & 7)) << 4;
  }
  const uint32_t q_lane = qs + (wr * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes;
  const uint32_t k_lane = (wk * kKW + ((lane >> 4) << 3) + (lane & 7)) * kRowBytes;       // + stage base
  const uint32_t v_lane = kKeys * kRowBytes + (wk * kKW + ((lane >> 3) & 1) * 8 + (lane & 7)) * kRowBytes;
  uint32_t qa[C::kQInRegs ? D / 16 : 1][4];
  if constexpr (C::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qa[kk], q_lane + (kk >> 2) * 128 + swz_a[kk & 3]);
  }

  // ---- 4. the key tiles ------------------------------------------------------------------------
  float o[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const uint64_t stage_keys = low_bits(kKeys);

  for (int x = 0; x < n_tiles; ++x) {
    cp_async_wait_dyn(NS - 2);
    __syncthreads();  // tile x landed for every thread; stage (x-1) % NS and its ring slot are free
    {
      const int xn = x + NS - 1;
      if (xn < n_tiles) load_tile(xn % NS, xn % (NS + 1));
      cp_async_commit();
    }
    KeyFetch ahead;
    if (tid < kKeys) ahead = fetch_begin(x + NS);

    const int stage = x % NS, slot = x % (NS + 1);
    const int u = lb + x / kTPB;
    const int blk = sparse ? list_blk[u] : u;
    const uint64_t blk_tokens = sparse ? list_mask[u] : all_tokens;
    const int key0 = blk * kBlock + (x % kTPB) * kKeys;  // first key of the tile
    const uint64_t valid = ring_valid[slot] & stage_keys;
    const bool active = (blk_tokens & warp_tokens) != 0 && ((valid >> (wk * kKW)) & low_bits(kKW)) != 0 &&
                        !(p.causal && key0 + wk * kKW > warp_pos_max);
    if (active) {
      const uint32_t stage_base = stages + stage * kStageBytes;
      float s[kNT][4];
#pragma unroll
      for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      // k-step kk = 4*hi + q covers dims [16 kk, 16 kk + 16) = chunks 8*hi + 2q (+1). With Q in
      // shared memory (D=256) the hi loop stays rolled so the fragment loads are not all hoisted
      // ahead of the MMAs (that would spill next to the 128-register O accumulator).
#pragma unroll(C::kQInRegs ? D / 64 : 1)
      for (int hi = 0; hi < D / 64; ++hi) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t a[4];
          if constexpr (C::kQInRegs) {
            const int kk = hi * 4 + q;
            a[0] = qa[kk][0], a[1] = qa[kk][1], a[2] = qa[kk][2], a[3] = qa[kk][3];
          } else {
            ldmatrix_x4(a, q_lane + hi * 128 + swz_a[q]);
          }
#pragma unroll
          for (int np = 0; np < kNT / 2; ++np) {
            uint32_t bk[4];
            ldmatrix_x4(bk, stage_base + k_lane + np * 16 * kRowBytes + hi * 128 + swz_b[q]);
            M::run(s[2 * np], a, bk[0], bk[1]);
            M::run(s[2 * np + 1], a, bk[2], bk[3]);
          }
        }
      }
      // Mask: the row's token selected this block, the key exists (page, kv_len), causal order.
      bool row_sel[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) row_sel[j] = tok_of[j] >= 0 && ((blk_tokens >> tok_of[j]) & 1ull);
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kl = wk * kKW + n * 8 + (lane & 3) * 2 + (e & 1);
          const int j = e >> 1;
          const bool vis = row_sel[j] && ((valid >> kl) & 1ull) && (!p.causal || key0 + kl <= pos_of[j]);
          s[n][e] = vis ? s[n][e] * kp.scale_log2 : -INFINITY;
          mx[j] = fmaxf(mx[j], s[n][e]);
        }
      }
      // Online softmax (exp2 domain). A row that has seen nothing keeps m = -inf and uses 0 as its
      // base, so exp2(-inf - 0) = 0 and nothing turns into NaN.
      float scale_old[2], base[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        mx[j] = fmaxf(mx[j], __shfl_xor_sync(kFullMask, mx[j], 1));
        mx[j] = fmaxf(mx[j], __shfl_xor_sync(kFullMask, mx[j], 2));
        const float m_new = fmaxf(m_run[j], mx[j]);
        base[j] = m_new == -INFINITY ? 0.f : m_new;
        scale_old[j] = exp2_approx(m_run[j] - base[j]);
        m_run[j] = m_new;
      }
      float row_sum[2] = {0.f, 0.f};
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = exp2_approx(s[n][e] - base[e >> 1]);
          row_sum[e >> 1] += s[n][e];
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) l_run[j] = l_run[j] * scale_old[j] + row_sum[j];
#pragma unroll
      for (int n = 0; n < kDT; ++n) {
        o[n][0] *= scale_old[0];
        o[n][1] *= scale_old[0];
        o[n][2] *= scale_old[1];
        o[n][3] *= scale_old[1];
      }
      // O += P V: the S accumulators of two key n-tiles are the A fragment of one 16-key k-step.
#pragma unroll
      for (int ks16 = 0; ks16 < kKW / 16; ++ks16) {
        uint32_t pa[4];
        pa[0] = M::pack(s[2 * ks16][0], s[2 * ks16][1]);
        pa[1] = M::pack(s[2 * ks16][2], s[2 * ks16][3]);
        pa[2] = M::pack(s[2 * ks16 + 1][0], s[2 * ks16 + 1][1]);
        pa[3] = M::pack(s[2 * ks16 + 1][2], s[2 * ks16 + 1][3]);
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, stage_base + v_lane + ks16 * 16 * kRowBytes + (np >> 2) * 128 + swz_a[np & 3]);
          M::run(o[2 * np], pa, bv[0], bv[1]);
          M::run(o[2 * np + 1], pa, bv[2], bv[3]);
        }
      }
    }
    if (tid < kKeys) fetch_end(ahead, (x + NS) % (NS + 1));
  }

  // ---- 5. epilogue: combine key groups, normalize, write o / lse or the split's partial --------------
  cp_async_wait<0>();
  __syncthreads();  // the stages (and Q) are free: the fp32 epilogue aliases them
  constexpr int kEpi = C::kEpiStride;
  float* eo = reinterpret_cast<float*>(smem + L.epi);  // [WK][ROWS][D + 8]
  float* em = eo + kWK * ROWS * kEpi;                   // [WK][ROWS] running max (exp2 domain)
  float* el = em + kWK * ROWS;                          // [WK][ROWS] sum of exp2
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l_run[j] += __shfl_xor_sync(kFullMask, l_run[j], 1);
    l_run[j] += __shfl_xor_sync(kFullMask, l_run[j], 2);
  }
  {
    const int r0 = wr * 16 + (lane >> 2);
    float* w0 = eo + (wk * ROWS + r0) * kEpi + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      *reinterpret_cast<float2*>(w0 + n * 8) = make_float2(o[n][0], o[n][1]);
      *reinterpret_cast<float2*>(w0 + 8 * kEpi + n * 8) = make_float2(o[n][2], o[n][3]);
    }
    if ((lane & 3) == 0) {
      em[wk * ROWS + r0] = m_run[0];
      el[wk * ROWS + r0] = l_run[0];
      em[wk * ROWS + r0 + 8] = m_run[1];
      el[wk * ROWS + r0 + 8] = l_run[1];
    }
  }
  __syncthreads();

  const int64_t item = static_cast<int64_t>(blockIdx.x) * gridDim.y + g;
  T* og = static_cast<T*>(p.o);
  const auto store_o = [&](int64_t tok, int head, int c, const float (&v)[8]) {
    uint4 pk;
    pk.x = M::pack(v[0], v[1]);
    pk.y = M::pack(v[2], v[3]);
    pk.z = M::pack(v[4], v[5]);
    pk.w = M::pack(v[6], v[7]);
    *reinterpret_cast<uint4*>(og + tok * p.o_stride_token + static_cast<int64_t>(head) * p.o_stride_head + c * 8) = pk;
  };
  for (int idx = tid; idx < ROWS * kDT; idx += kThreads) {
    const int r = idx / kDT, c = idx % kDT;
    const int i = r >> gp_shift, h = r & (GP - 1);
    if (i >= nt || h >= G) continue;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWK; ++w) m = fmaxf(m, em[w * ROWS + r]);
    float l = 0.f, acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < kWK; ++w) {
      const float mw = em[w * ROWS + r];
      if (mw == -INFINITY) continue;
      const float wt = mw == m ? 1.f : exp2_approx(mw - m);
      l += wt * el[w * ROWS + r];
      const float4 a = *reinterpret_cast<const float4*>(eo + (w * ROWS + r) * kEpi + c * 8);
      const float4 z = *reinterpret_cast<const float4*>(eo + (w * ROWS + r) * kEpi + c * 8 + 4);
      acc[0] += wt * a.x, acc[1] += wt * a.y, acc[2] += wt * a.z, acc[3] += wt * a.w;
      acc[4] += wt * z.x, acc[5] += wt * z.y, acc[6] += wt * z.z, acc[7] += wt * z.w;
    }
    float lse = -INFINITY;
    if (l > 0.f) {
      const float inv = 1.f / l;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] *= inv;
      lse = (m + log2f(l)) * kLn2;
    }
    const int64_t tok = tok_base + i;
    const int head = g * G + h;
    if (S == 1) {
      store_o(tok, head, c, acc);
      if (p.lse && c == 0) p.lse[tok * p.lse_stride_token + static_cast<int64_t>(head) * p.lse_stride_head] = lse;
    } else {
      const int64_t row = (item * S + split) * ROWS + r;
      float4* dst = reinterpret_cast<float4*>(kp.part_o + row * D + c * 8);
      dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (c == 0) kp.part_lse[row] = lse;
    }
  }
  if (S == 1) return;

  // ---- fused split merge: the last split of the item to arrive merges all of them in split order ----
  __threadfence();  // this CTA's partials are visible device-wide before it counts itself in
  __syncthreads();
  if (tid == 0) scratch[kScratchIsLast] = atomicAdd(kp.counters + item, 1u) == static_cast<unsigned>(S - 1);
  __syncthreads();
  if (!scratch[kScratchIsLast]) return;
  __threadfence();
  for (int idx = tid; idx < ROWS * kDT; idx += kThreads) {
    const int r = idx / kDT, c = idx % kDT;
    const int i = r >> gp_shift, h = r & (GP - 1);
    if (i >= nt || h >= G) continue;
    const int64_t row0 = item * S * ROWS + r;  // split s at row0 + s * ROWS
    // Unrolled by 4 so that several partials' loads (L2 hits) are in flight per thread.
    float m = -INFINITY;
#pragma unroll 4
    for (int sp = 0; sp < S; ++sp) m = lse_fold_max(m, __ldcg(kp.part_lse + row0 + sp * ROWS));
    float sum = 0.f, acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float lse = -INFINITY;
    if (m != -INFINITY) {
#pragma unroll 4
      for (int sp = 0; sp < S; ++sp) {
        const float ls = __ldcg(kp.part_lse + row0 + sp * ROWS);
        if (ls == -INFINITY) continue;
        const float wt = lse_weight(ls, m);
        sum += wt;
        const float4* src = reinterpret_cast<const float4*>(kp.part_o + (row0 + sp * ROWS) * D + c * 8);
        const float4 a = __ldcg(src), z = __ldcg(src + 1);
        acc[0] += wt * a.x, acc[1] += wt * a.y, acc[2] += wt * a.z, acc[3] += wt * a.w;
        acc[4] += wt * z.x, acc[5] += wt * z.y, acc[6] += wt * z.z, acc[7] += wt * z.w;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] /= sum;
      lse = m + logf(sum);
    }
    const int64_t tok = tok_base + i;
    const int head = g * G + h;
    store_o(tok, head, c, acc);
    if (p.lse && c == 0) p.lse[tok * p.lse_stride_token + static_cast<int64_t>(head) * p.lse_stride_head] = lse;
  }
  if (tid == 0) kp.counters[item] = 0;  // ready for the next launch (graph replays reuse the plan)
}

// Kernel entry points of one (dtype, head dim) for the row counts; instantiated per .cu file.
template <typename T, int D>
const void* kernel_for_rows(int rows) {
  switch (rows) {
    case 16: return reinterpret_cast<const void*>(&paged_attention_kernel<T, D, 16>);
    case 64: return reinterpret_cast<const void*>(&paged_attention_kernel<T, D, 64>);
    case 128: return reinterpret_cast<const void*>(&paged_attention_kernel<T, D, 128>);
    default: return nullptr;
  }
}

}  // namespace msa::detail::cuda::paged
