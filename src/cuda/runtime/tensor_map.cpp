// Host encoding of TMA tensor maps (see tensor_map.h).
#include "cuda/runtime/tensor_map.h"

#include <cuda_runtime.h>

#include <mutex>
#include <sstream>

#include "msa/error.h"

namespace msa::detail::cuda {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encoder() {
  static EncodeTiled fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    // The signature has not changed since CUDA 12.0.
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiled>(p);
    else
      cudaGetLastError();
  });
  MSA_CHECK(fn != nullptr, kRuntime,
            "msa.attention: the CUDA driver does not provide cuTensorMapEncodeTiled (driver for CUDA 12.0+ needed)");
  return fn;
}

}  // namespace

void encode_tensor_map(CUtensorMap* map, ScalarType dtype, int rank, const void* base, const uint64_t* dims,
                       const uint64_t* strides_bytes, const uint32_t* box, const char* what) {
  const CUtensorMapDataType type =
      dtype == ScalarType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  cuuint64_t d[5];
  cuuint64_t s[4];
  cuuint32_t b[5], e[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    e[i] = 1;
    if (i + 1 < rank) s[i] = strides_bytes[i];
  }
  const CUresult r = encoder()(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, s, b, e,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::ostringstream os;
    os << "msa.attention: cuTensorMapEncodeTiled rejected the " << what << " tensor map (CUresult " << int(r)
       << "): dims [";
    for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << dims[i];
    os << "], byte strides [";
    for (int i = 0; i + 1 < rank; ++i) os << (i ? ", " : "") << strides_bytes[i];
    os << "], box [";
    for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << box[i];
    os << "], base " << base;
    MSA_FAIL(kRuntime, os.str());
  }
}

}  // namespace msa::detail::cuda
