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
  if (!p.check_inputs) {
    run_blocking(cuda_workspace_bytes(p), stream, [&](void* ws, std::size_t bytes) { forward_cuda(p, ws, bytes, stream); });
    return;
  }
  // Checked mode: this call synchronizes anyway, so it reads the status itself and throws Error
  // naming the first bad entry (from the caller's input_status, or from a zeroed one of its own).
  const std::size_t status_bytes = sizeof(int64_t) * kInputStatusWords;
  ForwardParams q = p;
  int64_t* own = nullptr;
  int64_t status[kInputStatusWords] = {};
  try {
    if (!q.input_status) {
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&own), status_bytes), "cudaMalloc(input_status)");
      q.input_status = own;
      cuda_check(cudaMemsetAsync(own, 0, status_bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync(input_status)");
    }
    run_blocking(cuda_workspace_bytes(q), stream, [&](void* ws, std::size_t bytes) { forward_cuda(q, ws, bytes, stream); });
    cuda_check(cudaMemcpy(status, q.input_status, status_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(input_status)");
  } catch (...) {
    cudaFree(own);
    throw;
  }
  cuda_check(cudaFree(own), "cudaFree(input_status)");
  check_input_status(status);
}

void backward_cuda_blocking(const BackwardParams& p, void* stream) {
  validate(p);
  run_blocking(cuda_backward_workspace_bytes(p), stream,
               [&](void* ws, std::size_t bytes) { backward_cuda(p, ws, bytes, stream); });
}

}  // namespace detail
}  // namespace mamba2ssd
