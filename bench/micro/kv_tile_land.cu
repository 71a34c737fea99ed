// When does a decode CTA's first K/V block land: cp.async (16-byte pieces, what the single-token decode
// kernel issues, src/cuda/decode/token_kernel.cuh) against one bulk copy (the TMA's 1-D cp.async.bulk) per
// 256-byte K or V row. At M3-TP1 D-B1 each of 64 CTAs loads one 128-key block of one KV head (two 64-key
// tiles, K and V: 64 KiB) after its list is built, and the token trace puts tile 0 ~2700 cycles and tile 1
// ~1000 more after the list (docs/decode.md, "Where the time goes"): 32 KiB per ~1000 cycles, the ~65 GB/s per SM
// at which thread loads stop (bench/micro/sm_read_rate.cu), where bulk copies
// reached 136-174 GB/s per SM on few SMs. This measures the landing times themselves, cold.
//
// Each CTA (128 threads) reads its own block of a K pool and a V pool laid out [slot][4 heads][128] bf16
// (sglang's slot-major pool at M3-TP1: rows of one head 1 KiB apart), cold (a 256 MiB memset before each
// launch), and records clock64 at the start, when tile 0 has landed and when tile 1 has:
//   cp.async : per tile each thread 4 rows x 2 chunks x (K, V) of 16 bytes into rows swizzled by 16-byte
//              chunk (the kernel's layout), one commit group per tile
//   bulk-row : per tile thread t copies row t % 64 of K (t < 64) or V with one 256-byte cp.async.bulk into
//              rows padded to 272 bytes (conflict-free ldmatrix without a swizzle), one mbarrier per tile
//   tma-box  : per tile thread 0 issues 4 TMA boxes of {64 dims, 64 keys} (K and V, two halves of the head
//              dim) from a 3-D tensor map of the pool, 128-byte swizzle, one mbarrier per tile
// Printed per mode and CTA count: tile 0 and tile 1 landing (median / max over CTAs, cycles after the
// start) and the launch's time (median of 10).
//
// Build and run (sm_90a): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/micro/kv_tile_land.cu -lcuda -o /tmp/kv_tile_land && /tmp/kv_tile_land
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda.h>

#include "check.h"

constexpr int kThreads = 128;
constexpr int kTileKeys = 64;
constexpr int kRowBytes = 256;       // 128 bf16
constexpr int kPadRowBytes = 272;    // bulk-row layout
constexpr int kHeads = 4;            // rows of one head are kHeads * 256 bytes apart
constexpr int kBlocks = 1024;        // 128-key blocks per pool: 128 MiB each for K and V
constexpr size_t kPoolBytes = size_t(kBlocks) * 128 * kHeads * kRowBytes;
constexpr int kSmemBytes = 2 * 2 * kTileKeys * kPadRowBytes + 64;
constexpr int kTmaSmemBytes = 2 * 2 * kTileKeys * kRowBytes + 1024 + 64;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// This CTA's block (distinct per CTA) and head: element rows start at the returned byte offset.
__device__ __forceinline__ size_t block_offset() {
  const size_t block = (size_t(blockIdx.x) * 37) % kBlocks, head = blockIdx.x % kHeads;
  return block * 128 * kHeads * kRowBytes + head * kRowBytes;
}

__device__ __forceinline__ void record(long long* out, long long t0, long long t1, long long t2) {
  if (threadIdx.x == 0) {
    out[3 * blockIdx.x] = t1 - t0;
    out[3 * blockIdx.x + 1] = t2 - t0;
    out[3 * blockIdx.x + 2] = t2;
  }
}

