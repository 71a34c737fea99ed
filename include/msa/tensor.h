// Non-owning tensor views over DLPack descriptions.
//
// msa never owns caller memory: every entry point takes TensorViews, which copy the DLTensor's
// pointer, dtype, device, shape and strides (strides in elements, as DLPack has them; a tensor of no
// elements gets row-major strides) and keep nothing else. A default-constructed view is "absent"
// (optional arguments). A view of a dtype msa does not take has dtype() == DType::kUnknown (uint8:
// kU8, which no entry point takes) and keeps the DLPack dtype for the message: the entry point that
// checks the argument's dtype names the argument and the dtypes it takes.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "msa/dlpack.h"
#include "msa/error.h"

namespace msa {

enum class DType : int {
  kUnknown = 0,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8 e4m3fn
  kI32,
  kI64,
  kU8,
};

const char* dtype_name(DType t);
// Any DLPack dtype by name ("float64", "int8", "bool", "float8_e5m2", ...), for messages about tensors
// whose dtype msa does not take.
std::string dtype_name(DLDataType t);
int dtype_bytes(DType t);
DType dtype_from_dl(DLDataType t);
DLDataType dtype_to_dl(DType t);

enum class DeviceType : int { kCPU = 1, kCUDA = 2 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int id = 0;
  bool operator==(const Device& o) const { return type == o.type && id == o.id; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
};
std::string device_name(Device d);

class TensorView {
 public:
  static constexpr int kMaxDims = 6;

  TensorView() = default;
  // From a DLPack description. byte_offset is folded into data(); NULL strides mean row-major.
  explicit TensorView(const DLTensor& t);
  // From raw parts; empty strides mean row-major.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides = {}, Device device = {});
  TensorView(void* data, DType dtype, int ndim, const int64_t* shape, const int64_t* strides,
             Device device = {});
  // Any DLPack dtype (dtype() is kUnknown for those msa does not take).
  TensorView(void* data, DLDataType dtype, int ndim, const int64_t* shape, const int64_t* strides,
             Device device = {});

  bool defined() const { return present_; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  // The dtype's name, also for dtypes msa does not take ("float64").
  std::string dtype_str() const { return dtype_name(dl_dtype_); }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int i) const { return shape_[norm(i)]; }
  int64_t stride(int i) const { return strides_[norm(i)]; }
  int64_t numel() const;
  const int64_t* shape() const { return shape_.data(); }
  const int64_t* strides() const { return strides_.data(); }
  // Row-major with no gaps.
  bool is_contiguous() const;
  // "[2, 3, 4]"
  std::string shape_str() const;
  std::string strides_str() const;

  // A view of the same memory with another shape/strides (no checks beyond rank).
  TensorView restrided(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) const;

 private:
  int norm(int i) const { return i < 0 ? i + ndim_ : i; }
  void init(void* data, DLDataType dtype, int ndim, const int64_t* shape, const int64_t* strides, Device device);

  void* data_ = nullptr;
  bool present_ = false;  // false only for a default-constructed (absent) view
  DType dtype_ = DType::kUnknown;
  DLDataType dl_dtype_{0, 0, 0};
  Device device_{};
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace msa
