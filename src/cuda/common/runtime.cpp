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
namespace {

// Runs `run(workspace, bytes)` with a workspace of `bytes` it allocates, synchronizes the stream, frees.
template <typename Run>
void run_blocking(std::size_t bytes, void* stream, Run&& run) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is available");
  void* workspace = nullptr;
  cuda_check(cudaMalloc(&workspace, bytes == 0 ? 1 : bytes), "cudaMalloc(workspace)");
  try {
    run(workspace, bytes);
    cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  } catch (...) {
    cudaFree(workspace);
    throw;
  }
  cuda_check(cudaFree(workspace), "cudaFree(workspace)");
}

}  // namespace

void forward_cuda_blocking(const ForwardParams& p, void* stream) {
  validate(p);
  run_blocking(cuda_workspace_bytes(p), stream, [&](void* ws, std::size_t bytes) { forward_cuda(p, ws, bytes, stream); });
}

void backward_cuda_blocking(const BackwardParams& p, void* stream) {
  validate(p);
  run_blocking(cuda_backward_workspace_bytes(p), stream,
               [&](void* ws, std::size_t bytes) { backward_cuda(p, ws, bytes, stream); });
}

}  // namespace detail
}  // namespace mamba2ssd
