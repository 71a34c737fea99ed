// Owning device allocations for plan workspaces (drawn from the process-wide cache of device_pool.h, so
// building and dropping plans costs no cudaMalloc / cudaFree once warm), and a scoped current-device switch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "cuda/runtime/check.cuh"
#include "cuda/runtime/device_pool.h"

namespace msa::detail::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) {
      MSA_CUDA_CHECK(cudaGetDevice(&device_));
      ptr_ = pool_acquire(bytes, &granted_);
    }
  }
  ~DeviceBuffer() {
    if (ptr_) pool_release(ptr_, granted_, device_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
        granted_(std::exchange(o.granted_, 0)), device_(o.device_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(granted_, o.granted_);
    std::swap(device_, o.device_);
    return *this;
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;    // asked for
  size_t granted_ = 0;  // held (a cached block may be larger)
  int device_ = 0;
};

// Makes `device` current for the scope (the tensors' device may differ from the caller's current one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MSA_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) MSA_CUDA_CHECK(cudaSetDevice(device));
    switched_ = prev_ != device;
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

}  // namespace msa::detail::cuda
