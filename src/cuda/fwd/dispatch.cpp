// The one dispatch of the CUDA forward: which path runs a call, and why. The registry lists the
// paths in the order auto tries them; a path asked for by name runs or throws Error with its
// reason. Planning is a pure function of the call and the device, so cuda_workspace_bytes and
// forward_cuda agree. Nothing here synchronizes or allocates: a call can be captured in a graph.
#include <string>

#include "api/internal.h"
#include "cuda/bwd/path.h"
#include "cuda/common/device.h"
#include "cuda/fwd/check_inputs.h"
#include "cuda/fwd/paths.h"

namespace mamba2ssd {
namespace {

using cuda::FwdPath;

// Auto's order: the fastest path first.
const FwdPath* const kRegistry[] = {&cuda::kSm90Path, &cuda::kFusedPath, &cuda::kThreeKernelPath,
                                    &cuda::kCudaTilePath};

const FwdPath& path_of(CudaPath id) {
  for (const FwdPath* path : kRegistry)
    if (path->id == id) return *path;
  throw Error("cuda_path: unknown value " + std::to_string(static_cast<int>(id)));
}

// Whether the states for the backward (saved_states) take a walk of their own after the path:
// asked for, and not saved by the path itself. Its workspace follows the path's.
bool saved_states_walk(const FwdPath& path, const ForwardParams& p) {
  return p.saved_states && !(path.saves_states && path.saves_states(p));
}
std::size_t workspace_total(const FwdPath& path, const cuda::FwdPlan& plan, const ForwardParams& p) {
  return plan.total() + (saved_states_walk(path, p) ? cuda::saved_states_walk_bytes(p) : 0);
}

// The path that runs p; throws Error naming every refusal if none does.
const FwdPath& choose(const ForwardParams& p, const cuda::DeviceInfo& d) {
  if (p.cuda_path != CudaPath::kAuto) {
    const FwdPath& path = path_of(p.cuda_path);
    const std::string why = path.refusal(p, d);
    if (!why.empty()) throw Error(std::string("cuda_path ") + to_string(p.cuda_path) + " cannot run this call: " + why);
    return path;
  }
  std::string reasons;
  for (const FwdPath* path : kRegistry) {
    if (!path->auto_picks) continue;
    const std::string why = path->refusal(p, d);
    if (why.empty()) return *path;
    reasons += std::string(reasons.empty() ? "" : "; ") + to_string(path->id) + ": " + why;
  }
  throw Error("cuda_path auto: no CUDA path runs this call (" + reasons + ")");
}

}  // namespace

CudaExplanation explain_cuda(const ForwardParams& p) {
  detail::refuse_f64(p, "cuda");
  validate(p);
  const cuda::DeviceInfo d = cuda::current_device();
  CudaExplanation e;
  e.requested = p.cuda_path;
  e.device = d.arch() + ", " + std::to_string(d.sm_count) + " SMs";
  e.products = p.dtype != DType::kF32                 ? to_string(p.dtype)
               : p.fp32_math == Fp32Math::kAccurate ? "3xTF32"
                                                    : "TF32";
  for (const FwdPath* path : kRegistry) {
    std::string why = path->refusal(p, d);
    if (why.empty() && p.cuda_path == CudaPath::kAuto && !path->auto_picks) why = "auto never picks it";
    const bool picked = why.empty() && e.chosen == CudaPath::kAuto &&
                        (p.cuda_path == CudaPath::kAuto || p.cuda_path == path->id);
    if (picked) {
      const cuda::FwdPlan plan = path->plan(p, d);
      e.chosen = path->id;
      e.workspace_bytes = workspace_total(*path, plan, p);
      e.plan = plan.describe(e.workspace_bytes);
      if (p.saved_states)
        e.plan += saved_states_walk(*path, p) ? ", the states for the backward saved by a walk of their own after it"
                                              : ", the states for the backward saved by its walk";
    }
    e.paths.push_back({path->id, why});
  }
  return e;
}

std::string CudaExplanation::to_string() const {
  std::string s = std::string("cuda_path ") + mamba2ssd::to_string(requested) + " on " + device + ": ";
  s += chosen == CudaPath::kAuto ? "no path runs this call" : std::string("runs ") + mamba2ssd::to_string(chosen);
  if (chosen != CudaPath::kAuto) s += " (" + plan + "), " + products + " products";
  s += "\n";
  for (const CudaPathVerdict& v : paths)
    s += std::string("  ") + mamba2ssd::to_string(v.path) + ": " + (v.refusal.empty() ? "takes it" : v.refusal) + "\n";
  return s;
}

std::size_t cuda_workspace_bytes(const ForwardParams& p) {
  detail::refuse_f64(p, "cuda");
  validate(p);
  const cuda::DeviceInfo d = cuda::current_device();
  const FwdPath& path = choose(p, d);
  return workspace_total(path, path.plan(p, d), p);
}

void forward_cuda(const ForwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream) {
  detail::refuse_f64(p, "cuda");  // before validate(), whose refusal cannot name the backend
  validate(p);
  const cuda::DeviceInfo d = cuda::current_device();
  const FwdPath& path = choose(p, d);
  const cuda::FwdPlan plan = path.plan(p, d);
  const std::size_t total = workspace_total(path, plan, p);
  if (!workspace) throw Error("workspace is null");
  if (workspace_bytes < total)
    throw Error("workspace_bytes is " + std::to_string(workspace_bytes) + ", needs at least " +
                std::to_string(total) + " (cuda_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) throw Error("workspace must be 256-byte aligned");
  if (p.check_inputs) {
    detail::require_input_status(p);
    cuda::launch_check_inputs(p, static_cast<cudaStream_t>(stream));  // before the path: same stream
  }
  if (!saved_states_walk(path, p)) return path.launch(p, plan, workspace, stream);
  ForwardParams without = p;  // (the path saves nothing; the walk after it does)
  without.saved_states = nullptr;
  path.launch(without, plan, workspace, stream);
  cuda::launch_saved_states_walk(p, static_cast<char*>(workspace) + plan.total(), stream);
}

}  // namespace mamba2ssd
