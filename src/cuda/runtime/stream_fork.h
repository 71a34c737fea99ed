// A side stream and two events, held by a plan, that let one call run two independent launch sequences
// at once: fork(caller) makes the side stream wait for the caller's stream, join(caller) makes the
// caller's stream wait for the side stream. While the caller's stream is being captured into a CUDA
// graph, the pair is captured as a fork and a join of two branches (the side stream joins the capture at
// its wait on the fork event), so the graph keeps the concurrency. run() only records and waits.
//
// The stream and events come from a process-wide cache (per device and priority) and go back to it when
// the holder dies, as plan workspaces do (device_pool.h): sglang builds a prefill plan per layer call, and
// a stream and two events created and destroyed per plan are driver calls on every layer of every step.
// A set handed to a new plan may still hold the last call of the plan that returned it; the new plan's work
// queues behind it on the side stream (correct, in stream order), and events are re-recorded per call
// (a wait already enqueued keeps the record it saw). Two calls of one plan must not overlap (they share the
// events), as they already share the plan's workspaces.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/runtime/check.cuh"

namespace msa::detail::cuda {

struct ForkHandles {
  cudaStream_t side = nullptr;
  cudaEvent_t start = nullptr, done = nullptr;
};
// A set on the current device (cached or new); the side stream at the device's highest priority when
// `high_priority` (the block scheduler then gives its grids the SMs first as they free up).
ForkHandles fork_acquire(bool high_priority, int* device);
// Back to the cache (destroyed only when the cache cannot take them).
void fork_release(const ForkHandles& h, int device, bool high_priority) noexcept;

class StreamFork {
 public:
  StreamFork() = default;
  explicit StreamFork(bool high_priority) : high_(high_priority) { h_ = fork_acquire(high_priority, &device_); }
  ~StreamFork() {
    if (h_.side) fork_release(h_, device_, high_);
  }
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;
  StreamFork(StreamFork&& o) noexcept { swap(o); }
  StreamFork& operator=(StreamFork&& o) noexcept {
    swap(o);
    return *this;
  }

  explicit operator bool() const { return h_.side != nullptr; }
  cudaStream_t side() const { return h_.side; }
  // The side stream's next work starts after everything issued so far on `caller`.
  void fork(cudaStream_t caller) const {
    MSA_CUDA_CHECK(cudaEventRecord(h_.start, caller));
    MSA_CUDA_CHECK(cudaStreamWaitEvent(h_.side, h_.start, 0));
  }
  // The caller's next work starts after everything issued so far on the side stream.
  void join(cudaStream_t caller) const {
    MSA_CUDA_CHECK(cudaEventRecord(h_.done, h_.side));
    MSA_CUDA_CHECK(cudaStreamWaitEvent(caller, h_.done, 0));
  }
  // The same on the way out of a call that failed after fork(): errors ignored (the first one is being
  // reported). Without it the caller's later work could overlap the side stream's, and a capture would end
  // with an unjoined fork (cudaErrorStreamCaptureUnjoined) instead of the call's own error.
  void join_after_error(cudaStream_t caller) const noexcept {
    if (cudaEventRecord(h_.done, h_.side) == cudaSuccess) (void)cudaStreamWaitEvent(caller, h_.done, 0);
  }

 private:
  void swap(StreamFork& o) noexcept {
    std::swap(h_, o.h_);
    std::swap(device_, o.device_);
    std::swap(high_, o.high_);
  }
  ForkHandles h_;
  int device_ = 0;
  bool high_ = false;
};

}  // namespace msa::detail::cuda
