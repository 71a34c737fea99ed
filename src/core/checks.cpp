#include "core/checks.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/backend.h"
#include "msa/error.h"

namespace msa::detail {

namespace {
std::string dtype_list(std::initializer_list<DType> allowed) {
  std::string s;
  size_t i = 0;
  for (DType d : allowed) {
    if (i) s += (i + 1 == allowed.size()) ? " or " : ", ";
    s += dtype_name(d);
    ++i;
  }
  return s;
}
}  // namespace

ArgCheck arg(const char* fn, const char* name, const TensorView& t) {
  if (t.defined())
    for (int i = 0; i < t.ndim(); ++i)
      MSA_CHECK(t.size(i) <= INT32_MAX, kValue, fn, ": argument '", name, "': expected every size below 2^31, got ",
                t.shape_str());
  return ArgCheck{fn, name, t};
}

const ArgCheck& ArgCheck::present() const {
  MSA_CHECK(t.defined(), kValue, fn, ": argument '", name, "' is required");
  MSA_CHECK(t.data() != nullptr || t.numel() == 0, kValue, fn, ": argument '", name, "': null data pointer for ",
            t.numel(), " elements");
  return *this;
}

const ArgCheck& ArgCheck::dtype(std::initializer_list<DType> allowed) const {
  for (DType d : allowed)
    if (t.dtype() == d) return *this;
  MSA_FAIL(kType, fn, ": argument '", name, "': expected dtype ", dtype_list(allowed), ", got ", t.dtype_str());
}

void check_dtypes(const char* fn, std::initializer_list<DTypeRule> rules) {
  for (const DTypeRule& r : rules) {
    if (!r.t.defined()) continue;
    bool ok = false;
    for (DType d : r.allowed) ok = ok || (r.t.dtype() == d && d != DType::kUnknown);
    if (ok) continue;
    if (r.source)
      MSA_FAIL(kType, fn, ": argument '", r.name, "': expected dtype ", dtype_list(r.allowed), " (", r.source,
               "), got ", r.t.dtype_str());
    MSA_FAIL(kType, fn, ": argument '", r.name, "': expected dtype ", dtype_list(r.allowed), ", got ",
             r.t.dtype_str());
  }
}

const ArgCheck& ArgCheck::ndim(int n, const char* dims) const {
  MSA_CHECK(t.ndim() == n, kValue, fn, ": argument '", name, "': expected ", n, " dimensions ", dims, ", got ",
            t.ndim(), " (shape ", t.shape_str(), ")");
  return *this;
}

const ArgCheck& ArgCheck::size(int dim, int64_t expected, const char* what) const {
  MSA_CHECK(t.size(dim) == expected, kValue, fn, ": argument '", name, "': expected shape[", dim, "] (", what,
            ") = ", expected, ", got ", t.size(dim), " (shape ", t.shape_str(), ")");
  return *this;
}

const ArgCheck& ArgCheck::size_at_least(int dim, int64_t expected, const char* what) const {
  MSA_CHECK(t.size(dim) >= expected, kValue, fn, ": argument '", name, "': expected shape[", dim, "] (", what,
            ") >= ", expected, ", got ", t.size(dim), " (shape ", t.shape_str(), ")");
  return *this;
}

const ArgCheck& ArgCheck::device(Device d) const {
  // A CPU tensor where a CUDA one is due (or back) is a wrong device kind: TypeError, as error.h and
  // docs/python_api.md say; another GPU ordinal of the right kind is a wrong value.
  MSA_CHECK(t.device().type == d.type, kType, fn, ": argument '", name, "': expected a tensor on ", device_name(d),
            ", got ", device_name(t.device()));
  MSA_CHECK(t.device() == d, kValue, fn, ": argument '", name, "': expected a tensor on ", device_name(d), ", got ",
            device_name(t.device()));
  return *this;
}

const ArgCheck& ArgCheck::inner_contiguous() const {
  MSA_CHECK(t.ndim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1, kValue, fn, ": argument '", name,
            "': expected the innermost dimension contiguous (stride 1), got strides ", t.strides_str());
  return *this;
}

const ArgCheck& ArgCheck::nonneg_strides() const {
  for (int i = 0; i < t.ndim(); ++i)
    MSA_CHECK(t.stride(i) >= 0, kValue, fn, ": argument '", name, "': expected non-negative strides, got ",
              t.strides_str());
  return *this;
}

const ArgCheck& ArgCheck::aligned(int bytes) const {
  const int eb = dtype_bytes(t.dtype());
  MSA_CHECK(reinterpret_cast<uintptr_t>(t.data()) % bytes == 0, kValue, fn, ": argument '", name,
            "': the CUDA kernels need a ", bytes, "-byte aligned data pointer");
  for (int i = 0; i + 1 < t.ndim(); ++i)
    MSA_CHECK(t.size(i) <= 1 || (t.stride(i) * eb) % bytes == 0, kValue, fn, ": argument '", name,
              "': the CUDA kernels need every outer stride to be a multiple of ", bytes, " bytes, got strides ",
              t.strides_str(), " (elements of ", eb, " bytes)");
  return *this;
}

SeqParams seq_params(const char* fn, const Sequences& s, int64_t B, Device dev, int64_t total_q) {
  arg(fn, "qo_indptr", s.qo_indptr).present().dtype({DType::kI32}).ndim(1, "[batch_size + 1]")
      .size(0, B + 1, "batch_size + 1").device(dev);
  arg(fn, "kv_lens", s.kv_lens).present().dtype({DType::kI32}).ndim(1, "[batch_size]")
      .size(0, B, "batch_size").device(dev);
  MSA_CHECK(s.qo_indptr.stride(0) == 1 && s.kv_lens.stride(0) == 1, kValue, fn,
            ": arguments 'qo_indptr' and 'kv_lens': expected contiguous, got strides ", s.qo_indptr.strides_str(),
            " and ", s.kv_lens.strides_str());
  SeqParams p;
  p.batch_size = static_cast<int32_t>(B);
  p.total_q = total_q;
  p.qo_indptr = s.qo_indptr.data_as<const int32_t>();
  p.kv_lens = s.kv_lens.data_as<const int32_t>();
  if (s.qo_offset.defined()) {
    arg(fn, "qo_offset", s.qo_offset).present().dtype({DType::kI32}).ndim(1, "[batch_size]")
        .size(0, B, "batch_size").device(dev);
    MSA_CHECK(s.qo_offset.stride(0) == 1, kValue, fn, ": argument 'qo_offset': expected contiguous, got strides ",
              s.qo_offset.strides_str());
    p.qo_offset = s.qo_offset.data_as<const int32_t>();
  }
  return p;
}

ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::kF32: return ScalarType::kF32;
    case DType::kF16: return ScalarType::kF16;
    case DType::kBF16: return ScalarType::kBF16;
    case DType::kF8E4M3: return ScalarType::kF8E4M3;
    default: MSA_FAIL(kType, "msa: dtype ", dtype_name(t), " is not a floating-point tensor type");
  }
}

