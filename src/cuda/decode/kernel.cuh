// The paged attention kernel (sm_80+): decode and the portable prefill path, sparse (top-k blocks)
// and dense, any page size and page strides, optional LSE, split-KV with a fused merge.
//
// One CTA = one work item (tile of query tokens of request b, KV head g, split s); see config.cuh
// for the tile geometry. Its steps:
//  1. find the tile (decode: from blockIdx; prefill: scan of qo_indptr) and clamp every length read
//     from the device (nothing here trusts a value: lengths, indptr, pages and blocks are bounded);
//  2. start the Q tile load (cp.async), build the tile's block list (sparse: union of the tokens'
//     valid entries, sorted, with a token mask per block; dense: blocks 0 .. ceil(kv_hi/128)-1, ending
//     with the page-table row) and take this split's contiguous range of it (decode reads the block
//     indexes of a guessed token row together with qo_indptr, so that the two dependent reads overlap);
//  3. stream the range's key tiles through a multi-stage cp.async pipeline: one thread per key
//     resolves the key's page through the page table one tile ahead of its load, into a ring of
//     offsets; invisible keys (past the causal frontier or kv_len, bad page) are zero-filled;
//  4. per warp: S = Q K^T (mma.sync m16n8k16), mask, online softmax in the exp2 domain, O += P V;
//  5. combine the key-group warps, normalize, write o / lse (one split; one key group: epilogue_one_group, in
//     registers) or an fp32 partial; the last split of an item to finish (arrival counter) merges the partials
//     in split order (split_merge.cuh) and resets the counter for the next launch (CUDA graph replay).
// Launched with programmatic stream serialization on sm_90, the grid may start while the previous
// kernel of the stream finishes: every device read comes after arch::grid_dependency_wait().
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "cuda/arch/fast_math.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/arch/sm80.cuh"
#include "cuda/decode/block_list.cuh"
#include "cuda/decode/config.cuh"
#include "cuda/decode/fp8_tile.cuh"
#include "cuda/decode/kernel_params.cuh"
#include "cuda/decode/merge_math.cuh"
#include "cuda/decode/prewait_prefetch.cuh"
#include "cuda/decode/request.cuh"
#include "cuda/decode/split_merge.cuh"

namespace msa::detail::cuda::decode {

// int32 slots of SmemLayout::scratch past the 32 the scan uses.
constexpr int kScratchTileReq = 40;
constexpr int kScratchTileIdx = 41;
constexpr int kScratchIsLast = 42;
constexpr int kScratchListLen = 43;

// Slack of the lazy running maximum (exp2 domain): p = 2^(x - m) stays <= 2^8.
constexpr float kLazyMaxSlack = 8.f;

__device__ __forceinline__ uint64_t low_bits(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

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

// The epilogue of a tile whose warps each hold all keys of their rows (one key group: the 64- and 128-row tiles) and
// that is not split (the portable prefill's tiles when unsplit; decode at G > 16 unsplit): per row, its four threads
// sum l and form the scale 1 / l (times out_scale) and the lse once, then write o x scale in q's type to shared
// memory (a row of D + 8 elements: the fragments' 4-byte writes of 8 rows meet 32 banks), and the CTA stores 16-byte
// runs of the real rows. Per row the same arithmetic as the general epilogue's (a row that saw nothing writes o = 0
// and lse = -inf; a NaN l leaves o unscaled and lse NaN), without its fp32 staging, its per-chunk division and
// logarithm, or its key-group weights.
template <int ROWS, int MT, int D, typename T, typename RealRow, typename RowO, typename RowLse>
__device__ __forceinline__ void epilogue_one_group(const float (&o)[MT][D / 8][4], const float (&m_run)[MT][2],
                                                   const float (&l_run)[MT][2], T* so, int warp_row0,
                                                   const RealRow& real_row, const RowO& row_o, const RowLse& row_lse,
                                                   bool with_lse, float out_scale) {
  constexpr int kStride = D + 8;  // elements of a staged row
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    float scale[2];
    bool none[2];
    const int r0 = warp_row0 + 16 * t + (lane >> 2);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float l = l_run[t][j];
      l += __shfl_xor_sync(kFullMask, l, 1);
      l += __shfl_xor_sync(kFullMask, l, 2);
      const float m = m_run[t][j];
      none[j] = m == -INFINITY && l == 0.f;  // no key: the general epilogue skips the group (o = 0)
      scale[j] = l > 0.f ? 1.f / l * out_scale : 1.f;
      float lse = l == 0.f ? -INFINITY : l;
      if (l > 0.f) lse = (m + log2f(l)) * kLn2;
      if (with_lse && (lane & 3) == 0 && real_row(r0 + 8 * j)) *row_lse(r0 + 8 * j) = lse;
    }
    T* w0 = so + r0 * kStride + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const float a = none[0] ? 0.f : o[t][n][0] * scale[0], b = none[0] ? 0.f : o[t][n][1] * scale[0];
      const float c = none[1] ? 0.f : o[t][n][2] * scale[1], d = none[1] ? 0.f : o[t][n][3] * scale[1];
      *reinterpret_cast<uint32_t*>(w0 + n * 8) = arch::pack2<T>(a, b);
      *reinterpret_cast<uint32_t*>(w0 + 8 * kStride + n * 8) = arch::pack2<T>(c, d);
    }
  }
  __syncthreads();
  constexpr int kChunks = D / 8;  // 16-byte runs of a row in q's type
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += blockDim.x) {
    const int r = idx / kChunks, c = idx % kChunks;
    if (!real_row(r)) continue;
    *reinterpret_cast<uint4*>(row_o(r) + c * 8) = *reinterpret_cast<const uint4*>(so + r * kStride + c * 8);
  }
}

