// Phase timestamps of the single-token decode kernel, to see where a D-B1 call's time goes. Compiled
// in only with -DMSA_TOKEN_TRACE, in a build of its own (the clock reads and printf change the
// kernel), e.g. on the device:
//   cmake -S . -B build-trace -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a-real \
//         -DCMAKE_CUDA_FLAGS=-DMSA_TOKEN_TRACE && cmake --build build-trace
//   PYTHONPATH=build-trace/python python3 bench/decode.py --only D-B1 --iters 3
// Thread 0 of every split CTA of (CTA x 0, KV head 0) and of (the last CTA x, KV head 0) prints (request 0
// and the last request at one token per request), for launches kTraceFirst.. of the process, its SM, its
// start on the global timer and each mark's clock64 offset from its first mark. A mark first stores its
// `dep` value to shared memory (a volatile store), so it is taken only after that value has arrived:
// marks after a load wait for the load. Marks (token_kernel.cuh): 1 first round trip, 2 pages, 3 tile
// list, 4..11 tiles 0..7 landed (a CTA that streams several blocks: their pace), 12 tile loop done, 13 rows
// sent (push) / staged (pull), 14 own rows arrived (push), 15 merged rows written (issued), 16 the same
// push merge code run again (warm).
#pragma once

#ifdef MSA_TOKEN_TRACE
#include <cstdint>
#include <cstdio>

#include "cuda/arch/memory.cuh"
#include "cuda/arch/special_registers.cuh"

namespace msa::detail::cuda::decode {

static __device__ unsigned g_token_trace_ctas = 0;  // traced CTAs that finished, all launches

struct TokenTrace {
  static constexpr int kMarks = 17;
  static constexpr unsigned kTraceFirst = 30, kTraceLaunches = 3;
  long long t[kMarks];
  uint64_t start_ns;
  __device__ void mark(int i, uint32_t dep) {
    __shared__ uint32_t sink;  // a shared store: it waits for dep, and for nothing in the memory system
    arch::st_volatile_shared(&sink, dep);
    t[i] = clock64();
  }
  __device__ void begin() {
    for (int i = 0; i < kMarks; ++i) t[i] = -1;
    start_ns = arch::globaltimer_ns();
    t[0] = clock64();
  }
  __device__ void end(int S) {
    const bool last = blockIdx.x == gridDim.x - 1 && gridDim.x > 1;
    if (threadIdx.x != 0 || (blockIdx.x != 0 && !last) || blockIdx.y != 0) return;
    const unsigned traced = gridDim.x > 1 ? 2u : 1u;  // CTAs of one launch that print
    const unsigned n = atomicAdd(&g_token_trace_ctas, 1u) / (traced * static_cast<unsigned>(S));
    if (n < kTraceFirst || n >= kTraceFirst + kTraceLaunches) return;
    const unsigned sm = arch::sm_id();
    long long d[kMarks];
    for (int i = 1; i < kMarks; ++i) d[i] = t[i] < 0 ? -1LL : t[i] - t[0];
    static_assert(kMarks == 17, "one printf: the lines of different CTAs do not interleave");
    printf("trace launch %u req %5u split %2u/%d sm %3u start_ns %llu | %lld %lld %lld | %lld %lld %lld %lld %lld %lld %lld %lld "
           "| %lld | %lld %lld %lld %lld\n",
           n, blockIdx.x, blockIdx.z, S, sm, static_cast<unsigned long long>(start_ns), d[1], d[2], d[3], d[4], d[5],
           d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15], d[16]);
  }
};

}  // namespace msa::detail::cuda::decode

#define MSA_TRACE_DECL ::msa::detail::cuda::decode::TokenTrace trace_; if (threadIdx.x == 0) trace_.begin()
#define MSA_TRACE_MARK(i, dep) \
  if (threadIdx.x == 0) trace_.mark(i, static_cast<uint32_t>(dep))
#define MSA_TRACE_END(S) trace_.end(S)
#else
#define MSA_TRACE_DECL
#define MSA_TRACE_MARK(i, dep)
#define MSA_TRACE_END(S)
#endif
