// A minimal parallel loop for the reference backend: std::thread workers that take indexes from a
// shared counter (items differ in cost: causal rows see 1..kv_len keys, so static slicing would idle).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace msa::detail::reference {

// Workers parallel_for(n, ...) uses: one per hardware thread, never more than n, at least one.
inline int worker_count(int64_t n) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(hw, n)));
}

// Calls body(i, worker) for every i in [0, n), worker in [0, worker_count(n)) naming the calling
// thread (for per-thread scratch). The first exception a body throws is rethrown after all join.
template <typename Body>
void parallel_for(int64_t n, Body&& body) {
  if (n <= 0) return;
  const int workers = worker_count(n);
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int worker) {
    try {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);  // the others stop at their next index
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (int w = 1; w < workers; ++w) threads.emplace_back(run, w);
  run(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace msa::detail::reference