// T: q's and o's type; KV: the cache's (T, or E4M3: fp8 tiles converted in shared memory, fp8_tile.cuh).
template <typename T, typename KV, int D, int ROWS, int KEYS, int MT>
__global__ void __launch_bounds__(TileConfig<D, ROWS, KEYS, MT>::kThreads,
                                  TileConfig<D, ROWS, KEYS, MT>::kMinBlocksPerSm)
    paged_attention_kernel(const __grid_constant__ KernelParams kp) {
  using C = TileConfig<D, ROWS, KEYS, MT>;
  constexpr bool kF8 = kIsFp8<KV>;
  using PT = PvType<T, KV>;  // P V's MMA type
  constexpr int kThreads = C::kThreads;
  constexpr int kKeys = C::kKeys;
  constexpr int kWK = C::kKeyGroups;
  constexpr int kMT = C::kMTiles;     // 16-row m-tiles per warp
  constexpr int kWarpRows = 16 * kMT;
  constexpr int kKW = C::kWarpKeys;
  constexpr int kNT = kKW / 8;        // key n-tiles of S per warp
  constexpr int kDT = D / 8;          // dv n-tiles of O
  constexpr int kCpr = C::kChunksPerRow;
  constexpr int kTPB = C::kTilesPerBlock;
  constexpr int kStageElems = 2 * kKeys * D;
  constexpr int kMaxNS = kF8 ? fp8_stages(C::kMaxStages) : C::kMaxStages;

  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionParams& p = kp.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp / kWK, wk = warp % kWK;
  const int NS = kp.num_stages;
  const SmemLayout L = smem_layout<D, ROWS, KEYS, MT>(NS, kp.list_cap, kF8);
  int* scratch = reinterpret_cast<int*>(smem + L.scratch);
  constexpr uint32_t kRowBytes = D * 2;  // one K/V/Q row in shared memory
  constexpr uint32_t kStageBytes = kStageElems * 2;  // a 16-bit K + V tile
  constexpr uint32_t kLoadRowBytes = D * sizeof(KV);  // one K / V row of a ring stage
  constexpr uint32_t kLoadStageBytes = kStageElems * sizeof(KV);
  const uint32_t conv = arch::smem_addr(smem) + L.conv;  // fp8: the converted tile the MMAs read
  const uint32_t stages = arch::smem_addr(smem) + L.stages;  // shared-window byte addresses from here on
  ulonglong2* ring = reinterpret_cast<ulonglong2*>(smem + L.ring_off);
  uint64_t* ring_valid = reinterpret_cast<uint64_t*>(smem + L.ring_valid);
  int32_t* sort_buf = reinterpret_cast<int32_t*>(smem + L.sort_keys);
  int32_t* list_blk = reinterpret_cast<int32_t*>(smem + L.list_blk);
  uint64_t* list_mask = reinterpret_cast<uint64_t*>(smem + L.list_mask);

  // ---- 1. the tile and its request -------------------------------------------------------------
  // Decode (PDL: the grid is resident while the previous kernel runs): the first trips' lines into the L2
  // before the wait, for the guessed token rows of a full batch (prewait_prefetch.cuh).
  if (kp.prewait_prefetch != 0 && !kp.scan_tiles && warp == 0) {
    const int pb = blockIdx.x / kp.tiles_per_req;
    const int64_t pfirst = static_cast<int64_t>(blockIdx.x % kp.tiles_per_req) * kp.tile_tokens;
    const int64_t pleft = kp.spec_qo_len - pfirst;
    const int pnt = static_cast<int>(pleft <= 0 ? 0 : (pleft < kp.tile_tokens ? pleft : kp.tile_tokens));
    prefetch_first_trips(kp, lane, pb, blockIdx.y, static_cast<int64_t>(pb) * kp.spec_qo_len + pfirst, pnt);
  }
  arch::grid_dependency_wait();   // nothing the previous kernel wrote is read before this (PDL)
  arch::allow_dependent_launch(); // the next kernel may take free SM slots and wait there for this one
  const int g = blockIdx.y, split = blockIdx.z, S = kp.num_splits;
  // Items of the KV-major path (written by the previous kernel: after the PDL wait); the whole
  // cluster or item returns together, its counters untouched.
  if (kp.skip_items != nullptr && kp.skip_items[static_cast<int64_t>(blockIdx.x) * gridDim.y + g] != 0) return;
  const bool sparse = p.block_idx != nullptr;
  int b, tile;
  if (kp.scan_tiles) {
    if (!find_scan_tile<kThreads>(p.seqs, kp.tile_tokens, blockIdx.x, scratch, b, tile)) return;
  } else {
    b = blockIdx.x / kp.tiles_per_req;
    tile = blockIdx.x % kp.tiles_per_req;
  }
  const int64_t first = static_cast<int64_t>(tile) * kp.tile_tokens;

  // Entry e of the tile's list is (token e / topk, slot e % topk). When the list has at most one
  // entry per thread, thread e reads entry e; decode first guesses the tile's token row (a full
  // batch: request b starts at row b * spec_qo_len) so that this read overlaps the qo_indptr read
  // it would otherwise wait for (~1 us at D-B1); a wrong guess (ragged batch) reads again below.
  const bool one_entry = sparse && kp.list_cap <= kThreads;
  const auto read_entry = [&](int64_t tok0, int e) {
    const int i = e / p.topk, k = e - i * p.topk;
    return p.block_idx[(tok0 + i) * p.bi_stride_token + static_cast<int64_t>(g) * p.bi_stride_head +
                       static_cast<int64_t>(k) * p.bi_stride_k];
  };
  int32_t entry = -1;
  int64_t spec_tok = -1;
  int spec_nt = 0;
  if (one_entry && kp.spec_qo_len > 0) {
    spec_tok = static_cast<int64_t>(b) * kp.spec_qo_len + first;
    const int64_t left = kp.spec_qo_len - first;
    spec_nt = static_cast<int>(left <= 0 ? 0 : (left < kp.tile_tokens ? left : kp.tile_tokens));
    if (tid < spec_nt * p.topk && spec_tok + tid / p.topk < p.seqs.total_q) entry = read_entry(spec_tok, tid);
  }

  int64_t q0, q1;
  request_rows(p.seqs, b, q0, q1);
  const int kv_len = max(p.seqs.kv_lens[b], 0);
  const int64_t qo_off = p.seqs.qo_offset ? static_cast<int64_t>(p.seqs.qo_offset[b]) : kv_len - (q1 - q0);
  const int64_t left = q1 - q0 - first;
  const int nt = static_cast<int>(left <= 0 ? 0 : (left < kp.tile_tokens ? left : kp.tile_tokens));
  if (nt == 0) return;  // every split of this item returns here too: its counter stays untouched
  const int64_t tok_base = q0 + first;   // global token index of the tile's token 0
  const int64_t pos_base = qo_off + first;  // its absolute position
  const int kv_hi = p.causal ? max(0, min(kv_len, clamp_pos(pos_base + nt))) : kv_len;  // keys any row sees
  const int nblk = static_cast<int>((static_cast<int64_t>(kv_len) + kBlock - 1) / kBlock);
  const int G = p.group_size, GP = kp.group_pad, gp_shift = __ffs(GP) - 1;
  // The request's page-table row (read here, while the block list is built).
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

  // ---- 2a. Q tile -> shared (the last stage when Q then moves to registers) ---------------------
  // Rows are stored with their 16-byte chunks swizzled (chunk c of row r at c ^ (r & 7)), so the 8
  // rows an ldmatrix reads hit 8 different bank groups.
  const uint32_t qs = !C::kQInRegs ? arch::smem_addr(smem) + L.q : kF8 ? conv : stages + (NS - 1) * kStageBytes;
  {
    const T* qg = static_cast<const T*>(p.q);
    for (int idx = tid; idx < ROWS * kCpr; idx += kThreads) {
      const int r = idx / kCpr, c = idx % kCpr;
      const int i = r >> gp_shift, h = r & (GP - 1);
      const bool ok = i < nt && h < G;
      const T* src = ok ? qg + (tok_base + i) * p.q_stride_token + static_cast<int64_t>(g * G + h) * p.q_stride_head +
                              c * 8
                        : qg;
      arch::cp_async_16(qs + r * kRowBytes + ((c ^ (r & 7)) << 4), src, ok ? 16 : 0);
    }
    arch::cp_async_commit();
  }

  // ---- 2b. block list and this split's range ---------------------------------------------------
  int n_list;
  if (sparse) {
    const int topk = p.topk, n_ent = nt * topk;  // <= list_cap: nt <= tile_tokens
    // A block past the token's own causal frontier shows it nothing: the token does not select it.
    const auto key_of = [&](int e, int32_t blk) {
      const int i = e / topk;
      const bool ok = blk >= 0 && blk < nblk && (!p.causal || static_cast<int64_t>(blk) * kBlock <= pos_base + i);
      return ok ? (blk << 6) | i : kNoEntry;
    };
    if (one_entry) {
      if (tid < n_ent && !(tok_base == spec_tok && nt == spec_nt)) entry = read_entry(tok_base, tid);
      const int32_t key = tid < n_ent ? key_of(tid, entry) : kNoEntry;
      if (kp.list_cap <= 32) {
        if (warp == 0) {
          const int n = build_list_in_warp(key, kp.list_cap, list_blk, list_mask);
          if (lane == 0) scratch[kScratchListLen] = n;
        }
        __syncthreads();
        n_list = scratch[kScratchListLen];
      } else {
        sort_keys_in_registers<kThreads>(key, sort_buf, kp.list_cap);  // one_entry: list_cap <= kThreads
        n_list = compact_runs<kThreads>(sort_buf, kp.list_cap, list_blk, list_mask, scratch);
        __syncthreads();
      }
    } else {
      for (int e = tid; e < kp.list_cap; e += kThreads)
        sort_buf[e] = e < n_ent ? key_of(e, read_entry(tok_base, e)) : kNoEntry;
      __syncthreads();
      sort_keys<kThreads>(sort_buf, kp.list_cap);
      n_list = compact_runs<kThreads>(sort_buf, kp.list_cap, list_blk, list_mask, scratch);
      __syncthreads();
    }
  } else {
    // Keys past the page-table row have no page (invisible): the blocks end there too, so that a device kv_len far
    // past the plan's (a caller error) cannot stretch the loop over millions of empty tiles.
    const int64_t keys = min(static_cast<int64_t>(kv_hi), row_len * p.k.page_size);
    n_list = static_cast<int>((keys + kBlock - 1) / kBlock);
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

  // ---- the two MMA rows of this thread: token, position; the warp's tokens and positions ---------
  // Row j of m-tile t: wr * kWarpRows + 16 t + lane / 4 + 8 j.
  int tok_of[kMT][2], pos_of[kMT][2];
  uint64_t my_tokens = 0;
  int my_pos_max = -1, my_pos_min = INT_MAX;
#pragma unroll
  for (int t = 0; t < kMT; ++t) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = wr * kWarpRows + 16 * t + (lane >> 2) + 8 * j;
      const int i = r >> gp_shift, h = r & (GP - 1);
      const bool ok = i < nt && h < G;
      tok_of[t][j] = ok ? i : -1;
      pos_of[t][j] = ok ? clamp_pos(pos_base + i) : -1;
      my_tokens |= ok ? 1ull << i : 0ull;
      my_pos_max = max(my_pos_max, pos_of[t][j]);
      my_pos_min = min(my_pos_min, ok ? pos_of[t][j] : INT_MAX);
    }
  }
  const uint64_t warp_tokens =
      static_cast<uint64_t>(__reduce_or_sync(kFullMask, static_cast<unsigned>(my_tokens))) |
      (static_cast<uint64_t>(__reduce_or_sync(kFullMask, static_cast<unsigned>(my_tokens >> 32))) << 32);
  const int warp_pos_max = __reduce_max_sync(kFullMask, my_pos_max);
  // Smallest position of the warp's query rows (INT_MAX for a warp of padding rows only).
  const int warp_pos_min = __reduce_min_sync(kFullMask, my_pos_min);

  // ---- 3. key rows through the page table, one thread per key of a tile ---------------------------
  // Page of key j: j >> page_shift for a power-of-two page size (every serving pool), else a 32-bit
  // division (j < kv_hi <= INT_MAX). Rows go to the ring as pointers, so a tile load is a shared
  // read and an add per row.
  const int page_size = p.k.page_size, page_shift = kp.page_shift;
  const KV* kg = static_cast<const KV*>(p.k.data);
  const KV* vg = static_cast<const KV*>(p.v.data);
  const KV* kg_head = kg + static_cast<int64_t>(g) * p.k.stride_head;
  const KV* vg_head = vg + static_cast<int64_t>(g) * p.v.stride_head;
  struct KeyFetch {
    int32_t page = -1;
    int32_t off = 0;
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
        const uint32_t ju = static_cast<uint32_t>(j);
        const uint32_t lp = page_shift >= 0 ? ju >> page_shift : ju / static_cast<uint32_t>(page_size);
        if (lp < row_len) {
          f.page = __ldg(p.pages.table + row_base + lp);
          f.off = static_cast<int32_t>(ju - lp * static_cast<uint32_t>(page_size));
        }
      }
    }
    return f;
  };
  const auto fetch_end = [&](const KeyFetch& f, int slot) {
    const bool ok = f.page >= 0 && f.page < p.pages.num_pages;
    ulonglong2 rows;
    rows.x = reinterpret_cast<uint64_t>(ok ? kg_head + f.page * p.k.stride_page + f.off * p.k.stride_token : kg);
    rows.y = reinterpret_cast<uint64_t>(ok ? vg_head + f.page * p.v.stride_page + f.off * p.v.stride_token : vg);
    ring[slot * kKeys + tid] = rows;
    const unsigned bits = __ballot_sync(kFullMask, ok);
    if (lane == 0) reinterpret_cast<uint32_t*>(ring_valid + slot)[warp] = bits;
  };
  // Thread (row r0 + pass * kLoadRowsPerPass, 8-chunk lane t8) of a tile load; see config.cuh.
  constexpr int kRPP = C::kLoadRowsPerPass;
  const int t8 = tid & 7, r0 = tid >> 3;
  // 16-bit rows land swizzled; fp8 rows land as they are (fp8_tile.cuh converts them), chunks t8 + 8c.
  const uint32_t ld_dst = kF8 ? r0 * kLoadRowBytes + t8 * 16 : r0 * kRowBytes + ((t8 ^ (r0 & 7)) << 4);
  constexpr int kF8Chunks = D / 16;  // 16-byte chunks of an fp8 row: 4, 8 or 16
  const auto load_tile = [&](int stage, int slot) {
    const uint32_t ks = stages + stage * kLoadStageBytes + ld_dst;
    const uint32_t vs = ks + kKeys * kLoadRowBytes;
    const ulonglong2* rows = ring + slot * kKeys + r0;
    const uint64_t vbits = ring_valid[slot] >> r0;
#pragma unroll
    for (int it = 0; it < C::kLoadPasses; ++it) {
      const ulonglong2 rp = rows[it * kRPP];
      const bool fill = (vbits >> (it * kRPP)) & 1ull;
      const char* kr = reinterpret_cast<const char*>(rp.x) + t8 * 16;
      const char* vr = reinterpret_cast<const char*>(rp.y) + t8 * 16;
      if constexpr (kF8) {
#pragma unroll
        for (int c = 0; c < (kF8Chunks + 7) / 8; ++c) {
          if (kF8Chunks >= 8 || t8 < kF8Chunks) {
            arch::cp_async_16_pred(ks + it * kRPP * kLoadRowBytes + c * 128, kr + c * 128, fill);
            arch::cp_async_16_pred(vs + it * kRPP * kLoadRowBytes + c * 128, vr + c * 128, fill);
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < C::kLoadChunks; ++c) {
          arch::cp_async_16_pred(ks + it * kRPP * kRowBytes + c * 128, kr + c * 128, fill);
          arch::cp_async_16_pred(vs + it * kRPP * kRowBytes + c * 128, vr + c * 128, fill);
        }
      }
    }
  };

  // Prologue: rows of tiles 0..NS-1, loads of tiles 0..NS-2 (cp.async groups after Q's).
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
    arch::cp_async_commit();
  }
  arch::cp_async_wait_dyn(NS - 1);  // the Q group
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
  const uint32_t q_lane = qs + (wr * kWarpRows + (lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes;  // + 16 t rows
  const uint32_t k_lane = (wk * kKW + ((lane >> 4) << 3) + (lane & 7)) * kRowBytes;       // + stage base
  const uint32_t v_lane = kKeys * kRowBytes + (wk * kKW + ((lane >> 3) & 1) * 8 + (lane & 7)) * kRowBytes;
  uint32_t qa[kMT][C::kQInRegs ? D / 16 : 1][4];
  if constexpr (C::kQInRegs) {
#pragma unroll
    for (int t = 0; t < kMT; ++t) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        arch::ldmatrix_x4(qa[t][kk], q_lane + t * 16 * kRowBytes + (kk >> 2) * 128 + swz_a[kk & 3]);
    }
  }

  // ---- 4. the key tiles ------------------------------------------------------------------------
  float o[kMT][kDT][4];
  float m_run[kMT][2], l_run[kMT][2];
#pragma unroll
  for (int t = 0; t < kMT; ++t) {
#pragma unroll
    for (int n = 0; n < kDT; ++n) o[t][n][0] = o[t][n][1] = o[t][n][2] = o[t][n][3] = 0.f;
    m_run[t][0] = m_run[t][1] = -INFINITY;
    l_run[t][0] = l_run[t][1] = 0.f;
  }
  // fp8 tiles hold the e4m3 values / e4m3_f16_unscale() (store_fp8_rows_as): the logits and o take the factor back.
  const float sl2 = kF8 ? kp.scale_log2 * arch::e4m3_f16_unscale() : kp.scale_log2;
  const uint64_t warp_keys = low_bits(kKW) << (wk * kKW);  // this warp's keys of a tile
  // Stage and ring slot of tile x (x % NS, x % (NS+1)), of the tile loaded in iteration x
  // (x+NS-1), and the slot filled at its end (x+NS), stepped instead of divided.
  int stage = 0, slot = 0, ld_stage = NS - 1, ld_slot = NS - 1, fe_slot = NS;
  const auto step = [](int v, int n) { return v + 1 == n ? 0 : v + 1; };

  for (int x = 0; x < n_tiles; ++x) {
    arch::cp_async_wait_dyn(NS - 2);
    __syncthreads();  // tile x landed for every thread; the stage and ring slot of tile x-1 are free
    if (x + NS - 1 < n_tiles) load_tile(ld_stage, ld_slot);
    arch::cp_async_commit();
    KeyFetch ahead;
    if (tid < kKeys) ahead = fetch_begin(x + NS);
    if constexpr (kF8) {  // tile x into the 16-bit tile every warp then reads (the previous one's reads are done)
      const uint32_t k8 = stages + stage * kLoadStageBytes;
      Fp8Rows<D, kKeys, kThreads> kr8, vr8;
      load_fp8_rows(k8, tid, kr8);
      load_fp8_rows(k8 + kKeys * kLoadRowBytes, tid, vr8);
      store_fp8_rows_as<T>(conv, tid, kr8);
      store_fp8_rows_as<__half>(conv + kKeys * kRowBytes, tid, vr8);
      __syncthreads();
    }

    const int u = lb + x / kTPB;
    const int blk = sparse ? list_blk[u] : u;
    const uint64_t blk_tokens = sparse ? list_mask[u] : all_tokens;
    const int key0 = blk * kBlock + (x % kTPB) * kKeys;  // first key of the tile
    const uint64_t valid = ring_valid[slot] & warp_keys;
    const bool active = (blk_tokens & warp_tokens) != 0 && valid != 0 && !(p.causal && key0 + wk * kKW > warp_pos_max);
    if (active) {
      const uint32_t stage_base = kF8 ? conv : stages + stage * kStageBytes;
      float s[kMT][kNT][4];
#pragma unroll
      for (int t = 0; t < kMT; ++t) {
#pragma unroll
        for (int n = 0; n < kNT; ++n) s[t][n][0] = s[t][n][1] = s[t][n][2] = s[t][n][3] = 0.f;
      }
      // k-step kk = 4*hi + q covers dims [16 kk, 16 kk + 16) = chunks 8*hi + 2q (+1). With Q in
      // shared memory (D=256, or two m-tiles a warp) the hi loop stays rolled so the fragment loads are
      // not all hoisted ahead of the MMAs (that would spill next to the O accumulator).
#pragma unroll(C::kQInRegs ? D / 64 : 1)
      for (int hi = 0; hi < D / 64; ++hi) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t a[kMT][4];
#pragma unroll
          for (int t = 0; t < kMT; ++t) {
            if constexpr (C::kQInRegs) {
              const int kk = hi * 4 + q;
              a[t][0] = qa[t][kk][0], a[t][1] = qa[t][kk][1], a[t][2] = qa[t][kk][2], a[t][3] = qa[t][kk][3];
            } else {
              arch::ldmatrix_x4(a[t], q_lane + t * 16 * kRowBytes + hi * 128 + swz_a[q]);
            }
          }
#pragma unroll
          for (int np = 0; np < kNT / 2; ++np) {
            uint32_t bk[4];
            arch::ldmatrix_x4(bk, stage_base + k_lane + np * 16 * kRowBytes + hi * 128 + swz_b[q]);
#pragma unroll
            for (int t = 0; t < kMT; ++t) {
              arch::mma_m16n8k16<T>(s[t][2 * np], a[t], bk[0], bk[1]);
              arch::mma_m16n8k16<T>(s[t][2 * np + 1], a[t], bk[2], bk[3]);
            }
          }
        }
      }
      // Visibility: the row's token selected this block, the key exists (page, kv_len), causal
      // order. Most tiles are visible to every row of the warp (all of a decode token's blocks but
      // its last): they skip the per-element mask (warp-uniform test).
      const bool all_visible = valid == warp_keys && (blk_tokens & warp_tokens) == warp_tokens &&
                               !(p.causal && key0 + (wk + 1) * kKW - 1 > warp_pos_min);
      if (all_visible) {
#pragma unroll
        for (int t = 0; t < kMT; ++t) {
#pragma unroll
          for (int n = 0; n < kNT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[t][n][e] *= sl2;
          }
        }
      } else {
#pragma unroll
        for (int t = 0; t < kMT; ++t) {
          bool row_sel[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) row_sel[j] = tok_of[t][j] >= 0 && ((blk_tokens >> tok_of[t][j]) & 1ull);
#pragma unroll
          for (int n = 0; n < kNT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int kl = wk * kKW + n * 8 + (lane & 3) * 2 + (e & 1);
              const int j = e >> 1;
              const bool vis = row_sel[j] && ((valid >> kl) & 1ull) && (!p.causal || key0 + kl <= pos_of[t][j]);
              s[t][n][e] = vis ? s[t][n][e] * sl2 : -INFINITY;
            }
          }
        }
      }
      float mx[kMT][2];
