// A side stream and two events, owned by a plan, that let one call run two independent launch sequences
// at once: fork(caller) makes the side stream wait for the caller's stream, join(caller) makes the
// caller's stream wait for the side stream. While the caller's stream is being captured into a CUDA
// graph, the pair is captured as a fork and a join of two branches (the side stream joins the capture at
// its wait on the fork event), so the graph keeps the concurrency. Everything is created at plan time:
// run() only records and waits. Two calls of one plan must not overlap (they share the events), as they
// already share the plan's workspaces.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/check.cuh"

namespace msa::detail::cuda {

class StreamFork {
 public:
  StreamFork() = default;
  // On the current device; the side stream at the device's highest priority when `high_priority` (the
  // block scheduler then gives its grids the SMs first as they free up).
  explicit StreamFork(bool high_priority) {
    int least = 0, greatest = 0;
    MSA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MSA_CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, high_priority ? greatest : least));
    MSA_CUDA_CHECK(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming));
    MSA_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~StreamFork() {
    if (done_) cudaEventDestroy(done_);
    if (start_) cudaEventDestroy(start_);
    if (side_) cudaStreamDestroy(side_);
  }
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;
  StreamFork(StreamFork&& o) noexcept { swap(o); }
  StreamFork& operator=(StreamFork&& o) noexcept {
    swap(o);
    return *this;
  }

  explicit operator bool() const { return side_ != nullptr; }
  cudaStream_t side() const { return side_; }
  // The side stream's next work starts after everything issued so far on `caller`.
  void fork(cudaStream_t caller) const {
    MSA_CUDA_CHECK(cudaEventRecord(start_, caller));
    MSA_CUDA_CHECK(cudaStreamWaitEvent(side_, start_, 0));
  }
  // The caller's next work starts after everything issued so far on the side stream.
  void join(cudaStream_t caller) const {
    MSA_CUDA_CHECK(cudaEventRecord(done_, side_));
    MSA_CUDA_CHECK(cudaStreamWaitEvent(caller, done_, 0));
  }
  // The same on the way out of a call that failed after fork(): errors ignored (the first one is being
  // reported). Without it the caller's later work could overlap the side stream's, and a capture would end
  // with an unjoined fork (cudaErrorStreamCaptureUnjoined) instead of the call's own error.
  void join_after_error(cudaStream_t caller) const noexcept {
    if (cudaEventRecord(done_, side_) == cudaSuccess) (void)cudaStreamWaitEvent(caller, done_, 0);
  }

 private:
  void swap(StreamFork& o) noexcept {
    std::swap(side_, o.side_);
    std::swap(start_, o.start_);
    std::swap(done_, o.done_);
  }
  cudaStream_t side_ = nullptr;
  cudaEvent_t start_ = nullptr, done_ = nullptr;
};

}  // namespace msa::detail::cuda
