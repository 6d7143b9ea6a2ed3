// The CUDA kernels of mamba2ssd::causal_conv1d_fwd and causal_conv1d_bwd: device guard, the caller's
// current stream, the backward's workspace from PyTorch's allocator, then the library's conv1d_cuda
// and conv1d_backward_cuda. No host synchronization: the ops can be captured in a CUDA graph.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "conv1d.h"

namespace mamba2ssd::binding {
namespace {

// The dispatcher sends host x here when another tensor is on a GPU: no guard for it, and
// prepare_conv1d's device check names that tensor (ValueError) before anything runs.
std::optional<c10::Device> gpu_of(const at::Tensor& x) {
  return x.is_cuda() ? std::optional<c10::Device>(x.device()) : std::nullopt;
}

at::Tensor conv1d_fwd_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           const std::optional<at::Tensor>& seq_idx, bool silu) {
  const c10::cuda::OptionalCUDAGuard guard(gpu_of(x));
  Conv1dCall call = prepare_conv1d(x, weight, bias, seq_idx, silu, nullptr, false, std::nullopt);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  conv1d_translate_errors([&] { conv1d_cuda(call.params.fwd, stream); });
  return call.keep.back();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv1d_bwd_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                               const std::optional<at::Tensor>& bias,
                                                               const std::optional<at::Tensor>& seq_idx,
                                                               const at::Tensor& dout, bool silu, bool bias_grad,
                                                               const std::optional<at::Tensor>& dx_out) {
  const c10::cuda::OptionalCUDAGuard guard(gpu_of(x));
  Conv1dCall call = prepare_conv1d(x, weight, bias, seq_idx, silu, &dout, bias_grad, dx_out);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  std::size_t bytes = 0;
  conv1d_translate_errors([&] { bytes = cuda_conv1d_backward_workspace_bytes(call.params); });
  const at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, x.options().dtype(at::kByte));
  conv1d_translate_errors([&] { conv1d_backward_cuda(call.params, workspace.data_ptr(), bytes, stream); });
  const std::size_t n = call.keep.size();
  return {call.keep[n - 3], call.keep[n - 2], call.keep[n - 1]};
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_IMPL(mamba2ssd, CUDA, m) {
  m.impl("causal_conv1d_fwd", &mamba2ssd::binding::conv1d_fwd_cuda);
  m.impl("causal_conv1d_bwd", &mamba2ssd::binding::conv1d_bwd_cuda);
}
