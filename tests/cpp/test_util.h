// Shared test scaffolding: element encodings written independently of src/reference, host buffers,
// a random paged-attention problem builder and a naive float64 reference of the contract.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "msa/msa.h"

namespace msa_test {

using msa::DType;
using msa::TensorView;

// ---- element encodings (independent of src/reference/scalar.h) ----
double decode(DType t, const void* base, int64_t i);
void encode(DType t, void* base, int64_t i, double v);  // round to nearest, ties to even
uint16_t bf16_bits(double v);
uint16_t fp16_bits(double v);
uint8_t fp8e4m3_bits(double v);  // past 464 in magnitude, and inf: NaN (as torch converts)
double fp8e4m3_value(uint8_t bits);

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double normal() { return std::normal_distribution<double>()(gen_); }
  double uniform(double lo = 0.0, double hi = 1.0) { return std::uniform_real_distribution<double>(lo, hi)(gen_); }
  int64_t randint(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }  // inclusive
  template <typename T>
  void shuffle(std::vector<T>& v) { std::shuffle(v.begin(), v.end(), gen_); }

 private:
  std::mt19937_64 gen_;
};

// Host memory of one element type (8-byte aligned), read and written as doubles.
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, int64_t numel);
  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  void* data() const { return const_cast<uint64_t*>(words_.data()); }
  double get(int64_t i) const { return decode(dtype_, data(), i); }
  void set(int64_t i, double v) { encode(dtype_, data(), i, v); }
  void fill(double v);
  TensorView view(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides = {}) const;
  // A view whose data starts at element `offset`.
  TensorView view_at(int64_t offset, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides = {}) const;

 private:
  DType dtype_ = DType::kUnknown;
  int64_t numel_ = 0;
  std::vector<uint64_t> words_;
};

TensorView int_view(const std::vector<int32_t>& v);  // 1-D int32 view of a host vector

// A [T, H, topk] int32 index tensor, stored token-major or (sglang) head-major.
struct IndexRows {
  int64_t tokens = 0, heads = 0, topk = 0;
  bool head_major = false;
  std::vector<int32_t> mem;
  IndexRows() = default;
  IndexRows(int64_t tokens, int64_t heads, int64_t topk, bool head_major);
  int64_t offset(int64_t t, int64_t h, int64_t i) const;
  int32_t& at(int64_t t, int64_t h, int64_t i) { return mem[offset(t, h, i)]; }
  int32_t at(int64_t t, int64_t h, int64_t i) const { return mem[offset(t, h, i)]; }
  TensorView view() const;
};

enum class KvLayout {
  kContiguous,  // [pages, H, P, D] row-major
  kSlotMajor,   // sglang's pool [slots, H, D] seen as [pages, H, P, D]
  kPadded,      // row pitch D + 8 and a gap between pages: strides that are none of the above
  kInterleaved, // K and V the two halves of one [pages, H, P, 2D] pool (head_dim_v = head_dim)
};

struct ProblemSpec {
  DType dtype = DType::kBF16;     // q, k, v, o
  DType k_dtype = DType::kUnknown;  // kUnknown: dtype; kF8E4M3 (indexer only) adds per-token k scales
  // Attention: K and V both fp8 e4m3, stored as unit-normal values / k_scale (v_scale), so that the
  // dequantized cache (value x scale) is unit-normal.
  bool fp8_kv = false;
  // RunOptions' per-tensor scales: run_attention passes them, naive_attention applies them.
  double q_scale = 1.0, k_scale = 1.0, v_scale = 1.0;
  int num_qo_heads = 8, num_kv_heads = 2, head_dim = 64, head_dim_v = 0;
  int page_size = 64;
  std::vector<int32_t> qo_lens, kv_lens;
  std::vector<int32_t> qo_offset;  // empty: default kv_len - qo_len (no tensor passed)
  bool causal = true;
  int topk = 0;                    // 0: dense
  bool decode = false;             // plan_decode; q gets batch * max_qo_len rows (padding after the last request)
  bool flat_table = false;
  KvLayout kv_layout = KvLayout::kContiguous;
  bool head_major_index = false;
  bool strided_out = false;        // o and lse with padded token strides
  double empty_row_prob = 0.0;     // sparse rows with every slot -1
  uint64_t seed = 1;
};