#pragma unroll
      for (int t = 0; t < kMT; ++t) {
        mx[t][0] = mx[t][1] = -INFINITY;
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          mx[t][0] = fmaxf(mx[t][0], fmaxf(s[t][n][0], s[t][n][1]));
          mx[t][1] = fmaxf(mx[t][1], fmaxf(s[t][n][2], s[t][n][3]));
        }
      }
      // Online softmax in the exp2 domain with a lazy maximum: the running max m moves only when a
      // row's new logits exceed it by more than 8 (so p = 2^(x - m) <= 256, far from fp32/bf16
      // limits, and l, o stay consistent with m); most tiles then skip the rescale of o (64 FMULs
      // per thread at D=128) by a warp-uniform vote. A row that has seen nothing keeps m = -inf
      // and uses 0 as its base, so exp2(-inf - 0) = 0 and nothing turns into NaN.
      bool grow = false;
#pragma unroll
      for (int t = 0; t < kMT; ++t) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          mx[t][j] = fmaxf(mx[t][j], __shfl_xor_sync(kFullMask, mx[t][j], 1));
          mx[t][j] = fmaxf(mx[t][j], __shfl_xor_sync(kFullMask, mx[t][j], 2));
          grow |= mx[t][j] > m_run[t][j] + kLazyMaxSlack;
        }
      }
      if (__any_sync(kFullMask, grow)) {
#pragma unroll
        for (int t = 0; t < kMT; ++t) {
          float scale_old[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float m_new = fmaxf(m_run[t][j], mx[t][j]);
            scale_old[j] = arch::exp2_approx(m_run[t][j] - (m_new == -INFINITY ? 0.f : m_new));
            m_run[t][j] = m_new;
            l_run[t][j] *= scale_old[j];
          }
#pragma unroll
          for (int n = 0; n < kDT; ++n) {
            o[t][n][0] *= scale_old[0];
            o[t][n][1] *= scale_old[0];
            o[t][n][2] *= scale_old[1];
            o[t][n][3] *= scale_old[1];
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kMT; ++t) {
        const float base[2] = {m_run[t][0] == -INFINITY ? 0.f : m_run[t][0],
                               m_run[t][1] == -INFINITY ? 0.f : m_run[t][1]};
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[t][n][e] = arch::exp2_approx(s[t][n][e] - base[e >> 1]);
            l_run[t][e >> 1] += s[t][n][e];
          }
        }
      }
      // O += P V: the S accumulators of two key n-tiles are the A fragment of one 16-key k-step.
