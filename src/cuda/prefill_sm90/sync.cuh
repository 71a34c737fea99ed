// Synchronization and copy primitives of the Hopper kernels, over CCCL's cuda::ptx wrappers
// (mbarrier, cp.async.bulk.tensor, proxy fences). Inline PTX only where CCCL has no wrapper:
// setmaxnreg and named barriers.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cuda/ptx>

namespace msa::detail::cuda::prefill_sm90 {

namespace ptx = ::cuda::ptx;

__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t arrivals) { ptx::mbarrier_init(bar, arrivals); }

// Makes initialized mbarriers visible to the async proxy (TMA completes transactions on them).
__device__ __forceinline__ void barrier_init_fence() { ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster); }

__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

__device__ __forceinline__ void barrier_arrive(uint64_t* bar) { (void)ptx::mbarrier_arrive(bar); }

// One arrival that also announces `bytes` of TMA transactions for the current phase.
__device__ __forceinline__ void barrier_arrive_expect(uint64_t* bar, uint32_t bytes) {
  (void)ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
}

// TMA tile loads into this CTA's shared memory, completing `bytes` on bar. Coordinates are in
// elements, innermost first; a box reaching outside the tensor is filled with zeros.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                            uint64_t* bar) {
  const int32_t coords[3] = {c0, c1, c2};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, bar);
}
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                            int32_t c3, uint64_t* bar) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, bar);
}

// TMA tile store from this CTA's shared memory into a 2-D map, in the issuing thread's bulk group.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int32_t c0, int32_t c1, const void* src) {
  const int32_t coords[2] = {c0, c1};
  ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, map, coords, src);
}
__device__ __forceinline__ void bulk_commit() { ptx::cp_async_bulk_commit_group(); }
// This thread's committed bulk stores have read their shared-memory source (it may be rewritten).
__device__ __forceinline__ void bulk_wait_read() { ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{}); }
// This thread's committed bulk stores are complete.
__device__ __forceinline__ void bulk_wait_all() { ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{}); }

__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// The Q, K and V descriptors of a kernel's params (both prefill kernels load through these three).
template <class Params>
__device__ __forceinline__ void tma_prefetch_qkv_maps(const Params& p) {
  tma_prefetch_descriptor(&p.q_map);
  tma_prefetch_descriptor(&p.k_map);
  tma_prefetch_descriptor(&p.v_map);
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses
// (wgmma operand reads, TMA writes into the same buffer).
__device__ __forceinline__ void fence_generic_to_async() { ptx::fence_proxy_async(ptx::space_shared); }

// Named barriers over `threads` threads (a multiple of 32); id 0 is __syncthreads. sync waits for
// the barrier to complete, arrive only counts this warp in.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register budget per thread of the executing warpgroup (all of its 128 threads execute it).
template <uint32_t kRegs>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 2^x on the SFU (ex2.approx.ftz: -inf -> +0, relative error ~2^-22).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Four 8x8 b16 matrices from the mma accumulator layout to shared memory (lane 8i + r gives the
// address of row r of matrix i; register i holds lane's pair of matrix i). CCCL has no wrapper.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// 1 / x and log2(x) on the SFU, one instruction each, for a softmax sum (x in [1, keys] when a key is
// visible): `1.f / x` compiles to a full division with a slow-path call, `__log2f` adds a denormal
// fix-up. rcp.approx.ftz: relative error <= 2^-23; lg2.approx.ftz: absolute error ~2^-22.
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace msa::detail::cuda::prefill_sm90
