// The CUDA kernel of mamba2ssd::prefill: device guard, the caller's current stream, a workspace from
// PyTorch's caching allocator, then mamba2ssd::prefill_cuda. No host synchronization (prefill_cuda
// reads no slot or cu_seqlens entry on the host), so the op can be captured in a CUDA graph.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "prefill.h"

namespace mamba2ssd::binding {
namespace {

void prefill_cuda_kernel(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                         const at::Tensor& B, const at::Tensor& C, int64_t chunk_size, const at::Tensor& cu_seqlens,
                         const std::optional<at::Tensor>& seq_idx, const std::optional<at::Tensor>& D,
                         const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                         bool dt_softplus, double dt_min, double dt_max, const at::Tensor& slots,
                         const std::optional<at::Tensor>& has_initial_state, int64_t pad_slot_id,
                         const at::Tensor& out, int64_t state_every,
                         const std::optional<at::Tensor>& intermediate_slots) {
  // The dispatcher sends a host state here when another tensor is on a GPU: no guard for it, and
  // prepare_prefill's device check names that tensor (ValueError) before anything runs.
  const c10::cuda::OptionalCUDAGuard guard(state.is_cuda() ? std::optional<c10::Device>(state.device())
                                                           : std::nullopt);
  PrefillCall call = prepare_prefill(state, x, dt, A, B, C, chunk_size, cu_seqlens, seq_idx, D, z, dt_bias,
                                     dt_softplus, dt_min, dt_max, slots, has_initial_state, pad_slot_id, out,
                                     state_every, intermediate_slots);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  prefill_translate_errors([&] {
    // Sized from the token and request counts alone: the same bytes at every replay of a graph.
    const std::size_t bytes = cuda_prefill_workspace_bytes(call.params);
    at::Tensor workspace;
    if (bytes > 0) workspace = at::empty({static_cast<int64_t>(bytes)}, state.options().dtype(at::kByte));
    prefill_cuda(call.params, bytes > 0 ? workspace.data_ptr() : nullptr, bytes, stream);
  });
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_IMPL(mamba2ssd, CUDA, m) { m.impl("prefill", &mamba2ssd::binding::prefill_cuda_kernel); }