void check_scales(const char* fn, const RunOptions& opts) {
  for (auto [name, value] : {std::pair<const char*, float>{"q_scale", opts.q_scale}, {"k_scale", opts.k_scale},
                             {"v_scale", opts.v_scale}})
    MSA_CHECK(std::isfinite(value) && value > 0.f, kValue, fn, ": argument '", name,
              "': expected a finite number > 0, got ", value);
}

HostInts::HostInts(const TensorView& t, void* stream) {
  if (!t.defined()) return;
  defined_ = true;
  i64_ = t.dtype() == DType::kI64;
  const int eb = i64_ ? 8 : 4;
  for (int i = 0; i < t.ndim() && i < 3; ++i) strides_[i] = t.stride(i);
  if (t.device().type == DeviceType::kCPU || t.numel() == 0) {
    base_ = static_cast<const char*>(t.data());
    return;
  }
  int64_t span = 1;
  for (int i = 0; i < t.ndim(); ++i) span += (t.size(i) - 1) * t.stride(i);
  storage_.resize(static_cast<size_t>(span) * eb);
  cuda::copy_to_host(storage_.data(), t.data(), storage_.size(), stream);
  base_ = storage_.data();
}

int64_t HostInts::at(int64_t i0, int64_t i1, int64_t i2) const {
  const int64_t off = i0 * strides_[0] + i1 * strides_[1] + i2 * strides_[2];
  return i64_ ? reinterpret_cast<const int64_t*>(base_)[off] : reinterpret_cast<const int32_t*>(base_)[off];
}

}  // namespace msa::detail
