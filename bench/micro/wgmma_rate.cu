// wgmma issue rate by shape: does a narrow N (one token's 16 heads) keep the tensor pipe as busy as the
// m64n128 products the prefill kernels issue? This decides whether a per-token ("transposed",
// S^T = K Q^T with N = 16 heads of one token) sparse-prefill kernel could reach the `clustered` bar:
// query-major tiles there compute ~26 blocks for 16 useful (docs/prefill.md), so a per-token kernel must
// run its narrow products at >= ~86% of the wide ones' rate to gain.
//
// Each CTA (one per SM, kWarpgroups warpgroups) issues, per iteration and warpgroup, 8 k-steps x T
// products of m64nNk16 into T accumulators of N columns (T * N = 128: the same accumulator registers
// and FLOPs per iteration for every shape), commits and waits. A is in shared memory (ss) or registers
// (rs); operands are 128B-swizzled K-major tiles (the layout TMA writes), filled with small values.
// Printed: shape, order, FMA per cycle per SM (clock64 over the loop, clock-independent) and TFLOP/s.
//
// Build and run (sm_90a): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/micro/wgmma_rate.cu -o /tmp/wgmma_rate && /tmp/wgmma_rate [json]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "check.h"

#ifndef WGMMA_RATE_WARPGROUPS
#define WGMMA_RATE_WARPGROUPS 2  // -DWGMMA_RATE_WARPGROUPS=3 or 4: more warpgroups issuing per SM
#endif
constexpr int kWarpgroups = WGMMA_RATE_WARPGROUPS;
constexpr int kSmemBytes = 200 * 1024;  // one CTA per SM

__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void mma_ss_n16(float (&d)[8], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(da), "l"(db));
}
__device__ __forceinline__ void mma_rs_n16(float (&d)[8], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

__device__ __forceinline__ void mma_ss_n32(float (&d)[16], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 1, 1, 1, 0, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(da), "l"(db));
}
__device__ __forceinline__ void mma_rs_n32(float (&d)[16], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

__device__ __forceinline__ void mma_ss_n64(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(da), "l"(db));
}
__device__ __forceinline__ void mma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

__device__ __forceinline__ void mma_ss_n128(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(da), "l"(db));
}
__device__ __forceinline__ void mma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

template <int N>
__device__ __forceinline__ void mma(bool rs, float (&d)[N / 2], uint64_t da, const uint32_t (&a)[4], uint64_t db) {
  if constexpr (N == 16) { if (rs) mma_rs_n16(d, a, db); else mma_ss_n16(d, da, db); }
  if constexpr (N == 32) { if (rs) mma_rs_n32(d, a, db); else mma_ss_n32(d, da, db); }
  if constexpr (N == 64) { if (rs) mma_rs_n64(d, a, db); else mma_ss_n64(d, da, db); }
  if constexpr (N == 128) { if (rs) mma_rs_n128(d, a, db); else mma_ss_n128(d, da, db); }
}

