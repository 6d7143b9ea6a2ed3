// The CUDA runtime questions the API asks: is there a GPU, where does a pointer live, and the
// blocking convenience calls behind mamba2ssd::forward() and backward().
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

// Checked mode in a blocking call, forward or backward: the call synchronizes anyway, so it reads
// the status itself and throws Error naming the first bad entry, from the caller's input_status or,
// when there is none, from a zeroed one of its own. run() makes the call with `status` set.
template <typename Run>
void run_checked(int64_t*& status, void* stream, Run&& run) {
  const std::size_t status_bytes = sizeof(int64_t) * kInputStatusWords;
  int64_t* own = nullptr;
  int64_t host[kInputStatusWords] = {};
  try {
    if (!status) {
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&own), status_bytes), "cudaMalloc(input_status)");
      status = own;
      cuda_check(cudaMemsetAsync(own, 0, status_bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync(input_status)");
    }
    run();
    cuda_check(cudaMemcpy(host, status, status_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(input_status)");
  } catch (...) {
    cudaFree(own);
    throw;
  }
  cuda_check(cudaFree(own), "cudaFree(input_status)");
  check_input_status(host);
}

}  // namespace

void forward_cuda_blocking(const ForwardParams& p, void* stream) {
  validate(p);
  ForwardParams q = p;
  auto run = [&] {
    run_blocking(cuda_workspace_bytes(q), stream, [&](void* ws, std::size_t bytes) { forward_cuda(q, ws, bytes, stream); });
  };
  if (q.check_inputs) run_checked(q.input_status, stream, run);
  else run();
}

void backward_cuda_blocking(const BackwardParams& p, void* stream) {
  validate(p);
  BackwardParams q = p;
  auto run = [&] {
    run_blocking(cuda_backward_workspace_bytes(q), stream,
                 [&](void* ws, std::size_t bytes) { backward_cuda(q, ws, bytes, stream); });
  };
  if (q.fwd.check_inputs) run_checked(q.fwd.input_status, stream, run);
  else run();
}

void prefill_cuda_blocking(const PrefillParams& p, void* stream) {
  validate(p);
  // Before the plan, whose refusal of host memory would otherwise hide that there is no GPU at all.
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is available");
  PrefillParams q = p;
  auto run = [&] {
    run_blocking(cuda_prefill_workspace_bytes(q), stream,
                 [&](void* ws, std::size_t bytes) { prefill_cuda(q, ws, bytes, stream); });
  };
  if (q.fwd.check_inputs) run_checked(q.fwd.input_status, stream, run);
  else run();
}

}  // namespace detail
}  // namespace mamba2ssd
