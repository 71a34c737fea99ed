// parallel_for over the host's cores, for generating data and for the float64 check (both scale
// with the KV pool: 8.6 GB of bf16 at the CUDA decode defaults).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace msa::cli {

// body(begin, end) on chunks of `grain` items handed out dynamically (rows of the check differ in
// cost by up to 30x between the first and the last query of a chunk). Rethrows the first exception.
template <typename Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  if (n <= 0) return;
  const int64_t chunks = (n + grain - 1) / grain;
  const int64_t threads = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), chunks);
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    try {
      for (int64_t b; (b = next.fetch_add(grain)) < n;) body(b, std::min(b + grain, n));
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace msa::cli
