// The CUDA kernel of mamba2ssd::chunk_scan_fwd: device guard, the caller's current stream, a workspace
// from PyTorch's caching allocator, then mamba2ssd::forward_cuda. No host synchronization, so the op
// can be captured in a CUDA graph and runs on whatever stream the caller made current.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "chunk_scan.h"

namespace mamba2ssd::binding {
namespace {

void run_cuda(Call& call) {
  // prepare() has checked that every tensor is on one device, the outputs' (x's) device.
  const c10::cuda::CUDAGuard guard(call.y.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  translate_errors([&] {
    const std::size_t bytes = cuda_workspace_bytes(call.params);
    at::Tensor workspace;
    if (bytes > 0) workspace = at::empty({static_cast<int64_t>(bytes)}, call.y.options().dtype(at::kByte));
    forward_cuda(call.params, bytes > 0 ? workspace.data_ptr() : nullptr, bytes, stream);
  });
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_IMPL(mamba2ssd, CUDA, m) {
  m.impl("chunk_scan_fwd", &mamba2ssd::binding::chunk_scan_fwd<mamba2ssd::binding::run_cuda>);
}
