// Hopper (sm_90) synchronization and copies of the CTA: mbarriers, TMA tile loads and stores, bulk
// copies, the generic -> async proxy fence, named barriers, warpgroup register budgets and stmatrix.
// Over CCCL's cuda::ptx wrappers where CCCL has one (mbarrier, cp.async.bulk[.tensor], fences); inline
// PTX for the rest (prefetch.tensormap, bar.sync / bar.arrive, setmaxnreg, stmatrix). Clusters:
// sm90_cluster.cuh; wgmma: sm90_wgmma.cuh. Called only from code compiled for sm_90.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cuda/ptx>

#include "cuda/arch/memory.cuh"

namespace msa::detail::cuda::arch {

namespace ptx = ::cuda::ptx;

// ---- mbarriers in this CTA's shared memory --------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) { ptx::mbarrier_init(bar, arrivals); }

// Makes initialized mbarriers visible to the async proxy (TMA completes transactions on them) and to
// the other CTAs of the cluster.
__device__ __forceinline__ void fence_mbarrier_init() {
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) { (void)ptx::mbarrier_arrive(bar); }

// One arrival that also announces `bytes` of TMA / bulk-copy transactions for the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  (void)ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
}

// ---- TMA ------------------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Tile loads into this CTA's shared memory at dst (the 128-byte swizzle: 1024-byte aligned),
// completing their bytes on bar. Coordinates are in elements, innermost first; a box reaching outside
// the tensor is filled with zeros. dst is a pointer or a shared-window address.
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
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                            int32_t c3, uint64_t* bar) {
  tma_load_4d(__cvta_shared_to_generic(dst), map, c0, c1, c2, c3, bar);
}

// Contiguous global -> shared copy of `bytes` (a multiple of 16; both addresses 16-byte aligned),
// completing on bar.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint64_t* bar) {
  ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, __cvta_shared_to_generic(dst), src, bytes, bar);
}

// Tile store from this CTA's shared memory into a 2-D map, in the issuing thread's bulk group.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int32_t c0, int32_t c1, const void* src) {
  const int32_t coords[2] = {c0, c1};
  ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, map, coords, src);
}
__device__ __forceinline__ void bulk_commit() { ptx::cp_async_bulk_commit_group(); }
// This thread's committed bulk stores have read their shared-memory source (it may be rewritten).
__device__ __forceinline__ void bulk_wait_read() { ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{}); }
// This thread's committed bulk stores are complete.
__device__ __forceinline__ void bulk_wait_all() { ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{}); }

// Orders this thread's generic-proxy shared-memory writes (st.shared, cp.async) before later
// async-proxy accesses (wgmma operand reads, TMA writes into the same buffer).
__device__ __forceinline__ void fence_proxy_async() { ptx::fence_proxy_async(ptx::space_shared); }

// ---- named barriers -------------------------------------------------------------------------------------
// Over `threads` threads (a multiple of 32); id 0 is __syncthreads. sync waits for the barrier to
// complete, arrive only counts this warp in.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- warpgroup register budget ----------------------------------------------------------------------
// Registers per thread of the executing warpgroup (all of its 128 threads execute it).
template <uint32_t kRegs>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- stmatrix -------------------------------------------------------------------------------------------
// Four 8x8 b16 matrices from the mma accumulator layout to shared memory (lane 8i + r gives the address
// of row r of matrix i; register i holds the lane's pair of matrix i).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace msa::detail::cuda::arch
