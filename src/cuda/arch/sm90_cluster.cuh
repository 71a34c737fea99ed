// Thread-block clusters (sm_90): cluster barriers, another CTA's shared memory (distributed shared
// memory: mapa, ld.shared::cluster, st.async) and waits on an mbarrier that other CTAs complete. Over
// CCCL's cuda::ptx where it has the instruction in the form used; inline PTX for the .aligned cluster
// barrier, mapa and the cluster loads. Compiled for sm_90 only: callers guard their cluster code with
// __CUDA_ARCH__ >= 900.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cuda/ptx>

namespace msa::detail::cuda::arch {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// A barrier over every thread of the cluster (release / acquire: shared-memory writes before it are
// visible to other CTAs' reads after it). .aligned: every thread of each warp executes it together.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The two halves, split to overlap work with the wait: a relaxed arrival (orders nothing; for a wait
// that only needs every CTA to have started, e.g. initialized its mbarriers, fenced by
// fence_mbarrier_init) and the wait.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  ::cuda::ptx::barrier_cluster_arrive(::cuda::ptx::sem_relaxed);
}
__device__ __forceinline__ void cluster_wait() { ::cuda::ptx::barrier_cluster_wait(); }

// The shared-window address in CTA `rank` of the variable at this CTA's address smem.
__device__ __forceinline__ uint32_t cluster_map(uint32_t smem, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem), "r"(rank));
  return r;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Stores into another CTA's shared memory (addresses from __cluster_map_shared_rank) that complete
// their bytes on that CTA's mbarrier `remote_bar`.
template <typename T>
__device__ __forceinline__ void st_async(T* remote, const T& v, uint64_t* remote_bar) {
  ::cuda::ptx::st_async(remote, v, remote_bar);
}
template <typename T>
__device__ __forceinline__ void st_async(T* remote, const T (&v)[2], uint64_t* remote_bar) {
  ::cuda::ptx::st_async(remote, v, remote_bar);
}
template <typename T>
__device__ __forceinline__ void st_async(T* remote, const T (&v)[4], uint64_t* remote_bar) {
  ::cuda::ptx::st_async(remote, v, remote_bar);
}

// Waits for phase `parity` of an mbarrier of this CTA that other CTAs of the cluster complete (acquire
// at cluster scope: their st.async data is visible after it).
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(::cuda::ptx::sem_acquire, ::cuda::ptx::scope_cluster, bar, parity)) {
  }
}

#endif  // __CUDA_ARCH__ >= 900

}  // namespace msa::detail::cuda::arch
