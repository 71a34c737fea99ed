// Loads and stores the compiler would not emit as wanted from C++: shared memory addressed by 32-bit
// shared-window addresses, volatile shared-memory words, and 16-byte global loads with cache hints
// (every architecture the library builds for, sm_80+).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace msa::detail::cuda::arch {

// The 32-bit shared-window address of a pointer into shared memory. The kernels keep shared operands
// in this form: half the registers of generic pointers, and base + immediate addressing in unrolled
// loops.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
// 16 zero bytes at a shared-memory address.
__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
}

// A shared store the compiler cannot drop or move (volatile): a trace mark's dependency sink.
__device__ __forceinline__ void st_volatile_shared(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.shared.u32 [%0], %1;" ::"r"(smem_addr(p)), "r"(v) : "memory");
}
// A shared-memory count one warp publishes and others poll, through atomics: a poll is then no data race
// (compute-sanitizer's racecheck reports volatile flag accesses as hazards). Both compile to ATOMS.
__device__ __forceinline__ void publish_shared_count(int64_t* p, int64_t v) {
  atomicExch(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}
__device__ __forceinline__ int64_t poll_shared_count(int64_t* p) {
  return static_cast<int64_t>(atomicAdd(reinterpret_cast<unsigned long long*>(p), 0ull));
}

// 16 bytes through the read-only (non-coherent) path: data no kernel writes while this one runs.
__device__ __forceinline__ uint4 ld_global_nc_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// The same for data read once: kept out of L1, and the L2 asked to fetch 256 B per miss (a whole bf16
// row of 128 elements). volatile, as above: callers guard these loads with a pointer check, which the
// compiler must not hoist them above.
__device__ __forceinline__ uint4 ld_global_stream_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace msa::detail::cuda::arch
