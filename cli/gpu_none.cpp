// The CLI's CUDA half in a build without CUDA: no device, and asking for one is an error.
#include "execute.h"

namespace mamba2ssd::cli::gpu {

std::string device_name() { return ""; }

Execution execute(const testing::HostProblem&, int, int) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

DecodeExecution execute_decode(const testing::HostDecodeProblem&, int, int, double) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

PrefillExecution execute_prefill(testing::HostPrefillProblem&, int, int, CudaPath) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

BackwardExecution execute_backward(const testing::BackwardProblem&, int, int) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

Execution execute_exact(const testing::HostProblem&, int, int) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

std::vector<testing::WayResult> consistency_ways(const testing::ConsistencyConfig&, const testing::HostProblem&) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

std::vector<CudaPath> paths_taking(const testing::HostProblem&) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

std::string hopper_prefill_refusal(const testing::HostPrefillProblem&) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

Floor measure_floor() {
  Floor f;
  f.copy_error = f.matmul_error = "this build of mamba2ssd has no CUDA backend";
  return f;
}

}  // namespace mamba2ssd::cli::gpu
