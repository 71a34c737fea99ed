// The 16-bit copy of the fp8 blocks the query-major tiles read (fp8_copy.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/arch/fp8.cuh"
#include "cuda/arch/pdl.cuh"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/fp8_copy.h"
#include "cuda/prefill_sm90/tile_common.cuh"
#include "cuda/runtime/launch.cuh"

namespace msa::detail::cuda::prefill_sm90 {

namespace {

// A CTA per unit at a time. Without flags (every block widened) a unit is a whole (copy page, KV head), its K or
// its V, or a quarter (64 rows of K or of V), whichever is the smallest that still gives every CTA of the grid a
// unit (Fp8CopyParams::unit_parts): a plan of few blocks (M3-TP4 P-chunk: 256) then still puts several CTAs on
// every SM, all their loads in flight at once, and a plan of many (M3-TP1 P-chunk: 1024) keeps 16 loads a thread
// in flight per round trip. With flags a unit is a whole pair, so that its one flag byte has one reader: a
// flagged plan holds more than kCopyEveryBlockMaxItems pairs, a whole pair per CTA of the grid already on parts
// of up to 128 SMs (kCopyEveryBlockMaxItems / kWidenCtasPerSm). 128 threads:
// thread t moves 8 bytes (8 values) of rows t / 16 + 8 i; 16 lanes read a 128-byte fp8 row and write its 256-byte
// 16-bit row, so each warp store fills whole sectors. The stores are explicit 16-byte ones (__stcg): plain uint4
// assignments compiled to four 4-byte stores here, each filling a quarter of its sectors, and 16-byte loads with
// a lane writing 32 bytes half-filled them (3x the L2 write sectors); either held this kernel at 1.35-1.7 TB/s.
// The grid is kWidenCtasPerSm CTAs a SM, which the launch bounds guarantee fit at once (64 registers): a second
// wave would start only as the first drains, and the query-major kernel's CTAs, waiting for this kernel's end
// (PDL), take the SMs it leaves.
constexpr int kWidenThreads = 128;
constexpr int kWidenCtasPerSm = 8;
constexpr int kChunk = 8;
constexpr int kRowLanes = kHeadDim / kChunk;
constexpr int kRowsPerPass = kWidenThreads / kRowLanes;
constexpr int kItemRows = 2 * kBlockKeys;  // K's rows, then V's
constexpr int kMaxUnitParts = 4;
constexpr int kQuarterRows = kItemRows / kMaxUnitParts;
static_assert(kQuarterRows % kRowsPerPass == 0 && kBlockKeys % kQuarterRows == 0, "a quarter's rows spread evenly");

// Rows [r0 + 8 i] of one pool (K or V) widened into the copy: every load before the first store.
template <typename T, int kPasses>
__device__ __forceinline__ void widen_rows(const uint8_t* src, int64_t stride_token, T* dst, int r0, int valid) {
  uint2 in[kPasses];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int r = r0 + i * kRowsPerPass;  // zeros past kv_len: those keys are masked, and P = 0 meets V = 0 there
    in[i] = r < valid ? *reinterpret_cast<const uint2*>(src + r * stride_token) : make_uint2(0, 0);
  }
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const uint2 a = arch::e4m3x4_to_f16x4_raw(in[i].x), b = arch::e4m3x4_to_f16x4_raw(in[i].y);
    const uint4 out = make_uint4(arch::f16x2_raw_to<T>(a.x), arch::f16x2_raw_to<T>(a.y), arch::f16x2_raw_to<T>(b.x),
                                 arch::f16x2_raw_to<T>(b.y));
    __stcg(reinterpret_cast<uint4*>(dst + (r0 + i * kRowsPerPass) * kHeadDim), out);  // kept in L2 for the kernel next
  }
}

// kRows rows of an item from row r of its K-then-V order (all in K or all in V).
template <typename T, int kRows>
__device__ __forceinline__ void widen_item_rows(const Fp8CopyParams& p, int64_t pool, int32_t h, int64_t item,
                                                int32_t key0, int32_t valid, int r) {
  const bool is_v = r >= kBlockKeys;
  const CacheParams& c = is_v ? p.v : p.k;
  const int lane = threadIdx.x % kRowLanes;
  const uint8_t* src = static_cast<const uint8_t*>(c.data) + pool * c.stride_page + h * c.stride_head +
                       key0 * c.stride_token + kChunk * lane;
  const int64_t plane = static_cast<int64_t>(p.copy_pages) * p.num_kv_heads * kBlockKeys * kHeadDim;  // K's elements
  T* dst = static_cast<T*>(p.copy) + (is_v ? plane : 0) + item * kBlockKeys * kHeadDim + kChunk * lane;
  widen_rows<T, kRows / kRowsPerPass>(src, c.stride_token, dst, r % kBlockKeys + threadIdx.x / kRowLanes, valid);
}

