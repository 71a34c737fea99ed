// One synthetic attention call of the demo, on the host: bf16 q and a paged KV pool (bf16, or fp8 e4m3
// with per-tensor scales) with shuffled physical pages, the page table, the lengths and (sparse) the
// top-k block selections.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "demo_options.h"
#include "msa/plan.h"

namespace msa::cli {

// A host array of bf16 values, left uninitialised until filled (the decode pool at the CUDA
// defaults is 8.6 GB; zeroing it first would cost a second pass).
struct Bf16Array {
  std::unique_ptr<uint16_t[]> data;
  int64_t size = 0;
  void allocate(int64_t n) {
    data.reset(new uint16_t[static_cast<size_t>(n)]);
    size = n;
  }
  int64_t bytes() const { return size * 2; }
};

// The K or V pool [num_pages, Hkv, page_size, D]: unit-normal bf16 values, or (fp8) those values quantized
// to e4m3 with one per-tensor scale, amax / 448; an fp8 element's value is its code's value times scale.
struct KvPool {
  KvDtype dtype = KvDtype::kBf16;
  Bf16Array bf16;                  // kBf16
  std::unique_ptr<uint8_t[]> fp8;  // kFp8: e4m3fn codes
  int64_t size = 0;
  float scale = 1.0f;              // kFp8 (1 for bf16)

  void* data() const { return dtype == KvDtype::kFp8 ? static_cast<void*>(fp8.get()) : bf16.data.get(); }
  int elem_bytes() const { return dtype == KvDtype::kFp8 ? 1 : 2; }
  int64_t bytes() const { return size * elem_bytes(); }
  // n values from element `offset`, dequantized (value x scale), in float64.
  void load(int64_t offset, int n, double* out) const;
};

struct WorkloadSpec {
  Phase phase = Phase::kPrefill;
  int64_t batch = 1;
  int64_t qo_len = 0;  // per request
  int64_t kv_len = 0;  // per request, the new tokens included
  Pattern pattern = Pattern::kRandom;
  bool dense = false;
  KvDtype kv_dtype = KvDtype::kBf16;
  uint64_t seed = 0;
};

struct Workload {
  Phase phase = Phase::kPrefill;
  AttentionConfig cfg;  // topk 0 when dense
  std::vector<int32_t> qo_lens, kv_lens, qo_indptr;
  int64_t total_q = 0;
  int64_t max_pages = 0;            // page-table row length
  int64_t num_pages = 0;            // physical pages in the pool, spares included
  std::vector<int32_t> page_table;  // [batch, max_pages], dense form
  std::vector<int32_t> block_idx;   // [total_q, Hkv, topk]; empty when dense
  Bf16Array q;                      // [total_q, Hq, D]
  KvPool k, v;                      // [num_pages, Hkv, page_size, D]
  // Pattern indexer: the selections come from the layer's own indexer step (block_idx is then its
  // [total_q, Hkv, topk] output workspace, -1 until a run fills it).
  bool indexer = false;
  Bf16Array q_index;                // [total_q, Hkv, kIndexHeadDim]
  Bf16Array k_index;                // [num_pages, kIndexKHeads, page_size, kIndexHeadDim]
  int64_t max_blocks = 0;           // the block extent of the scores workspace: ceil(max kv_len / block)

  int64_t batch() const { return static_cast<int64_t>(qo_lens.size()); }
  int64_t request_of(int64_t token) const;
  int64_t position_of(int64_t token) const;  // absolute position: kv_len - qo_len + index in the request
  // The distinct selected blocks that exist for (token, KV head), ascending: the row's entries in
  // [0, ceil(kv_len / block)) when sparse, every block of the request when dense.
  std::vector<int32_t> selected_blocks(int64_t token, int kv_head) const;
  // Element offset of key `key` of request b, KV head g in the k / v pool.
  int64_t kv_offset(int64_t b, int64_t key, int g) const;
  // Element offset of key `key` of request b in the index-K pool (its one head).
  int64_t index_k_offset(int64_t b, int64_t key) const;
};

// Bytes the workload takes on the host, to announce before building it.
int64_t workload_bytes(const WorkloadSpec& s);
Workload make_workload(const WorkloadSpec& s);

}  // namespace msa::cli