__global__ void __launch_bounds__(kThreads, 2) land_cp_async(const char* kpool, const char* vpool, long long* out,
                                                             int* sink) {
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x, r0 = tid >> 3, t8 = tid & 7;
  const size_t base = block_offset();
  __syncthreads();
  const long long t0 = clock64();
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const uint32_t ks = smem_addr(smem) + x * 2 * kTileKeys * kRowBytes, vs = ks + kTileKeys * kRowBytes;
#pragma unroll
    for (int i = 0; i < kTileKeys / 16; ++i) {
      const int r = r0 + 16 * i, key = x * kTileKeys + r;
      const char* kr = kpool + base + size_t(key) * kHeads * kRowBytes + t8 * 16;
      const char* vr = vpool + base + size_t(key) * kHeads * kRowBytes + t8 * 16;
      const uint32_t dst = r * kRowBytes + ((t8 ^ (r & 7)) << 4);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(ks + dst + c * 128), "l"(kr + c * 128));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(vs + dst + c * 128), "l"(vr + c * 128));
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  }
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  __syncthreads();
  const long long t1 = clock64();
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  const long long t2 = clock64();
  record(out, t0, t1, t2);
  if (reinterpret_cast<const int*>(smem)[tid] == 0x7fffffff) sink[0] = 1;
}

__device__ __forceinline__ void wait_parity0(uint64_t* bar) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar))
                 : "memory");
  }
}

// Thread 0 initializes the two tiles' mbarriers; after the CTA's barrier, the start clock, and thread 0 arms both
// for their K and V bytes.
__device__ __forceinline__ long long start_tiles(uint64_t* full) {
  if (threadIdx.x == 0) {
    for (int x = 0; x < 2; ++x) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(&full[x])));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const long long t0 = clock64();
  if (threadIdx.x == 0) {
    for (int x = 0; x < 2; ++x)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(&full[x])),
                   "r"(2 * kTileKeys * kRowBytes)
                   : "memory");
  }
  return t0;
}

// The landing times of tiles 0 and 1 (their mbarriers' first phase), recorded by thread 0.
__device__ __forceinline__ void wait_and_record(uint64_t* full, long long* out, long long t0, const char* tiles,
                                                int* sink) {
  wait_parity0(&full[0]);
  const long long t1 = clock64();
  wait_parity0(&full[1]);
  const long long t2 = clock64();
  record(out, t0, t1, t2);
  if (reinterpret_cast<const int*>(tiles)[threadIdx.x] == 0x7fffffff) sink[0] = 1;
}

__global__ void __launch_bounds__(kThreads, 2) land_bulk_row(const char* kpool, const char* vpool, long long* out,
                                                             int* sink) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + 2 * 2 * kTileKeys * kPadRowBytes);
  const int tid = threadIdx.x, row = tid & 63, is_v = tid >> 6;
  const size_t base = block_offset();
  const long long t0 = start_tiles(full);
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int key = x * kTileKeys + row;
    const char* src = (is_v ? vpool : kpool) + base + size_t(key) * kHeads * kRowBytes;
    const uint32_t dst = smem_addr(smem) + (x * 2 + is_v) * kTileKeys * kPadRowBytes + row * kPadRowBytes;
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
        "l"(src), "r"(kRowBytes), "r"(smem_addr(&full[x]))
        : "memory");
  }
  wait_and_record(full, out, t0, smem, sink);
}

// One 2-D TMA box per K or V half-tile: {64 dims (128 bytes, swizzled 128B), 64 keys} of the [slot][head][128]
// pool, 4 boxes per tile issued by thread 0 (the layout FA3's and the prefill kernels' ldmatrix reads).
__global__ void __launch_bounds__(kThreads, 2) land_tma_box(const __grid_constant__ CUtensorMap kmap,
                                                            const __grid_constant__ CUtensorMap vmap, long long* out,
                                                            int* sink) {
  extern __shared__ __align__(128) char smem[];  // aligned to 1024 below (the 128-byte swizzle)
  char* tiles = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles + 2 * 2 * kTileKeys * kRowBytes);
  const int tid = threadIdx.x;
  const int block = (blockIdx.x * 37) % kBlocks, head = blockIdx.x % kHeads;
  const long long t0 = start_tiles(full);
  if (tid == 0) {
    for (int x = 0; x < 2; ++x) {
      for (int kv = 0; kv < 2; ++kv)
        for (int half = 0; half < 2; ++half) {
          const uint32_t dst = smem_addr(tiles) + ((x * 2 + kv) * 2 + half) * kTileKeys * 128;
          const int c0 = half * 64, c1 = head, c2 = block * 128 + x * kTileKeys;
          asm volatile(
              "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
                  dst),
              "l"(reinterpret_cast<uint64_t>(kv ? &vmap : &kmap)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(&full[x]))
              : "memory");
        }
    }
  }
  wait_and_record(full, out, t0, tiles, sink);
}

