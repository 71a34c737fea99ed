// HBM read rate of K SMs, the rest idle: how many SMs a memory-bound merge needs beside a compute-bound
// kernel. The KV-major prefill path reads its partial outputs back in a separate merge (~77 us of a 261 us
// M3-TP4 P-chunk `random` call, docs/prefill.md "`random`: the KV-major chain") while the KV-major kernel,
// on every SM, leaves ~2/3 of the DRAM bandwidth unused. A merge on a few SMs, concurrent with a KV-major
// kernel on the others, pays off only if a few SMs can read near the ceiling: this measures it.
//
// One CTA per SM (the dynamic shared memory forbids two), K CTAs, each reading its own contiguous
// 16 MiB slice of a 2 GiB buffer (cold: a 256 MiB memset runs before each timed launch):
//   ldg: 1024 threads, each with U 16-byte loads in flight per step (U = 4, 8, 16)
//   bulk: one thread streams the slice through a ring of S 32 KiB shared-memory stages with
//         cp.async.bulk (the TMA's 1-D copy) and mbarrier completion, re-arming each stage at once
// Printed: mode, K, GB/s in all, GB/s per SM (median of 5 launches).
//
// Build and run (sm_90a): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/micro/sm_read_rate.cu -o /tmp/sm_read_rate && /tmp/sm_read_rate
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#include "check.h"

constexpr size_t kSlice = size_t(16) << 20;    // bytes per CTA
constexpr int kSmemBytes = 200 * 1024;          // one CTA per SM
constexpr int kStageBytes = 32 * 1024;

template <int U>
__global__ void __launch_bounds__(1024, 1) ldg_read(const int4* __restrict__ buf, int* sink) {
  extern __shared__ int smem_unused[];
  const int4* p = buf + blockIdx.x * (kSlice / 16);
  const size_t n = kSlice / 16;
  int acc = 0;
  for (size_t i = threadIdx.x; i < n; i += size_t(1024) * U) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = i + u * 1024 < n ? __ldcs(p + i + u * 1024) : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x7fffffff) sink[0] = acc + smem_unused[0];  // keeps the loads
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int S>
__global__ void __launch_bounds__(32, 1) bulk_read(const char* __restrict__ buf, int* sink) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t full[S];
  if (threadIdx.x != 0) return;
  const char* src = buf + blockIdx.x * kSlice;
  for (int s = 0; s < S; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(&full[s])));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  const int chunks = static_cast<int>(kSlice / kStageBytes);
  auto issue = [&](int c) {
    const int s = c % S;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(&full[s])),
                 "r"(kStageBytes) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_addr(smem + s * kStageBytes)),
        "l"(src + size_t(c) * kStageBytes), "r"(kStageBytes), "r"(smem_addr(&full[s]))
        : "memory");
  };
  for (int c = 0; c < S && c < chunks; ++c) issue(c);
  int acc = 0;
  for (int c = 0; c < chunks; ++c) {
    const int s = c % S;
    const uint32_t parity = (c / S) & 1;
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
          : "=r"(done)
          : "r"(smem_addr(&full[s])), "r"(parity)
          : "memory");
    }
    acc ^= reinterpret_cast<const int*>(smem + s * kStageBytes)[c & 255];
    if (c + S < chunks) issue(c + S);
  }
  if (acc == 0x7fffffff) sink[0] = acc;
}

template <typename F>
float time_median(F launch, char* flush, size_t flush_bytes) {
  std::vector<float> t;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < 6; ++r) {
    CK(cudaMemsetAsync(flush, r, flush_bytes));
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) t.push_back(ms);  // the first launch warms the code
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t bytes = kSlice * sms, flush_bytes = size_t(256) << 20;
  char *buf = nullptr, *flush = nullptr;
  int* sink = nullptr;
  CK(cudaMalloc(&buf, bytes));
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(buf, 1, bytes));
  CK(cudaFuncSetAttribute(ldg_read<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CK(cudaFuncSetAttribute(ldg_read<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CK(cudaFuncSetAttribute(ldg_read<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CK(cudaFuncSetAttribute(bulk_read<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * kStageBytes + 1024));
  CK(cudaFuncSetAttribute(bulk_read<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * kStageBytes + 1024));
  std::printf("# %d SMs, %zu MiB per CTA, one CTA per SM, L2 evicted before each launch\n", sms, kSlice >> 20);
  std::printf("%-8s %5s %10s %12s\n", "mode", "SMs", "GB/s", "GB/s per SM");
  const int counts[] = {4, 8, 16, 24, 32, 66, 132};
  for (int k : counts) {
    if (k > sms) continue;
    struct Mode {
      const char* name;
      void (*run)(int, const char*, int*);
    };
    const Mode modes[] = {
        {"ldg-u4", [](int k, const char* b, int* s) {
           ldg_read<4><<<k, 1024, kSmemBytes>>>(reinterpret_cast<const int4*>(b), s);
         }},
        {"ldg-u8", [](int k, const char* b, int* s) {
           ldg_read<8><<<k, 1024, kSmemBytes>>>(reinterpret_cast<const int4*>(b), s);
         }},
        {"ldg-u16", [](int k, const char* b, int* s) {
           ldg_read<16><<<k, 1024, kSmemBytes>>>(reinterpret_cast<const int4*>(b), s);
         }},
        {"bulk-s4", [](int k, const char* b, int* s) { bulk_read<4><<<k, 32, 4 * kStageBytes + 1024>>>(b, s); }},
        {"bulk-s6", [](int k, const char* b, int* s) { bulk_read<6><<<k, 32, 6 * kStageBytes + 1024>>>(b, s); }},
    };
    for (const Mode& m : modes) {
      const float ms = time_median([&] { m.run(k, buf, sink); }, flush, flush_bytes);
      CK(cudaGetLastError());
      const double gbps = double(kSlice) * k / (ms * 1e-3) / 1e9;
      std::printf("%-8s %5d %10.0f %12.1f\n", m.name, k, gbps, gbps / k);
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
