// Argument checks shared by the entry points. Each throws msa::Error whose message names the
// entry point, the argument, the expectation and what was passed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/params.h"
#include "msa/ops.h"
#include "msa/tensor.h"

namespace msa::detail {

struct ArgCheck {
  const char* fn;    // "msa.attention"
  const char* name;  // "q"
  const TensorView& t;

  const ArgCheck& present() const;
  const ArgCheck& dtype(std::initializer_list<DType> allowed) const;
  // ndim with the dims' names for the message, e.g. "[total_q, num_qo_heads, head_dim]".
  const ArgCheck& ndim(int n, const char* dims) const;
  const ArgCheck& size(int dim, int64_t expected, const char* what) const;
  const ArgCheck& size_at_least(int dim, int64_t expected, const char* what) const;
  const ArgCheck& device(Device d) const;
  const ArgCheck& inner_contiguous() const;
  const ArgCheck& nonneg_strides() const;
  // Data pointer and every stride but the innermost a multiple of `bytes` (vector loads on the GPU).
  const ArgCheck& aligned(int bytes) const;
};

// The checks of one argument. Every size must fit int32 (kValue otherwise): the kernels and the reference index
// tokens, heads, pages and blocks in 32 bits, so a larger extent (a view with zero strides) would be cut short.
ArgCheck arg(const char* fn, const char* name, const TensorView& t);

// The dtypes one argument takes, and where they come from when that is not obvious ("the dtype of q").
struct DTypeRule {
  const char* name;
  const TensorView& t;
  std::initializer_list<DType> allowed;
  const char* source = nullptr;
};
// An entry point's dtype rules in the order of its arguments: the message names the first argument
// whose dtype is not one it takes. Absent tensors are skipped (presence is checked with the shapes).
void check_dtypes(const char* fn, std::initializer_list<DTypeRule> rules);

ScalarType scalar_type(DType t);

// The dequantization scales of an attention call (RunOptions::q_scale, k_scale, v_scale): finite and > 0.
void check_scales(const char* fn, const RunOptions& opts);

// The metadata of the sequence tensors (dtype, rank, B = batch_size, device, contiguity) as SeqParams.
SeqParams seq_params(const char* fn, const Sequences& s, int64_t B, Device dev, int64_t total_q);

// Host-readable copy of an integer tensor (CPU: a view; CUDA: a synchronous copy of its span).
class HostInts {
 public:
  HostInts() = default;
  HostInts(const TensorView& t, void* stream);
  bool empty() const { return !defined_; }
  // Element at a multi-index (up to 3 dims), widened to int64.
  int64_t at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0) const;

 private:
  bool defined_ = false;
  bool i64_ = false;
  const char* base_ = nullptr;
  std::vector<char> storage_;
  int64_t strides_[3] = {0, 0, 0};
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace msa::detail