// [slots][kHeads][128] bf16 as a 3-D map, box {64, 1, 64}, 128-byte swizzle.
CUtensorMap pool_map(const char* pool) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {128, kHeads, cuuint64_t(kBlocks) * 128};
  const cuuint64_t strides[2] = {kRowBytes, cuuint64_t(kHeads) * kRowBytes};
  const cuuint32_t box[3] = {64, 1, kTileKeys}, elem[3] = {1, 1, 1};
  const CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<char*>(pool), dims,
                                            strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", int(r));
    std::exit(1);
  }
  return m;
}

int main() {
  const size_t flush_bytes = size_t(256) << 20;
  char *kpool = nullptr, *vpool = nullptr, *flush = nullptr;
  long long* out = nullptr;
  int* sink = nullptr;
  CK(cudaMalloc(&kpool, kPoolBytes));
  CK(cudaMalloc(&vpool, kPoolBytes));
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMalloc(&out, 3 * 1024 * sizeof(long long)));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(kpool, 1, kPoolBytes));
  CK(cudaMemset(vpool, 1, kPoolBytes));
  CK(cudaFuncSetAttribute(land_cp_async, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CK(cudaFuncSetAttribute(land_bulk_row, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CK(cudaFuncSetAttribute(land_tma_box, cudaFuncAttributeMaxDynamicSharedMemorySize, kTmaSmemBytes));
  const CUtensorMap kmap = pool_map(kpool), vmap = pool_map(vpool);
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::printf("# one 128-key block (K and V: 64 KiB) per CTA, 128 threads, cold; cycles after the CTA's start\n");
  std::printf("%-9s %5s %14s %14s %14s %10s\n", "mode", "CTAs", "tile0 med/max", "tile1 med/max", "spread", "launch us");
  for (int ctas : {16, 64, 128}) {
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<long long> t0s, t1s, ends;
      std::vector<float> us;
      for (int rep = 0; rep < 11; ++rep) {
        CK(cudaMemsetAsync(flush, rep, flush_bytes));
        CK(cudaEventRecord(a));
        if (mode == 0)
          land_cp_async<<<ctas, kThreads, kSmemBytes>>>(kpool, vpool, out, sink);
        else if (mode == 1)
          land_bulk_row<<<ctas, kThreads, kSmemBytes>>>(kpool, vpool, out, sink);
        else
          land_tma_box<<<ctas, kThreads, kTmaSmemBytes>>>(kmap, vmap, out, sink);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaGetLastError());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (rep == 0) continue;  // the first launch warms the code
        us.push_back(ms * 1e3f);
        std::vector<long long> h(3 * ctas);
        CK(cudaMemcpy(h.data(), out, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        for (int c = 0; c < ctas; ++c) {
          t0s.push_back(h[3 * c]);
          t1s.push_back(h[3 * c + 1]);
        }
      }
      const auto med = [](std::vector<long long> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const auto mx = [](const std::vector<long long>& v) { return *std::max_element(v.begin(), v.end()); };
      std::sort(us.begin(), us.end());
      char c0[32], c1[32], sp[32];
      std::snprintf(c0, sizeof c0, "%lld/%lld", med(t0s), mx(t0s));
      std::snprintf(c1, sizeof c1, "%lld/%lld", med(t1s), mx(t1s));
      std::snprintf(sp, sizeof sp, "%lld", mx(t1s) - med(t1s));
      std::printf("%-9s %5d %14s %14s %14s %10.2f\n", mode == 0 ? "cp.async" : mode == 1 ? "bulk-row" : "tma-box", ctas, c0, c1, sp,
                  us[us.size() / 2]);
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