#pragma unroll
      for (int ks16 = 0; ks16 < kKW / 16; ++ks16) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int t = 0; t < kMT; ++t) {
          pa[t][0] = arch::pack2<PT>(s[t][2 * ks16][0], s[t][2 * ks16][1]);
          pa[t][1] = arch::pack2<PT>(s[t][2 * ks16][2], s[t][2 * ks16][3]);
          pa[t][2] = arch::pack2<PT>(s[t][2 * ks16 + 1][0], s[t][2 * ks16 + 1][1]);
          pa[t][3] = arch::pack2<PT>(s[t][2 * ks16 + 1][2], s[t][2 * ks16 + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          uint32_t bv[4];
          arch::ldmatrix_x4_trans(bv, stage_base + v_lane + ks16 * 16 * kRowBytes + (np >> 2) * 128 + swz_a[np & 3]);
#pragma unroll
          for (int t = 0; t < kMT; ++t) {
            arch::mma_m16n8k16<PT>(o[t][2 * np], pa[t], bv[0], bv[1]);
            arch::mma_m16n8k16<PT>(o[t][2 * np + 1], pa[t], bv[2], bv[3]);
          }
        }
      }
    }
    if (tid < kKeys) fetch_end(ahead, fe_slot);
    stage = step(stage, NS);
    ld_stage = step(ld_stage, NS);
    slot = step(slot, NS + 1);
    ld_slot = step(ld_slot, NS + 1);
    fe_slot = step(fe_slot, NS + 1);
  }

  // ---- 5. epilogue: combine key groups, normalize, write o / lse or the split's partial --------------
  arch::cp_async_wait<0>();
  __syncthreads();  // the stages (and Q) are free: the epilogue's staging (fp32; one key group: q's type) aliases them
  T* og = static_cast<T*>(p.o);
  const auto real_row = [&](int r) { return (r >> gp_shift) < nt && (r & (GP - 1)) < G; };
  if constexpr (kWK == 1) {
    if (S == 1) {  // one key group, no split: each thread normalizes its own rows in registers (epilogue_one_group)
      const auto row_o = [&](int r) {
        return og + (tok_base + (r >> gp_shift)) * p.o_stride_token +
               static_cast<int64_t>(g * G + (r & (GP - 1))) * p.o_stride_head;
      };
      const auto row_lse = [&](int r) {
        return p.lse + (tok_base + (r >> gp_shift)) * p.lse_stride_token +
               static_cast<int64_t>(g * G + (r & (GP - 1))) * p.lse_stride_head;
      };
      epilogue_one_group<ROWS, kMT, D>(o, m_run, l_run, reinterpret_cast<T*>(smem + L.epi), wr * kWarpRows, real_row,
                                       row_o, row_lse, p.lse != nullptr,
                                       kF8 ? p.v_scale * arch::e4m3_f16_unscale() : p.v_scale);
      return;
    }
  }
  constexpr int kEpi = C::kEpiStride;
  float* eo = reinterpret_cast<float*>(smem + L.epi);  // [WK][ROWS][D + 8]
  float* em = eo + kWK * ROWS * kEpi;                   // [WK][ROWS] running max (exp2 domain)
  float* el = em + kWK * ROWS;                          // [WK][ROWS] sum of exp2
