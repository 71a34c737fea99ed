// DLPack tensor description (the data-interchange ABI shared by numpy, torch, cupy, jax, ...).
//
// If the real <dlpack/dlpack.h> is on the include path it is used; otherwise this header declares
// the subset of the DLPack ABI that msa reads (DLDevice, DLDataType, DLTensor), with the same
// names, field order and enum values, so both spellings are interchangeable.
#pragma once

#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#else
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLCUDAManaged = 13,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLBfloat = 4U,
  kDLBool = 6U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e5m2 = 12U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL means compact row-major
  uint64_t byte_offset;
} DLTensor;

#ifdef __cplusplus
}  // extern "C"
#endif
#endif
