// Stand-ins for a build without nvcc: the CUDA backend reports that it is absent.
#include "api/internal.h"

namespace mamba2ssd {

bool cuda_available() { return false; }
bool is_device_pointer(const void*) { return false; }

std::size_t cuda_workspace_bytes(const ForwardParams& p) {
  validate(p);
  return 0;
}

void forward_cuda(const ForwardParams&, void*, std::size_t, void*) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

CudaExplanation explain_cuda(const ForwardParams& p) {
  validate(p);
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

std::size_t cuda_backward_workspace_bytes(const BackwardParams& p) {
  validate(p);
  return 0;
}

void backward_cuda(const BackwardParams&, void*, std::size_t, void*) {
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

CudaBackwardExplanation explain_cuda_backward(const BackwardParams& p) {
  validate(p);
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

void decode_cuda(const DecodeParams& p, void*) {
  validate(p);
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

std::size_t cuda_prefill_workspace_bytes(const PrefillParams& p) {
  validate(p);
  return 0;
}

void prefill_cuda(const PrefillParams& p, void*, std::size_t, void*) {
  validate(p);
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

std::string CudaExplanation::to_string() const { return "this build of mamba2ssd has no CUDA backend\n"; }
std::string CudaBackwardExplanation::to_string() const { return "this build of mamba2ssd has no CUDA backend\n"; }

namespace detail {
void forward_cuda_blocking(const ForwardParams& p, void* stream) { forward_cuda(p, nullptr, 0, stream); }
void backward_cuda_blocking(const BackwardParams& p, void* stream) { backward_cuda(p, nullptr, 0, stream); }
void decode_cuda_blocking(const DecodeParams& p, void* stream) { decode_cuda(p, stream); }
void prefill_cuda_blocking(const PrefillParams& p, void* stream) { prefill_cuda(p, nullptr, 0, stream); }
void set_fused_segments_for_testing(int64_t) {}
void set_prefill_request_groups_for_testing(int64_t) {}
void set_decode_kernel_for_testing(int, int64_t) {}
void refuse_tma_maps_for_testing(bool) {}
void set_portable_backward_for_testing(bool) {}
}  // namespace detail

void conv1d_cuda(const Conv1dParams& p, void*) {
  validate(p);
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

std::size_t cuda_conv1d_backward_workspace_bytes(const Conv1dBackwardParams& p) {
  validate(p);
  return 0;
}

void conv1d_backward_cuda(const Conv1dBackwardParams& p, void*, std::size_t, void*) {
  validate(p);
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

void gated_rmsnorm_cuda(const GatedRmsNormParams& p, void*) {
  validate(p);
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

std::size_t cuda_gated_rmsnorm_backward_workspace_bytes(const GatedRmsNormBackwardParams& p) {
  validate(p);
  return 0;
}

void gated_rmsnorm_backward_cuda(const GatedRmsNormBackwardParams& p, void*, std::size_t, void*) {
  validate(p);
  throw CudaError("backend cuda: this build of mamba2ssd has no CUDA backend (nvcc was not found)");
}

}  // namespace mamba2ssd
