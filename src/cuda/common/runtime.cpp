// The CUDA runtime questions the API asks: is there a GPU, where does a pointer live, and the
// blocking convenience call behind mamba2ssd::forward().
#include <cuda_runtime_api.h>

#include <string>

#include "api/internal.h"
#include "cuda/common/check.h"

namespace mamba2ssd {

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

bool is_device_pointer(const void* ptr) {
  if (!ptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

namespace detail {

void forward_cuda_blocking(const ForwardParams& p, void* stream) {
  validate(p);
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is available");
  const std::size_t bytes = cuda_workspace_bytes(p);
  void* workspace = nullptr;
  cuda_check(cudaMalloc(&workspace, bytes == 0 ? 1 : bytes), "cudaMalloc(workspace)");
  try {
    forward_cuda(p, workspace, bytes, stream);
    cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  } catch (...) {
    cudaFree(workspace);
    throw;
  }
  cuda_check(cudaFree(workspace), "cudaFree(workspace)");
}

}  // namespace detail
}  // namespace mamba2ssd
