// The process-wide cache of StreamFork handles (stream_fork.h).
#include "cuda/runtime/stream_fork.h"

#include <map>
#include <mutex>
#include <utility>

namespace msa::detail::cuda {

namespace {
std::mutex& fork_mutex() {
  static std::mutex mu;
  return mu;
}
// (device, high priority) -> free sets.
std::multimap<std::pair<int, bool>, ForkHandles>& free_forks() {
  static auto* m = new std::multimap<std::pair<int, bool>, ForkHandles>();  // never destroyed: used at exit
  return *m;
}
}  // namespace

ForkHandles fork_acquire(bool high_priority, int* device) {
  MSA_CUDA_CHECK(cudaGetDevice(device));
  {
    std::lock_guard<std::mutex> lock(fork_mutex());
    auto& m = free_forks();
    auto it = m.find({*device, high_priority});
    if (it != m.end()) {
      const ForkHandles h = it->second;
      m.erase(it);
      return h;
    }
  }
  ForkHandles h;
  int least = 0, greatest = 0;
  MSA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  MSA_CUDA_CHECK(cudaStreamCreateWithPriority(&h.side, cudaStreamNonBlocking, high_priority ? greatest : least));
  MSA_CUDA_CHECK(cudaEventCreateWithFlags(&h.start, cudaEventDisableTiming));
  MSA_CUDA_CHECK(cudaEventCreateWithFlags(&h.done, cudaEventDisableTiming));
  return h;
}

void fork_release(const ForkHandles& h, int device, bool high_priority) noexcept {
  try {
    std::lock_guard<std::mutex> lock(fork_mutex());
    free_forks().emplace(std::make_pair(device, high_priority), h);
  } catch (...) {  // out of memory for the map node: let the handles go instead
    cudaEventDestroy(h.done);
    cudaEventDestroy(h.start);
    cudaStreamDestroy(h.side);
  }
}

}  // namespace msa::detail::cuda
