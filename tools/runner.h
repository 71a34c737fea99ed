// Running a workload through the public API (msa/msa.h) on one backend, timed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "msa/msa.h"
#include "workload.h"

namespace msa::cli {

struct RunResult {
  std::vector<uint16_t> o;          // [total_q, Hq, Dv] bf16, from the last run
  std::vector<int32_t> block_idx;   // pattern indexer: the selections the last run made
  std::vector<double> times_ms;     // one per timed run
  std::string plan;                 // Plan::describe() of the plan that ran
  double median_ms() const;
};

// Where the workload's arrays live on the running device (host pointers for the CPU).
struct WorkloadBuffers {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  int32_t *page_table = nullptr, *qo_indptr = nullptr, *kv_lens = nullptr, *block_idx = nullptr;
  void *q_index = nullptr, *k_index = nullptr;  // pattern indexer
  float* scores = nullptr;                      // pattern indexer: [total_q, Hkv, max_blocks] workspace
};

// The arguments of msa::attention (msa::sparse_attention_layer for pattern indexer) over those buffers.
struct AttentionArgs {
  TensorView q, k, v, o, block_idx;
  PageTable pages;
  Sequences seqs;
  IndexerInputs index;
  TensorView scores;
};
AttentionArgs attention_args(const Workload& w, const WorkloadBuffers& buf, Device dev);
// The options every call of the workload takes: the fp8 pools' per-tensor scales (1 for bf16).
RunOptions run_options(const Workload& w);
// One timed call: the attention, or for pattern indexer the whole layer (scores, top-k, attention).
void run_call(const Workload& w, const Plan& plan, const AttentionArgs& a, const RunOptions& opts);

// plan_prefill from the host lengths, or plan_decode from (batch, 1 query token, kv_len).
Plan make_plan(const Workload& w, Device dev);

// Runs `repeat` times on the CPU reference backend, each run timed on the wall clock.
RunResult run_on_cpu(const Workload& w, int repeat);

#ifdef MSA_WITH_CUDA
// Copies the workload to the current GPU, runs once untimed (with the deep validation), then
// `repeat` times between CUDA events on a stream of its own, and copies o back.
RunResult run_on_cuda(const Workload& w, int repeat);
// "NVIDIA H200 (cuda:0, sm_90)"
std::string cuda_device_name();
#endif

}  // namespace msa::cli
