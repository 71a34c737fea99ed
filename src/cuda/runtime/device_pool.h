// A process-wide cache of device allocations for plan workspaces.
//
// Serving engines build plans often: sglang builds decode metadata every forward in eager mode and a prefill
// plan per layer call, and a sparse prefill plan owns up to 2 GiB of partial outputs. cudaMalloc costs tens to
// hundreds of microseconds of host time and cudaFree synchronizes the device, so a plan's buffers are returned
// here when it dies and handed to the next plan that asks for a size within 2x. Memory stays cached for the
// process (release_cached() gives it back).
#pragma once

#include <cstddef>

namespace msa::detail::cuda {

// A block of at least `bytes` on the current device; *granted receives its real size.
void* pool_acquire(size_t bytes, size_t* granted);
// Returns a block from pool_acquire (of `granted` bytes, on `device`) to the cache.
void pool_release(void* ptr, size_t granted, int device);
// Frees every cached block of every device (synchronizes).
void release_cached();

}  // namespace msa::detail::cuda
