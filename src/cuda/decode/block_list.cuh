// CTA-wide helpers that turn the top-k rows of a tile's tokens into its block list: the union of
// the selected blocks, sorted ascending, each with the mask of the tile's tokens that selected it.
// Sorting makes the result independent of the order inside a row (the contract allows any order)
// and deterministic; the union makes a block shared by several tokens (MTP) load once.
//
// Entries are packed as (block << 6) | token: blocks < 2^24 (kv_len is int32), tokens < 64.
#pragma once

#include <climits>
#include <cstdint>

namespace msa::detail::cuda::decode {

constexpr int32_t kNoEntry = INT_MAX;  // sorts last
constexpr unsigned kFullMask = 0xffffffffu;

// Exclusive prefix sum of one int per thread over the CTA; *total gets the sum. Uses scratch[0..31]
// and leaves it free again on return. Every thread must call it.
template <int THREADS>
__device__ int block_exclusive_scan(int v, int* scratch, int* total) {
  constexpr int kWarps = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFullMask, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  int before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int t = scratch[w];
    before += w < warp ? t : 0;
    sum += t;
  }
  __syncthreads();
  *total = sum;
  return before + x - v;
}

// Ascending bitonic sort of keys[0, n) in shared memory by the whole CTA, n a power of two (lists of more than THREADS
// entries; up to 32 take build_list_in_warp, up to THREADS sort_keys_in_registers). Every thread must call it; keys
// must be visible to all threads on entry (after a barrier) and are on return.
template <int THREADS>
__device__ void sort_keys(int32_t* keys, int n) {
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += THREADS) {
        const int partner = i ^ j;
        if (partner > i) {
          const int a = keys[i], c = keys[partner];
          if ((a > c) == ((i & k) == 0)) {
            keys[i] = c;
            keys[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The same sort of keys[0, n) for n <= THREADS (a power of two), with thread i holding entry i in a register
// (key; threads i >= n pass kNoEntry): the strides below 32 go through warp shuffles, the others through keys[]
// behind two barriers each, plus one at the end: 7 barriers for a list of 128 entries (the prefill tiles' lists: 8
// tokens x top-16), against 29 for the fill's barrier and sort_keys' 28. Every thread must call it; keys[0, n) hold
// the sorted entries on return.
template <int THREADS>
__device__ void sort_keys_in_registers(int32_t key, int32_t* keys, int n) {
  const int i = threadIdx.x;
  int32_t v = i < n ? key : kNoEntry;
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      int32_t o;
      if (j >= 32) {  // partner i ^ j < n exactly when i < n
        if (i < n) keys[i] = v;
        __syncthreads();
        o = i < n ? keys[i ^ j] : kNoEntry;
        __syncthreads();
      } else {
        o = __shfl_xor_sync(kFullMask, v, j);
      }
      const bool lower = (i & j) == 0, ascending = (i & k) == 0;
      v = (lower == ascending) ? min(v, o) : max(v, o);
    }
  }
  if (i < n) keys[i] = v;
  __syncthreads();
}

// The whole list build of up to 32 entries inside one warp, in registers (decode of one token at
// top-k <= 32: no CTA barrier, no shared-memory sort): lane e holds entry e's key (kNoEntry for an
// empty slot), n is a power of two <= 32. Writes blk[u], mask[u] for the distinct blocks and returns
// their count (in every lane). Must be called by all 32 lanes of the warp.
__device__ __forceinline__ int build_list_in_warp(int32_t key, int n, int32_t* blk, uint64_t* mask) {
  const int lane = threadIdx.x & 31;
  int32_t v = lane < n ? key : kNoEntry;
  // Bitonic network over the first n lanes (lanes >= n only ever exchange among themselves).
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      const int32_t o = __shfl_xor_sync(kFullMask, v, j);
      const bool lower = (lane & j) == 0, ascending = (lane & k) == 0;
      v = (lower == ascending) ? min(v, o) : max(v, o);
    }
  }
  const int32_t b = v >> 6;
  const int32_t prev = __shfl_up_sync(kFullMask, b, 1);
  const bool starts = v != kNoEntry && (lane == 0 || prev != b);
  // Tokens of each run (equal blocks are adjacent): a suffix OR inside the run, read at its start.
  uint64_t m = v != kNoEntry ? 1ull << (v & 63) : 0ull;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t om = __shfl_down_sync(kFullMask, m, o);
    const int32_t ob = __shfl_down_sync(kFullMask, b, o);
    if (lane + o < 32 && ob == b) m |= om;
  }
  const unsigned starts_mask = __ballot_sync(kFullMask, starts);
  if (starts) {
    const int u = __popc(starts_mask & ((1u << lane) - 1u));
    blk[u] = b;
    mask[u] = m;
  }
  return __popc(starts_mask);
}

// From sorted keys[0, n): blk[u] = the u-th distinct block, mask[u] = the tokens that selected it.
// Returns the number of distinct blocks (same value in every thread). Every thread must call it;
// the outputs are visible to all threads only after the caller's next barrier.
template <int THREADS>
__device__ int compact_runs(const int32_t* keys, int n, int32_t* blk, uint64_t* mask, int* scratch) {
  const int per = (n + THREADS - 1) / THREADS;
  const int lo = min(n, static_cast<int>(threadIdx.x) * per), hi = min(n, lo + per);
  const auto starts_run = [&](int i) {
    const int k = keys[i];
    return k != kNoEntry && (i == 0 || (keys[i - 1] >> 6) != (k >> 6));
  };
  int count = 0;
  for (int i = lo; i < hi; ++i) count += starts_run(i) ? 1 : 0;
  int total = 0;
  int u = block_exclusive_scan<THREADS>(count, scratch, &total);
  for (int i = lo; i < hi; ++i) {
    if (!starts_run(i)) continue;
    const int b = keys[i] >> 6;
    uint64_t m = 0;
    for (int j = i; j < n; ++j) {
      const int k = keys[j];
      if (k == kNoEntry || (k >> 6) != b) break;
      m |= 1ull << (k & 63);
    }
    blk[u] = b;
    mask[u] = m;
    ++u;
  }
  return total;
}

}  // namespace msa::detail::cuda::decode
