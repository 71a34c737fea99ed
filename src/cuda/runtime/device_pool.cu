#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "cuda/runtime/check.cuh"
#include "cuda/runtime/device_pool.h"

namespace msa::detail::cuda {

namespace {
std::mutex& pool_mutex() {
  static std::mutex mu;
  return mu;
}
// (device, size) -> free blocks of exactly that size.
std::multimap<std::pair<int, size_t>, void*>& free_blocks() {
  static auto* m = new std::multimap<std::pair<int, size_t>, void*>();  // never destroyed: used at exit
  return *m;
}
}  // namespace

void* pool_acquire(size_t bytes, size_t* granted) {
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  {
    std::lock_guard<std::mutex> lock(pool_mutex());
    auto& m = free_blocks();
    auto it = m.lower_bound({device, bytes});
    // Reuse a cached block no more than twice the request, so small plans do not pin huge blocks.
    if (it != m.end() && it->first.first == device && it->first.second <= 2 * bytes) {
      *granted = it->first.second;
      void* p = it->second;
      m.erase(it);
      return p;
    }
  }
  void* p = nullptr;
  MSA_CUDA_CHECK(cudaMalloc(&p, bytes));
  *granted = bytes;
  return p;
}

void pool_release(void* ptr, size_t granted, int device) {
  std::lock_guard<std::mutex> lock(pool_mutex());
  free_blocks().emplace(std::make_pair(device, granted), ptr);
}

void release_cached() {
  std::lock_guard<std::mutex> lock(pool_mutex());
  int prev = 0;
  cudaGetDevice(&prev);
  for (auto& [key, p] : free_blocks()) {
    cudaSetDevice(key.first);
    cudaFree(p);
  }
  free_blocks().clear();
  cudaSetDevice(prev);
}

}  // namespace msa::detail::cuda