#pragma unroll
  for (int t = 0; t < kMT; ++t) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      l_run[t][j] += __shfl_xor_sync(kFullMask, l_run[t][j], 1);
      l_run[t][j] += __shfl_xor_sync(kFullMask, l_run[t][j], 2);
    }
    const int r0 = wr * kWarpRows + 16 * t + (lane >> 2);
    float* w0 = eo + (wk * ROWS + r0) * kEpi + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      *reinterpret_cast<float2*>(w0 + n * 8) = make_float2(o[t][n][0], o[t][n][1]);
      *reinterpret_cast<float2*>(w0 + 8 * kEpi + n * 8) = make_float2(o[t][n][2], o[t][n][3]);
    }
    if ((lane & 3) == 0) {
      em[wk * ROWS + r0] = m_run[t][0];
      el[wk * ROWS + r0] = l_run[t][0];
      em[wk * ROWS + r0 + 8] = m_run[t][1];
      el[wk * ROWS + r0 + 8] = l_run[t][1];
    }
  }
  __syncthreads();

  const int64_t item = static_cast<int64_t>(blockIdx.x) * gridDim.y + g;
  const auto store_o = [&](int64_t tok, int head, int c, const float (&v)[8]) {
    uint4 pk;
    pk.x = arch::pack2<T>(v[0], v[1]);
    pk.y = arch::pack2<T>(v[2], v[3]);
    pk.z = arch::pack2<T>(v[4], v[5]);
    pk.w = arch::pack2<T>(v[6], v[7]);
    *reinterpret_cast<uint4*>(og + tok * p.o_stride_token + static_cast<int64_t>(head) * p.o_stride_head + c * 8) = pk;
  };
  const auto emit = [&](int r, int c, const float (&acc)[8], float lse) {
    const int64_t tok = tok_base + (r >> gp_shift);
    const int head = g * G + (r & (GP - 1));
    store_o(tok, head, c, acc);
    if (p.lse && c == 0) p.lse[tok * p.lse_stride_token + static_cast<int64_t>(head) * p.lse_stride_head] = lse;
  };
  float* po = reinterpret_cast<float*>(smem + L.part);  // [ROWS][D]: this split's rows (cluster merge)
  float* plse = po + ROWS * D;                           // [ROWS]
  for (int idx = tid; idx < ROWS * kDT; idx += kThreads) {
    const int r = idx / kDT, c = idx % kDT;
    if (!real_row(r)) continue;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWK; ++w) m = fmaxf(m, em[w * ROWS + r]);
    float l = 0.f, acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < kWK; ++w) {
      const float mw = em[w * ROWS + r], lw = el[w * ROWS + r];
      if (mw == -INFINITY && lw == 0.f) continue;  // no key; a group whose only keys were NaN has lw NaN: kept
      const float wt = mw == m ? 1.f : arch::exp2_approx(mw - m);
      l += wt * lw;
      const float4 a = *reinterpret_cast<const float4*>(eo + (w * ROWS + r) * kEpi + c * 8);
      const float4 z = *reinterpret_cast<const float4*>(eo + (w * ROWS + r) * kEpi + c * 8 + 4);
      acc[0] += wt * a.x, acc[1] += wt * a.y, acc[2] += wt * a.z, acc[3] += wt * a.w;
      acc[4] += wt * z.x, acc[5] += wt * z.y, acc[6] += wt * z.z, acc[7] += wt * z.w;
    }
    float lse = l == 0.f ? -INFINITY : l;  // l NaN (a NaN or Inf key): lse NaN, which the split merges pass on
    if (l > 0.f) {
      // V's dequantization scale (1: the bits of 1 / l), and for fp8 tiles the factor they are short of.
      const float inv = 1.f / l * (kF8 ? p.v_scale * arch::e4m3_f16_unscale() : p.v_scale);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] *= inv;
      lse = (m + log2f(l)) * kLn2;
    }
    if (S == 1) {
      emit(r, c, acc, lse);
    } else {
      float* dst;
      float* dst_lse;
      if (kp.cluster_merge) {
        dst = po + r * D;
        dst_lse = plse + r;
      } else {
        const int64_t row = (item * S + split) * ROWS + r;
        dst = kp.part_o + row * D;
        dst_lse = kp.part_lse + row;
      }
      reinterpret_cast<float4*>(dst + c * 8)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(dst + c * 8)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (c == 0) *dst_lse = lse;
    }
  }
  if (S == 1) return;
  int parts = S;  // partials of the item in the workspace
  if (kp.cluster_merge) {
    const int cs = kp.cluster_size;
    if (cs == S) {
      merge_splits_in_cluster<D, ROWS, kThreads>(arch::smem_addr(po), arch::smem_addr(plse), S, split, real_row, emit);
      return;
    }
    // Two levels: this cluster's merged rows are partial split / cs of the item.
    parts = S / cs;
    const int64_t part_row0 = (item * parts + split / cs) * ROWS;
    const auto emit_part = [&](int r, int c, const float (&acc)[8], float lse) {
      float* dst = kp.part_o + (part_row0 + r) * D + c * 8;
      reinterpret_cast<float4*>(dst)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (c == 0) kp.part_lse[part_row0 + r] = lse;
    };
    merge_splits_in_cluster<D, ROWS, kThreads>(arch::smem_addr(po), arch::smem_addr(plse), cs, split % cs, real_row,
                                               emit_part);
  }

  // ---- fused split merge through the workspace: the last split of the item to arrive merges (all S arrive,
  // with two levels too) -------------------------------------------------------------------------------
  // Release / acquire by one thread around the arrival counter (the CTA barriers order the other
  // threads' partial writes before it and their reads after it).
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    const unsigned arrived = atomicAdd(kp.counters + item, 1u);
    __threadfence();
    scratch[kScratchIsLast] = arrived == static_cast<unsigned>(S - 1);
  }
  __syncthreads();
  if (!scratch[kScratchIsLast]) return;
  merge_splits<D, ROWS, kThreads>(kp.part_o + item * parts * ROWS * D, kp.part_lse + item * parts * ROWS, parts, smem,
                                  L.ring_off, real_row, emit);
  if (tid == 0) kp.counters[item] = 0;  // ready for the next launch (graph replays reuse the plan)
}

