// Every CUDA runtime call goes through cuda_check: a failure becomes a CudaError naming the call, and
// leaves no pending error behind (cudaGetLastError clears what can be cleared), so that the caller's
// next CUDA call, a framework's launch check among them, does not fail for ours.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

}  // namespace mamba2ssd
