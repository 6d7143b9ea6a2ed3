// The CUDA backward's entry points: validate, refuse what the kernels do not take (naming the
// backend that does), plan the workspace, launch. Nothing here synchronizes or allocates.
#include <string>

#include "api/internal.h"
#include "cuda/bwd/path.h"

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
  cuda::launch_backward(p, plan, workspace, stream);
}

}  // namespace mamba2ssd
