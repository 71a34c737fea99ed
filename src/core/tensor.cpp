#include "msa/tensor.h"

#include <sstream>

namespace msa {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF8E4M3: return "float8_e4m3fn";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
    default: return "unknown";
  }
}

std::string dtype_name(DLDataType t) {
  if (t.bits == 0) return "unknown";
  const DType known = dtype_from_dl(t);
  if (known != DType::kUnknown) return dtype_name(known);
  // Codes of DLPack 1.1 (numeric: older dlpack.h releases lack the names past kDLBool).
  const char* kind = nullptr;
  switch (t.code) {
    case 0: kind = "int"; break;
    case 1: kind = "uint"; break;
    case 2: kind = "float"; break;
    case 4: kind = "bfloat"; break;
    case 5: kind = "complex"; break;
    case 6: kind = "bool"; break;
    case 7: kind = "float8_e3m4"; break;
    case 8: kind = "float8_e4m3"; break;
    case 9: kind = "float8_e4m3b11fnuz"; break;
    case 10: kind = "float8_e4m3fn"; break;
    case 11: kind = "float8_e4m3fnuz"; break;
    case 12: kind = "float8_e5m2"; break;
    case 13: kind = "float8_e5m2fnuz"; break;
    case 14: kind = "float8_e8m0fnu"; break;
    case 15: kind = "float6_e2m3fn"; break;
    case 16: kind = "float6_e3m2fn"; break;
    case 17: kind = "float4_e2m1fn"; break;
    default: break;
  }
  const std::string lanes = t.lanes != 1 ? detail::concat("x", t.lanes) : std::string();
  if (kind == nullptr) return detail::concat("(DLPack code ", int(t.code), ", bits ", int(t.bits), ")", lanes);
  if (t.code <= 5) return detail::concat(kind, int(t.bits), lanes);  // int8, float64, complex64: width in the name
  return kind + lanes;
}

int dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kF8E4M3: case DType::kU8: return 1;
    case DType::kI64: return 8;
    default: return 0;
  }
}

DType dtype_from_dl(DLDataType t) {
  if (t.lanes != 1) return DType::kUnknown;
  // Numeric codes rather than enum names: older dlpack.h releases lack the fp8 names.
  switch (t.code) {
    case 2: return t.bits == 32 ? DType::kF32 : t.bits == 16 ? DType::kF16 : DType::kUnknown;  // kDLFloat
    case 4: return t.bits == 16 ? DType::kBF16 : DType::kUnknown;                                // kDLBfloat
    case 10: return t.bits == 8 ? DType::kF8E4M3 : DType::kUnknown;                              // kDLFloat8_e4m3fn
    case 0: return t.bits == 32 ? DType::kI32 : t.bits == 64 ? DType::kI64 : DType::kUnknown;   // kDLInt
    case 1: return t.bits == 8 ? DType::kU8 : DType::kUnknown;                                   // kDLUInt
    default: return DType::kUnknown;
  }
}

DLDataType dtype_to_dl(DType t) {
  switch (t) {
    case DType::kF32: return {2, 32, 1};
    case DType::kF16: return {2, 16, 1};
    case DType::kBF16: return {4, 16, 1};
    case DType::kF8E4M3: return {10, 8, 1};
    case DType::kI32: return {0, 32, 1};
    case DType::kI64: return {0, 64, 1};
    case DType::kU8: return {1, 8, 1};
    default: return {0, 0, 0};
  }
}

std::string device_name(Device d) {
  return d.type == DeviceType::kCUDA ? "cuda:" + std::to_string(d.id) : std::string("cpu");
}

static Device device_from_dl(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: case kDLCUDAHost: return {DeviceType::kCPU, 0};
    case kDLCUDA: case kDLCUDAManaged: return {DeviceType::kCUDA, d.device_id};
    default:
      MSA_FAIL(kType, "msa: tensor on unsupported DLPack device type ", static_cast<int>(d.device_type),
               ": expected CPU or CUDA");
  }
}

TensorView::TensorView(const DLTensor& t) {
  MSA_CHECK(t.ndim >= 0 && t.ndim <= kMaxDims, kValue, "msa: tensor rank ", t.ndim, " not supported (max ",
            kMaxDims, ")");
  init(t.data ? static_cast<char*>(t.data) + t.byte_offset : nullptr, t.dtype, t.ndim, t.shape, t.strides,
       device_from_dl(t.device));
}

TensorView::TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides, Device device) {
  MSA_CHECK(strides.size() == 0 || strides.size() == shape.size(), kValue,
            "msa: TensorView: strides rank ", strides.size(), " != shape rank ", shape.size());
  MSA_CHECK(shape.size() <= size_t(kMaxDims), kValue, "msa: tensor rank ", shape.size(), " not supported");
  init(data, dtype_to_dl(dtype), int(shape.size()), shape.begin(), strides.size() ? strides.begin() : nullptr,
       device);
}

TensorView::TensorView(void* data, DType dtype, int ndim, const int64_t* shape, const int64_t* strides,
                       Device device)
    : TensorView(data, dtype_to_dl(dtype), ndim, shape, strides, device) {}

TensorView::TensorView(void* data, DLDataType dtype, int ndim, const int64_t* shape, const int64_t* strides,
                       Device device) {
  MSA_CHECK(ndim >= 0 && ndim <= kMaxDims, kValue, "msa: tensor rank ", ndim, " not supported");
  init(data, dtype, ndim, shape, strides, device);
}

void TensorView::init(void* data, DLDataType dtype, int ndim, const int64_t* shape, const int64_t* strides,
                      Device device) {
  data_ = data;
  dtype_ = dtype_from_dl(dtype);
  dl_dtype_ = dtype;
  device_ = device;
  ndim_ = ndim;
  // A tensor of no elements addresses no memory, so its strides say nothing; exporters give such tensors any
  // strides (numpy 2 gives (0, ..., 0), which torch.from_numpy keeps), and the layout checks would refuse them.
  // It gets the row-major strides of its shape.
  bool empty = false;
  for (int i = 0; i < ndim; ++i) empty = empty || shape[i] == 0;
  int64_t running = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    shape_[i] = shape[i];
    strides_[i] = strides && !empty ? strides[i] : running;
    running *= shape[i] > 0 ? shape[i] : 1;
  }
  present_ = true;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t running = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != running) return false;
    running *= shape_[i];
  }
  return true;
}

static std::string join(const int64_t* v, int n) {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}

std::string TensorView::shape_str() const { return join(shape_.data(), ndim_); }
std::string TensorView::strides_str() const { return join(strides_.data(), ndim_); }

TensorView TensorView::restrided(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) const {
  TensorView t(data_, dtype_, shape, strides, device_);
  return t;
}

}  // namespace msa
