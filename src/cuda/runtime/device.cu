// Device queries and the small host utilities of the CUDA backend.
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "cuda/runtime/check.cuh"

namespace msa::detail::cuda {

namespace {
struct DeviceInfo {
  int sm_count = 0;
  int cc = 0;
};
const DeviceInfo& info(int device) {
  static std::mutex mu;
  static std::vector<DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1);
  DeviceInfo& d = cache[device];
  if (d.cc == 0) {
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
    int major = 0, minor = 0;
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    d.cc = major * 10 + minor;
  }
  return d;
}
}  // namespace

bool compiled() { return true; }

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  return info(dev).cc >= 80;
}

int sm_count(int device) { return info(device).sm_count; }
int compute_capability(int device) { return info(device).cc; }

void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  MSA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  MSA_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace msa::detail::cuda
