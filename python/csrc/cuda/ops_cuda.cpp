// The CUDA kernels of mamba2ssd::chunk_scan_fwd and chunk_scan_bwd: device guard, the caller's current
// stream, a workspace from PyTorch's caching allocator, then mamba2ssd::forward_cuda / backward_cuda.
// No host synchronization, so the ops can be captured in a CUDA graph and run on whatever stream the
// caller made current; the one exception is check_inputs (forward or backward) outside capture,
// which synchronizes to read the check's status and raise.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "chunk_scan.h"

namespace mamba2ssd::binding {
namespace {

// Whether the stream is being captured into a CUDA graph (torch.cuda.graph, torch.compile's
// mode="reduce-overhead"): then nothing may synchronize.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Checked mode, forward or backward: a fresh zeroed status per call (so no earlier call's failure
// is reported), from PyTorch's allocator on the current stream like the workspace. attach() before
// the call, raise_if_bad() after it: the one host sync of checked mode, and only outside capture;
// during capture the check kernel is recorded into the graph, but nothing reads its status
// (docs/reliability.md).
struct CheckedStatus {
  at::Tensor status;
  void attach(ForwardParams& p, const at::Tensor& like) {
    if (!p.check_inputs) return;
    status = at::zeros({kInputStatusWords}, like.options().dtype(at::kLong));
    p.input_status = status.data_ptr<int64_t>();
  }
  void raise_if_bad(cudaStream_t stream) const {
    if (!status.defined() || capturing(stream)) return;
    const at::Tensor host = status.to(at::kCPU);  // a blocking copy on the current stream
    check_input_status(host.data_ptr<int64_t>());  // Error (-> ValueError) naming the first bad entry
  }
};

void run_cuda(Call& call) {
  // prepare() has checked that every tensor is on one device, the outputs' (x's) device.
  const c10::cuda::CUDAGuard guard(call.y.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  CheckedStatus checked;
  checked.attach(call.params, call.y);
  translate_errors([&] {
    const std::size_t bytes = cuda_workspace_bytes(call.params);
    at::Tensor workspace;
    if (bytes > 0) workspace = at::empty({static_cast<int64_t>(bytes)}, call.y.options().dtype(at::kByte));
    forward_cuda(call.params, bytes > 0 ? workspace.data_ptr() : nullptr, bytes, stream);
    checked.raise_if_bad(stream);
  });
}

// The backward likewise: gradients and workspace from PyTorch's allocator on x's device, then
// backward_cuda on the current stream (checked as the forward). It refuses what it does not take
// with an Error that reaches the user as a ValueError (never a gradient dropped).
void run_cuda_backward(BwdCall& call) {
  const c10::cuda::CUDAGuard guard(call.dx.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  CheckedStatus checked;
  checked.attach(call.params.fwd, call.dx);
  translate_errors(
      [&] {
        const std::size_t bytes = cuda_backward_workspace_bytes(call.params);
        at::Tensor workspace;
        if (bytes > 0) workspace = at::empty({static_cast<int64_t>(bytes)}, call.dx.options().dtype(at::kByte));
        backward_cuda(call.params, bytes > 0 ? workspace.data_ptr() : nullptr, bytes, stream);
        checked.raise_if_bad(stream);
      },
      "backward: ");
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_IMPL(mamba2ssd, CUDA, m) {
  m.impl("chunk_scan_fwd", &mamba2ssd::binding::chunk_scan_fwd<mamba2ssd::binding::run_cuda>);
  m.impl("chunk_scan_bwd", &mamba2ssd::binding::chunk_scan_bwd<mamba2ssd::binding::run_cuda_backward>);
  m.impl("chunk_scan_bwd_into", &mamba2ssd::binding::chunk_scan_bwd_into<mamba2ssd::binding::run_cuda_backward>);
}