// kTokenOuter: all 8 k-steps of accumulator t back to back (one token's S^T), else k-step outer.
template <int N, bool kRs, bool kTokenOuter>
__global__ void __launch_bounds__(kWarpgroups * 128, 1) rate_kernel(int iters, float* sink, long long* cycles) {
  constexpr int T = 128 / N;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  for (int i = threadIdx.x; i < 96 * 1024 / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ ((i * 2654435761u) & 0x00ff00ffu);  // bf16 ~1
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t a_base = base + (wg % 2) * 16384;           // A: 64 rows x 128 dims, [half][row][128 B]
  const uint32_t b_base = base + 32768 + (wg % 2) * 32768;   // B: 128 rows (T tokens x N) x 128 dims
  uint32_t a[8][4];
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[k][j] = 0x3c003c00u ^ (threadIdx.x * 31 + k * 7 + j);
  float acc[T][N / 2];
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[t][i] = 0.f;
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(acc[t][i])::"memory");
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[k][j])::"memory");
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if constexpr (kTokenOuter) {
#pragma unroll
      for (int t = 0; t < T; ++t)
#pragma unroll
        for (int k = 0; k < 8; ++k)
          mma<N>(kRs, acc[t], desc(a_base + (k / 4) * 8192 + (k % 4) * 32), a[k],
                 desc(b_base + (k / 4) * 16384 + t * N * 128 + (k % 4) * 32));
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int t = 0; t < T; ++t)
          mma<N>(kRs, acc[t], desc(a_base + (k / 4) * 8192 + (k % 4) * 32), a[k],
                 desc(b_base + (k / 4) * 16384 + t * N * 128 + (k % 4) * 32));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(acc[t][i])::"memory");
  }
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s += acc[t][i];
  if (s == 12345.f) sink[threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int N, bool kRs, bool kTokenOuter>
void run(int sms, float* sink, long long* cycles, FILE* json, bool& first) {
  auto k = rate_kernel<N, kRs, kTokenOuter>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const int iters = 20000;
  k<<<sms, kWarpgroups * 128, kSmemBytes>>>(200, sink, cycles);  // warm-up
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  k<<<sms, kWarpgroups * 128, kSmemBytes>>>(iters, sink, cycles);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  CK(cudaGetLastError());
  float ms = 0.f;
  CK(cudaEventElapsedTime(&ms, a, b));
  long long* h = new long long[sms];
  CK(cudaMemcpy(h, cycles, sizeof(long long) * sms, cudaMemcpyDeviceToHost));
  long long cmax = 0;
  for (int i = 0; i < sms; ++i) cmax = h[i] > cmax ? h[i] : cmax;
  delete[] h;
  const double fma_per_sm = double(iters) * kWarpgroups * 8 * 64.0 * 128 * 16;  // T * N = 128
  const double fma_clk = fma_per_sm / double(cmax);
  const double tflops = 2.0 * fma_per_sm * sms / (ms * 1e-3) / 1e12;
  const char* op = kRs ? "rs" : "ss";
  const char* order = kTokenOuter ? "token-outer" : "kstep-outer";
  std::printf("| m64n%-3dk16 %s | %-2d | %-11s | %7.0f | %6.1f | %6.1f |\n", N, op, 128 / N, order, fma_clk, tflops,
              1e-3 * cmax / (ms * 1e-3) * 1e-6);
  if (json) {
    std::fprintf(json, "%s{\"n\": %d, \"a\": \"%s\", \"tokens\": %d, \"order\": \"%s\", \"fma_per_clk_sm\": %.1f, \"tflops\": %.2f, \"ms\": %.4f, \"cycles\": %lld}",
                 first ? "" : ",\n  ", N, op, 128 / N, order, fma_clk, tflops, ms, cmax);
    first = false;
  }
}

int main(int argc, char** argv) {
  int dev = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  float* sink;
  long long* cycles;
  CK(cudaMalloc(&sink, 4096));
  CK(cudaMalloc(&cycles, sizeof(long long) * sms));
  FILE* json = argc > 1 ? std::fopen(argv[1], "w") : nullptr;
  if (json) std::fprintf(json, "{\"sms\": %d, \"warpgroups\": %d, \"rows\": [\n  ", sms, kWarpgroups);
  bool first = true;
  std::printf("%d SMs, %d warpgroups per CTA, T x N = 128 columns per k-step\n", sms, kWarpgroups);
  std::printf("| shape | T | order | FMA/clk/SM | TFLOP/s | GHz |\n|---|---|---|---|---|---|\n");
  run<128, false, true>(sms, sink, cycles, json, first);
  run<128, true, true>(sms, sink, cycles, json, first);
  run<64, true, true>(sms, sink, cycles, json, first);
  run<32, true, true>(sms, sink, cycles, json, first);
  run<16, true, true>(sms, sink, cycles, json, first);
  run<16, true, false>(sms, sink, cycles, json, first);
  run<64, false, true>(sms, sink, cycles, json, first);
  run<32, false, true>(sms, sink, cycles, json, first);
  run<16, false, true>(sms, sink, cycles, json, first);
  if (json) { std::fprintf(json, "\n]}\n"); std::fclose(json); }
  return 0;
}
