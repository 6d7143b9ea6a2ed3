// The CUDA backward's entry points: validate, refuse what the kernels do not take (naming the
// backend that does), plan the workspace, launch (after the forward's check kernel in checked
// mode). Nothing here synchronizes or allocates.
#include <string>

#include "api/internal.h"
#include "cuda/bwd/kernels_sm90.h"
#include "cuda/bwd/path.h"
#include "cuda/common/device.h"
#include "cuda/fwd/check_inputs.h"

namespace mamba2ssd {
namespace {

void require_runs(const BackwardParams& p) {
  const std::string why = cuda::backward_refusal(p);
  if (!why.empty()) throw Error("backward_cuda cannot run this call: " + why);
}

}  // namespace

std::size_t cuda_backward_workspace_bytes(const BackwardParams& p) {
  detail::refuse_f64(p.fwd, "cuda");  // before validate(), whose refusal cannot name the backend
  validate(p);
  require_runs(p);
  return cuda::plan_backward(p).total();
}

CudaBackwardExplanation explain_cuda_backward(const BackwardParams& p) {
  detail::refuse_f64(p.fwd, "cuda");
  validate(p);
  require_runs(p);
  const cuda::DeviceInfo d = cuda::current_device();
  const cuda::BwdPlan plan = cuda::plan_backward(p);
  CudaBackwardExplanation e;
  e.device = d.arch() + ", " + std::to_string(d.sm_count) + " SMs";
  e.plan = plan.fwd.describe(plan.total());  // the chunks and, with the Hopper walks, their segments
  if (p.fwd.saved_states) e.plan += ", the states the forward saved (the adjoint's walk alone)";
  e.workspace_bytes = plan.total();
  e.chained = plan.chained();
  // The Hopper chunk kernels run only behind the Hopper walks (they read the states those store).
  const std::string walks = cuda::walks_sm90_refusal(p);
  auto behind_walks = [&](const std::string& own) { return walks.empty() ? own : "it runs only behind the Hopper walks"; };
  e.kernels = {{"walks", walks},
               {"chunk_grads", behind_walks(cuda::grads_sm90_refusal(p))},
               {"chunk_dbc", behind_walks(cuda::dbc_sm90_refusal(p))}};
  return e;
}

std::string CudaBackwardExplanation::to_string() const {
  std::string s = "backward_cuda on " + device + ": " + plan + (chained ? ", launches chained" : "") + "\n";
  for (const CudaBackwardKernel& k : kernels)
    s += "  " + k.name + ": " + (k.refusal.empty() ? "Hopper (TMA, wgmma)" : "portable; the Hopper form does not run: " + k.refusal) + "\n";
  return s;
}

void backward_cuda(const BackwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream) {
  detail::refuse_f64(p.fwd, "cuda");
  validate(p);
  require_runs(p);
  const cuda::BwdPlan plan = cuda::plan_backward(p);
  if (!workspace) throw Error("workspace is null");
  if (workspace_bytes < plan.total())
    throw Error("workspace_bytes is " + std::to_string(workspace_bytes) + ", needs at least " +
                std::to_string(plan.total()) + " (cuda_backward_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) throw Error("workspace must be 256-byte aligned");
  if (p.fwd.check_inputs) {  // checked mode, as forward_cuda: the forward's check kernel, same stream
    detail::require_input_status(p.fwd);
    cuda::launch_check_inputs(p.fwd, static_cast<cudaStream_t>(stream));
  }
  cuda::launch_backward(p, plan, workspace, stream);
}

}  // namespace mamba2ssd