// A random batch: paged K/V pool with shuffled physical pages and spare pages (spare memory holds
// NaN, so a read of it shows), page tables, block-index rows and a plan.
struct Problem {
  ProblemSpec spec;
  int64_t batch = 0, total_q = 0;
  int32_t num_pages = 0;
  std::vector<int32_t> qo_indptr, kv_lens, qo_offset;
  std::vector<std::vector<int32_t>> pages_of;  // the truth: request b's logical page -> physical page (-1: none)
  std::vector<int32_t> table, page_indptr;     // page_indptr empty: dense [batch, table_cols]
  int64_t table_cols = 0;
  Buffer q, k, v, k_scale;         // kInterleaved: k holds both halves, v is empty
  std::vector<int64_t> kv_shape, k_strides, v_shape, v_strides, ks_strides;
  int64_t v_offset = 0;            // element of v_buffer() where V starts (kInterleaved: head_dim)
  IndexRows rows;  // sparse problems
  msa::Plan plan;

  int dv() const { return spec.head_dim_v > 0 ? spec.head_dim_v : spec.head_dim; }
  int64_t qo_len(int64_t b) const { return qo_indptr[b + 1] - qo_indptr[b]; }
  int64_t position(int64_t b, int64_t i) const {
    return (qo_offset.empty() ? kv_lens[b] - qo_len(b) : qo_offset[b]) + i;
  }
  const Buffer& v_buffer() const { return spec.kv_layout == KvLayout::kInterleaved ? k : v; }
  TensorView q_view() const;
  TensorView k_view() const;
  TensorView v_view() const;
  TensorView k_scale_view() const;
  msa::PageTable page_table() const;
  msa::Sequences seqs() const;
  // Point request b's logical page lp at `page` in the table (and the truth: invalid ids hide keys).
  void set_page(int64_t b, int64_t lp, int32_t page);
};

Problem make_problem(const ProblemSpec& spec);
// Random rows for `heads` heads of `topk` slots: each non-empty row holds the token's own block,
// distinct entries in random slots, -1 in the others.
IndexRows random_rows(const Problem& pr, int64_t heads, int topk, bool head_major, double empty_row_prob, Rng& rng);

struct AttnResult {
  Buffer o;
  std::vector<int64_t> o_strides;  // [token, head]
  std::vector<float> lse;
  int64_t lse_stride = 0;          // per token
  double o_at(int64_t t, int64_t h, int64_t d) const { return o.get(t * o_strides[0] + h * o_strides[1] + d); }
  float lse_at(int64_t t, int64_t h) const { return lse[t * lse_stride + h]; }
};
// msa::attention on the problem with `rows` (the problem's own when null and sparse), with opts and the
// spec's q_scale / k_scale / v_scale. o starts as NaN.
AttnResult run_attention(const Problem& pr, const IndexRows* rows = nullptr, const msa::RunOptions& opts = {});

struct Expected {
  std::vector<double> o, lse;  // [total_q, Hq, Dv], [total_q, Hq]; rows outside every request: o 0, lse -inf
};
// The contract in float64, straight from the definitions: gather the visible keys (K and V dequantized:
// stored value x the spec's k_scale / v_scale), logits (q . k) * sm_scale * q_scale, softmax, sum.
// With token_step > 1 only every token_step-th token is computed (the others stay o 0, lse -inf).
Expected naive_attention(const Problem& pr, const IndexRows* rows = nullptr, double sm_scale = 0.0,
                         int64_t token_step = 1);

struct Tolerance {
  double rel_l2, max_abs, lse_abs;
};
Tolerance tolerance_for(DType t);
// o and lse of every token inside a request (every token_step-th) against the reference; a -inf lse
// must match exactly, with o = 0.
void expect_attention_matches(const Problem& pr, const AttnResult& got, const Expected& ref, int64_t token_step = 1);
// The q rows past the last request's tokens (a decode plan's padding) see no key: o = 0, lse = -inf.
void expect_padding_rows_empty(const Problem& pr, const AttnResult& got);

// Runs fn and expects an msa::Error of `kind` whose message contains every needle.
void expect_msa_error(const std::function<void()>& fn, msa::ErrorKind kind, const std::vector<std::string>& needles);

}  // namespace msa_test
