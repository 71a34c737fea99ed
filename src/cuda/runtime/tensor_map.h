// TMA tensor maps, encoded on the host at run time (a pure host call, ~1 us) and passed to the
// kernels as __grid_constant__ parameters. The driver's cuTensorMapEncodeTiled is reached through
// cudaGetDriverEntryPointByVersion: the library does not link libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/params.h"

namespace msa::detail::cuda {

// Tiled map over a tensor of `rank` dims (innermost first): dims in elements, strides in bytes for
// dims 1..rank-1 (multiples of 16), box in elements; 128-byte swizzle, zero fill outside the tensor.
// Throws msa::Error naming `what` when the driver rejects the description.
void encode_tensor_map(CUtensorMap* map, ScalarType dtype, int rank, const void* base, const uint64_t* dims,
                       const uint64_t* strides_bytes, const uint32_t* box, const char* what);

}  // namespace msa::detail::cuda