// Kernel entry points of one (dtype, cache dtype, head dim) for the row counts, keys per stage and m-tiles per
// warp (0: the defaults, config.cuh); nullptr for a combination with no instance. Instantiated per .cu file.
template <typename T, typename KV, int D>
const void* kernel_for_rows(int rows, int keys, int mtiles) {
  constexpr int kKeys = default_tile_keys(D);
  keys = keys == 0 ? kKeys : keys;
  mtiles = mtiles == 0 ? default_tile_mtiles(D, rows) : mtiles;
  const auto entry = [](auto kernel) { return reinterpret_cast<const void*>(kernel); };
  if (keys == kKeys && mtiles == 1) {
    switch (rows) {
      case 16: return entry(&paged_attention_kernel<T, KV, D, 16, kKeys, 1>);
      case 64: return entry(&paged_attention_kernel<T, KV, D, 64, kKeys, 1>);
      case 128: return entry(&paged_attention_kernel<T, KV, D, 128, kKeys, 1>);
      default: return nullptr;
    }
  }
  if constexpr (D <= 128) {
    if (rows == 128 && mtiles == 2 && keys == kKeys) return entry(&paged_attention_kernel<T, KV, D, 128, kKeys, 2>);
  }
  if constexpr (D == 128) {
    if (rows == 128 && mtiles == 2 && keys == 32) return entry(&paged_attention_kernel<T, KV, D, 128, 32, 2>);
  }
  return nullptr;
}

}  // namespace msa::detail::cuda::decode
