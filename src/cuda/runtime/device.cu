// Device queries and the small host utilities of the CUDA backend.
#include <algorithm>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "cuda/runtime/check.cuh"

namespace msa::detail::cuda {

namespace {
// Compiled like every kernel of the library: the code a device runs for it tells which arch the kernels
// were compiled for there.
__global__ void code_arch_probe_kernel() {}

struct DeviceInfo {
  int sm_count = 0;
  int smem_optin = 0;
  // The compute capability the kernels run as on this device: the device's, or the older arch of the code
  // this binary holds for it (sm_80 PTX JIT-compiled on an H200 has none of the sm_90 paths: clusters, PDL,
  // the Hopper kernels), or 0 where it holds none that runs there. Every feature choice reads this.
  int cc = 0;
  bool known = false;
};
// By value: a later query of a higher ordinal resizes the cache (another thread's reference would dangle).
DeviceInfo info(int device) {
  static std::mutex mu;
  static std::vector<DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1);
  DeviceInfo& d = cache[device];
  if (!d.known) {
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    int major = 0, minor = 0;
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    int current = 0;
    MSA_CUDA_CHECK(cudaGetDevice(&current));
    MSA_CUDA_CHECK(cudaSetDevice(device));
    cudaFuncAttributes attr{};
    const bool runs = cudaFuncGetAttributes(&attr, code_arch_probe_kernel) == cudaSuccess;
    if (!runs) cudaGetLastError();  // no kernel image for this device: clear the error, cc = 0
    MSA_CUDA_CHECK(cudaSetDevice(current));
    d.cc = runs ? std::min(major * 10 + minor, attr.ptxVersion) : 0;
    d.known = true;
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
int smem_optin(int device) { return info(device).smem_optin; }
int compute_capability(int device) { return info(device).cc; }

int current_compute_capability() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return info(dev).cc;
}

void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  MSA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  MSA_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace msa::detail::cuda