template <typename T>
__global__ void __launch_bounds__(kWidenThreads, kWidenCtasPerSm)
    fp8_copy_widen_kernel(const __grid_constant__ Fp8CopyParams p) {
  // Flagged: the tile lists' flags first. Every block: the lists are not read, so the kernel runs beside them
  // and waits for them only at its end, which makes the query-major kernel's wait (on this grid) cover them.
  // blk_cum, the schedule kernel's, is complete before the lists (this grid's primary) let this grid launch:
  // each lists CTA allows it only after its own wait on the schedule kernel (read from the L2 all the same).
  const bool every_block = p.flags == nullptr;
  if (!every_block) arch::grid_dependency_wait();
  arch::allow_dependent_launch();
  const int32_t hkv = p.num_kv_heads, batch = p.seqs.batch_size;
  if (blockIdx.x == 0)
    for (int32_t b = threadIdx.x; b <= batch; b += kWidenThreads) p.copy_indptr[b] = __ldcg(p.blk_cum + b) / hkv;
  const int32_t parts = p.unit_parts, unit_rows = kItemRows / parts;  // parts = 1 with flags
  const int32_t units = p.copy_pages * hkv * parts;
  for (int32_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int32_t item = unit / parts, part = unit - item * parts;
    uint8_t* flag = every_block ? nullptr : p.flags + static_cast<int64_t>(item) * kCopyFlagBytes;
    if (!every_block && *flag == 0) continue;  // the same flag for every thread: the CTA skips or takes it
    const int32_t page = item / hkv, h = item - page * hkv;
    int lo = 0, hi = batch;  // the request: the last b with blk_cum[b] / Hkv <= page
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (__ldcg(p.blk_cum + mid) / hkv <= page) lo = mid; else hi = mid;
    }
    const int32_t block = page - __ldcg(p.blk_cum + lo) / hkv;
    const SeqView v = load_seq(p.seqs, lo);
    const int32_t pool = block < num_kv_blocks(v.kv_len) ? physical_page(p.pages, lo, block / p.page_blocks) : -1;
    // The unit's flag is cleared as it takes it, once every thread has read it, so that every flag is 0 again
    // after the run.
    __syncthreads();
    if (threadIdx.x == 0) {
      if (!every_block) *flag = 0;
      p.copy_table[page] = pool >= 0 ? page : -1;  // every flagged unit writes the same
    }
    if (pool < 0) continue;
    const int32_t valid = min(kBlockKeys, v.kv_len - block * kBlockKeys);
    const int32_t key0 = (block % p.page_blocks) * kBlockKeys;
    if (unit_rows == kQuarterRows)
      widen_item_rows<T, kQuarterRows>(p, pool, h, item, key0, valid, part * kQuarterRows);
    else  // a pool's 128 rows at a time: 16 loads a thread in flight
      for (int r = part * unit_rows; r < (part + 1) * unit_rows; r += kBlockKeys)
        widen_item_rows<T, kBlockKeys>(p, pool, h, item, key0, valid, r);
  }
  if (every_block) arch::grid_dependency_wait();
}

template <typename T>
void launch_widen(Fp8CopyParams p, int sm_count, cudaStream_t stream) {
  const int32_t items = p.copy_pages * p.num_kv_heads, ctas = kWidenCtasPerSm * std::max(sm_count, 1);
  p.unit_parts = p.flags != nullptr ? 1 : items * kMaxUnitParts <= ctas ? kMaxUnitParts : items * 2 <= ctas ? 2 : 1;
  const dim3 grid(std::max(1, std::min(items * p.unit_parts, ctas)));
  launch_kernel(true, fp8_copy_widen_kernel<T>, grid, dim3(kWidenThreads), 0, stream, p);
}

}  // namespace

void launch_fp8_copy_widen(const Fp8CopyParams& p, bool bf16, int sm_count, cudaStream_t stream) {
  if (bf16)
    launch_widen<__nv_bfloat16>(p, sm_count, stream);
  else
    launch_widen<__half>(p, sm_count, stream);
}

}  // namespace msa::detail::cuda::prefill_sm90
