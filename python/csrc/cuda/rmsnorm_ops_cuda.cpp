// The CUDA kernels of mamba2ssd::gated_rmsnorm_fwd and gated_rmsnorm_bwd: device guard, the caller's
// current stream, the backward's workspace from PyTorch's allocator, then the library's
// gated_rmsnorm_cuda and gated_rmsnorm_backward_cuda. No host synchronization.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "rmsnorm.h"

namespace mamba2ssd::binding {
namespace {

// Host y with another tensor on a GPU comes here too: no guard, and prepare_rmsnorm names the tensor.
std::optional<c10::Device> gpu_of(const at::Tensor& y) {
  return y.is_cuda() ? std::optional<c10::Device>(y.device()) : std::nullopt;
}

at::Tensor rmsnorm_fwd_cuda(const at::Tensor& y, const std::optional<at::Tensor>& z, const at::Tensor& weight,
                            int64_t group_size, double eps, bool norm_before_gate) {
  const c10::cuda::OptionalCUDAGuard guard(gpu_of(y));
  RmsNormCall call = prepare_rmsnorm(y, z, weight, group_size, eps, norm_before_gate, nullptr, std::nullopt);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  rmsnorm_translate_errors([&] { gated_rmsnorm_cuda(call.params.fwd, stream); });
  return call.keep.back();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rmsnorm_bwd_cuda(
    const at::Tensor& y, const std::optional<at::Tensor>& z, const at::Tensor& weight, const at::Tensor& dout,
    int64_t group_size, double eps, bool norm_before_gate, const std::optional<at::Tensor>& dz_out) {
  const c10::cuda::OptionalCUDAGuard guard(gpu_of(y));
  RmsNormCall call = prepare_rmsnorm(y, z, weight, group_size, eps, norm_before_gate, &dout, dz_out);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  std::size_t bytes = 0;
  rmsnorm_translate_errors([&] { bytes = cuda_gated_rmsnorm_backward_workspace_bytes(call.params); });
  const at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, y.options().dtype(at::kByte));
  rmsnorm_translate_errors([&] { gated_rmsnorm_backward_cuda(call.params, workspace.data_ptr(), bytes, stream); });
  return backward_outputs(call);
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_IMPL(mamba2ssd, CUDA, m) {
  m.impl("gated_rmsnorm_fwd", &mamba2ssd::binding::rmsnorm_fwd_cuda);
  m.impl("gated_rmsnorm_bwd", &mamba2ssd::binding::rmsnorm_bwd_cuda);
}
