// CUDA error checking for host code of the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include "msa/error.h"

#define MSA_CUDA_CHECK(expr)                                                                       \
  do {                                                                                             \
    cudaError_t msa_err_ = (expr);                                                                 \
    if (msa_err_ != cudaSuccess)                                                                   \
      MSA_FAIL(kRuntime, "msa: CUDA error ", cudaGetErrorName(msa_err_), " (", cudaGetErrorString(msa_err_), \
               ") at ", __FILE__, ":", __LINE__, " in ", #expr);                                   \
  } while (0)

// After a launch: configuration errors surface here; asynchronous faults at the next sync.
#define MSA_CUDA_CHECK_LAUNCH() MSA_CUDA_CHECK(cudaGetLastError())
