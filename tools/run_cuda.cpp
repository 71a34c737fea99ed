// The CUDA half of the runner; compiled to nothing in a build without the CUDA backend.
#ifdef MSA_WITH_CUDA

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "runner.h"

namespace msa::cli {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  MSA_CHECK(e == cudaSuccess, kRuntime, "msa demo: ", what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

class DeviceArray {
 public:
  DeviceArray(size_t bytes, const char* what) : bytes_(bytes) {
    if (bytes_ > 0) cuda_check(cudaMalloc(&ptr_, bytes_), what);
  }
  template <typename T>
  DeviceArray(const T* host, size_t count, const char* what) : DeviceArray(count * sizeof(T), what) {
    if (bytes_ > 0) cuda_check(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice), what);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  int32_t* ints() const { return static_cast<int32_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cudaStreamDestroy(s); }
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { cuda_check(cudaEventCreate(&e), "cudaEventCreate"); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { cudaEventDestroy(e); }
};

}  // namespace

std::string cuda_device_name() {
  int id = 0;
  cuda_check(cudaGetDevice(&id), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, id), "cudaGetDeviceProperties");
  std::string out = std::string(prop.name) + " (cuda:" + std::to_string(id) + ", sm_" + std::to_string(prop.major) +
                    std::to_string(prop.minor);
  // A build without code for this GPU's arch runs older code on it (e.g. sm_80 PTX on an H200: the portable kernels).
  const int ran_as = msa::cuda_compute_capability();
  if (ran_as != prop.major * 10 + prop.minor) out += ", kernels of sm_" + std::to_string(ran_as);
  return out + ")";
}

RunResult run_on_cuda(const Workload& w, int repeat) {
  int id = 0;
  cuda_check(cudaGetDevice(&id), "cudaGetDevice");
  const Device dev{DeviceType::kCUDA, id};
  const size_t o_elems = static_cast<size_t>(w.total_q) * w.cfg.num_qo_heads * w.cfg.dv();

  DeviceArray q(w.q.data.get(), w.q.size, "copy q"),
      k(static_cast<const uint8_t*>(w.k.data()), w.k.bytes(), "copy k"),
      v(static_cast<const uint8_t*>(w.v.data()), w.v.bytes(), "copy v");
  DeviceArray o(o_elems * 2, "allocate o");
  DeviceArray page_table(w.page_table.data(), w.page_table.size(), "copy page table");
  DeviceArray qo_indptr(w.qo_indptr.data(), w.qo_indptr.size(), "copy qo_indptr");
  DeviceArray kv_lens(w.kv_lens.data(), w.kv_lens.size(), "copy kv_lens");
  DeviceArray block_idx(w.block_idx.data(), w.block_idx.size(), "copy block_idx");
  // Pattern indexer: the index queries and keys, and the layer's fp32 scores workspace.
  DeviceArray q_index(w.q_index.data.get(), static_cast<size_t>(w.q_index.size), "copy index q"),
      k_index(w.k_index.data.get(), static_cast<size_t>(w.k_index.size), "copy index k"),
      scores(w.indexer ? static_cast<size_t>(w.total_q) * w.cfg.num_kv_heads * w.max_blocks * sizeof(float) : 0,
             "allocate scores");
  // All ones is a bf16 NaN: a row the kernels never write fails the check.
  cuda_check(cudaMemset(o.get(), 0xff, o_elems * 2), "fill o");
  // Copies from pageable memory and memsets may still be in flight on the legacy stream, which the
  // non-blocking stream below does not wait for.
  cuda_check(cudaDeviceSynchronize(), "copy inputs");

  WorkloadBuffers buf;
  buf.q = q.get(), buf.k = k.get(), buf.v = v.get(), buf.o = o.get();
  buf.page_table = page_table.ints(), buf.qo_indptr = qo_indptr.ints(), buf.kv_lens = kv_lens.ints();
  buf.block_idx = w.block_idx.empty() ? nullptr : block_idx.ints();
  buf.q_index = q_index.get(), buf.k_index = k_index.get(), buf.scores = static_cast<float*>(scores.get());
  const AttentionArgs a = attention_args(w, buf, dev);
  const Plan plan = make_plan(w, dev);
  Stream stream;
  RunOptions opts = run_options(w);
  opts.stream = stream.s;

  // Warm-up, with the deep scan of lengths, page ids and block ids (it synchronizes: untimed only).
  opts.validate = true;
  run_call(w, plan, a, opts);
  cuda_check(cudaStreamSynchronize(stream.s), "warm-up run");
  opts.validate = false;

  // Eager launches, host overhead included: a call shorter than its launch shows the launch time.
  std::vector<Event> start(repeat), stop(repeat);
  for (int i = 0; i < repeat; ++i) {
    cuda_check(cudaEventRecord(start[i].e, stream.s), "cudaEventRecord");
    run_call(w, plan, a, opts);
    cuda_check(cudaEventRecord(stop[i].e, stream.s), "cudaEventRecord");
  }
  cuda_check(cudaStreamSynchronize(stream.s), "timed runs");
  RunResult r;
  r.plan = plan.describe();
  for (int i = 0; i < repeat; ++i) {
    float ms = 0.f;
    cuda_check(cudaEventElapsedTime(&ms, start[i].e, stop[i].e), "cudaEventElapsedTime");
    r.times_ms.push_back(ms);
  }
  r.o.resize(o_elems);
  cuda_check(cudaMemcpy(r.o.data(), o.get(), o_elems * 2, cudaMemcpyDeviceToHost), "copy o back");
  if (w.indexer) {
    r.block_idx.resize(w.block_idx.size());
    cuda_check(cudaMemcpy(r.block_idx.data(), block_idx.get(), r.block_idx.size() * sizeof(int32_t),
                          cudaMemcpyDeviceToHost),
               "copy block_idx back");
  }
  return r;
}

}  // namespace msa::cli

#endif  // MSA_WITH_CUDA
