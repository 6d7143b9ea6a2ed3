// The CUDA backward's entry points: validate, refuse what the kernels do not take (naming the
// backend that does), plan the workspace, launch (after the forward's check kernel in checked
// mode). Head dim 128 runs as twice the heads of 64 where that brings the Hopper kernels
// (head_split.h): the split's copies and sums ahead of the split call's own workspace. Nothing here
// synchronizes or allocates.
#include <string>

#include "api/internal.h"
#include "cuda/bwd/head_split.h"
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

// The call as the kernels run it (split over `workspace`, or p itself) and its plan, which follows
// the split's sections in the workspace (null: planning only). p runs split where it can and the
// split call's plan has the Hopper chunk_grads (which a head dim of 128 never has).
struct Launch {
  cuda::HeadSplit split;
  BackwardParams call;
  cuda::BwdPlan plan;
  std::size_t total() const { return split.bytes + plan.total(); }
};
Launch plan_launch(const BackwardParams& p, void* workspace) {
  if (const cuda::HeadSplit split = cuda::head_split_of(p); split.halves > 1) {
    const BackwardParams q = cuda::split_heads(p, split, workspace);
    if (cuda::backward_refusal(q).empty())
      if (const cuda::BwdPlan plan = cuda::plan_backward(q); plan.sm90_grads) return {split, q, plan};
  }
  return {{}, p, cuda::plan_backward(p)};
}

}  // namespace

std::size_t cuda_backward_workspace_bytes(const BackwardParams& p) {
  detail::refuse_f64(p.fwd, "cuda");  // before validate(), whose refusal cannot name the backend
  validate(p);
  require_runs(p);
  return plan_launch(p, nullptr).total();
}

CudaBackwardExplanation explain_cuda_backward(const BackwardParams& p) {
  detail::refuse_f64(p.fwd, "cuda");
  validate(p);
  require_runs(p);
  const cuda::DeviceInfo d = cuda::current_device();
  const Launch l = plan_launch(p, nullptr);
  const BackwardParams& q = l.call;
  CudaBackwardExplanation e;
  e.device = d.arch() + ", " + std::to_string(d.sm_count) + " SMs";
  e.plan = l.plan.fwd.describe(l.total());  // the chunks and, with the Hopper walks, their segments
  if (l.split.halves > 1)
    e.plan += ", head dim " + std::to_string(p.fwd.headdim) + " as " + std::to_string(q.fwd.nheads) + " heads of " +
              std::to_string(q.fwd.headdim);
  if (p.fwd.saved_states) e.plan += ", the states the forward saved (the adjoint's walk alone)";
  e.workspace_bytes = l.total();
  e.chained = l.plan.chained();
  // The chunk kernels' refusals follow the walks' (16-bit chunk kernels run only behind them).
  const std::string walks = cuda::walks_sm90_refusal(q);
  e.kernels = {{"walks", walks},
               {"chunk_grads", cuda::grads_sm90_refusal(q, walks)},
               {"chunk_dbc", cuda::dbc_sm90_refusal(q, walks)}};
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
  if (!workspace) throw Error("workspace is null");
  const Launch l = plan_launch(p, workspace);
  if (workspace_bytes < l.total())
    throw Error("workspace_bytes is " + std::to_string(workspace_bytes) + ", needs at least " +
                std::to_string(l.total()) + " (cuda_backward_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) throw Error("workspace must be 256-byte aligned");
  if (p.fwd.check_inputs) {  // checked mode, as forward_cuda: the forward's check kernel, same stream
    detail::require_input_status(p.fwd);
    cuda::launch_check_inputs(p.fwd, static_cast<cudaStream_t>(stream));
  }
  if (l.split.halves == 1) return cuda::launch_backward(p, l.plan, workspace, stream);
  cuda::launch_expand_heads(p, l.call, stream);
  cuda::launch_backward(l.call, l.plan, static_cast<char*>(workspace) + l.split.bytes, stream);
  cuda::launch_fold_heads(p, l.call, stream);
}

}  // namespace mamba2ssd
