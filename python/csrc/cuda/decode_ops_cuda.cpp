// The CUDA kernel of mamba2ssd::selective_state_update: device guard, the caller's current stream,
// then mamba2ssd::decode_cuda. No allocation beyond prepare_decode's conversions of the small
// inputs, no host synchronization: the op can be captured in a CUDA graph.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "decode.h"

namespace mamba2ssd::binding {
namespace {

void selective_state_update_cuda(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                 const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                 const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                                 bool dt_softplus, double dt_min, double dt_max,
                                 const std::optional<at::Tensor>& state_batch_indices,
                                 const std::optional<at::Tensor>& dst_state_batch_indices, int64_t pad_slot_id,
                                 const at::Tensor& out) {
  // The dispatcher sends a host state here when another tensor is on a GPU: no guard for it, and
  // prepare_decode's device check names that tensor (ValueError) before anything runs.
  const c10::cuda::OptionalCUDAGuard guard(state.is_cuda() ? std::optional<c10::Device>(state.device())
                                                           : std::nullopt);
  DecodeCall call = prepare_decode(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max,
                                   state_batch_indices, dst_state_batch_indices, pad_slot_id, out);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  decode_translate_errors([&] { decode_cuda(call.params, stream); });
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_IMPL(mamba2ssd, CUDA, m) {
  m.impl("selective_state_update", &mamba2ssd::binding::selective_state_update_cuda);
}
