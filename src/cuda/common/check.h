// Every CUDA runtime call goes through cuda_check: a failure becomes a CudaError naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw CudaError(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace mamba2ssd
