// Special registers read by the trace probes. volatile: every read happens where it is written (a
// clock read the compiler merged or moved would time nothing).
#pragma once

#include <cstdint>

namespace msa::detail::cuda::arch {

// Nanoseconds of the global timer (one clock for every SM of the device).
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// The SM this thread runs on.
__device__ __forceinline__ unsigned sm_id() {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}

}  // namespace msa::detail::cuda::arch
