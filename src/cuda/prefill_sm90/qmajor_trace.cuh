// Phase timestamps of the query-major prefill kernel, to see where its time beyond the block-steps goes (the
// ~8 us a kernel that docs/prefill.md's fit of M3-TP4 `shared` rows leaves over 1.77 us per block-step). Compiled
// in only with -DMSA_QMAJOR_TRACE, in a build of its own (the clock reads and printf change the kernel), e.g. on
// the device:
//   cmake -S . -B build-trace -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a-real \
//         -DCMAKE_CUDA_FLAGS=-DMSA_QMAJOR_TRACE && cmake --build build-trace
//   PYTHONPATH=build-trace/python python3 bench/prefill.py --quick --shape M3-TP4 --workload P-chunk \
//         --patterns shared --no-peers
// Thread 0 of consumer warpgroup 0 of every CTA records, for launch kTraceLaunch of the process (launches counted
// by the CTAs that finish), its SM, its start on the global timer (ns) and each mark's global-timer offset from
// that start (ns): 1 past the PDL wait, 2 the first tile's record and Q (q_full), 3 its first K (k_full), then per
// tile t < kTiles: 4 + 2t its first QK^T issued, 5 + 2t its o written (epilogue done); last: the loop left. A
// kernel launched after each query-major launch prints the rows once they are complete: a printf inside the
// query-major kernel would be a function call there, across which ptxas serializes every wgmma.
#pragma once

#ifdef MSA_QMAJOR_TRACE
#include <cstdint>
#include <cstdio>

#include "cuda/arch/special_registers.cuh"

namespace msa::detail::cuda::prefill_sm90 {

struct QMajorTrace {
  static constexpr int kTiles = 6;
  static constexpr int kMarks = 4 + 2 * kTiles + 1;
  static constexpr unsigned kTraceLaunch = 12;
  static constexpr int kMaxCtas = 1024;
  uint64_t t[kMarks];
  int tiles;
  __device__ __forceinline__ static uint64_t now() { return arch::globaltimer_ns(); }
  __device__ __forceinline__ void begin() {
#pragma unroll
    for (int i = 0; i < kMarks; ++i) t[i] = 0;
    tiles = 0;
    t[0] = now();
  }
  __device__ __forceinline__ void mark(int i) {
#pragma unroll
    for (int j = 0; j < kMarks; ++j)  // a constant index per store: t stays in registers
      if (j == i) t[j] = now();
  }
  __device__ __forceinline__ void issued(uint32_t tile) { mark(4 + 2 * static_cast<int>(tile)); }  // tile: q_it
  __device__ __forceinline__ void done(uint32_t tile) {
    mark(5 + 2 * static_cast<int>(tile));
    tiles = static_cast<int>(tile) + 1;
  }
  __device__ __forceinline__ void end();
};

struct QMajorTraceRow {
  uint64_t t[QMajorTrace::kMarks];
  unsigned sm;
  int tiles;
};
static __device__ unsigned g_qmajor_trace_ctas = 0;  // CTAs that finished, all launches
static __device__ unsigned g_qmajor_trace_printed = 0;
static __device__ QMajorTraceRow g_qmajor_trace_rows[QMajorTrace::kMaxCtas];

__device__ __forceinline__ void QMajorTrace::end() {
  t[kMarks - 1] = now();
  const unsigned n = atomicAdd(&g_qmajor_trace_ctas, 1u) / gridDim.x;
  if (n != kTraceLaunch || blockIdx.x >= kMaxCtas) return;
  QMajorTraceRow& r = g_qmajor_trace_rows[blockIdx.x];
#pragma unroll
  for (int i = 0; i < kMarks; ++i) r.t[i] = t[i];
  r.sm = arch::sm_id();
  r.tiles = tiles;
}

// One thread, after a query-major launch: prints launch kTraceLaunch's rows once all of its CTAs finished.
static __global__ void qmajor_trace_print_kernel(unsigned grid) {
  const unsigned done = atomicAdd(&g_qmajor_trace_ctas, 0u);
  if (done < (QMajorTrace::kTraceLaunch + 1) * grid || atomicExch(&g_qmajor_trace_printed, 1u) != 0) return;
  for (unsigned c = 0; c < grid && c < QMajorTrace::kMaxCtas; ++c) {
    const QMajorTraceRow& r = g_qmajor_trace_rows[c];
    long long d[QMajorTrace::kMarks];
    for (int i = 1; i < QMajorTrace::kMarks; ++i) d[i] = r.t[i] == 0 ? -1LL : static_cast<long long>(r.t[i] - r.t[0]);
    printf("qtrace cta %3u sm %3u tiles %d start_ns %llu | %lld %lld %lld | %lld %lld | %lld %lld | %lld %lld | %lld "
           "%lld | %lld %lld | %lld %lld | %lld\n",
           c, r.sm, r.tiles, static_cast<unsigned long long>(r.t[0]), d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8],
           d[9], d[10], d[11], d[12], d[13], d[14], d[15], d[16]);
  }
}

}  // namespace msa::detail::cuda::prefill_sm90

#define MSA_QTRACE_DECL ::msa::detail::cuda::prefill_sm90::QMajorTrace qtrace_
#define MSA_QTRACE_PARAM , ::msa::detail::cuda::prefill_sm90::QMajorTrace& qtrace_
#define MSA_QTRACE_ARG , qtrace_
#define MSA_QTRACE(stmt)                  \
  do {                                    \
    if (threadIdx.x == 128) qtrace_.stmt; \
  } while (0)
#else
#define MSA_QTRACE_DECL
#define MSA_QTRACE_PARAM
#define MSA_QTRACE_ARG
#define MSA_QTRACE(stmt) \
  do {                   \
  } while (0)
#endif
