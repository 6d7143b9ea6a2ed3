// cuda_path tile: the seed's three kernels in CUDA Tile C++ (src/cuda_tile), present only in builds
// configured with MAMBA2SSD_TILE=ON. auto never picks it. It lays out its workspace itself.
#include "cuda/fwd/paths.h"

#if MAMBA2SSD_HAVE_TILE
#include "cuda_tile/forward_cuda_tile.h"
#endif

namespace mamba2ssd::cuda {
namespace {

#if MAMBA2SSD_HAVE_TILE
std::string refusal(const ForwardParams& p, const DeviceInfo&) {
  // Its kernels cast fp32 operands to TF32 (src/cuda_tile/ssd_tile.cuh): no 3xTF32 form.
  if (p.dtype == DType::kF32 && p.fp32_math == Fp32Math::kAccurate)
    return "it multiplies fp32 as TF32 only (fp32_math accurate: use cuda_path three-kernel or fused)";
  return cuda_tile::refusal(p);
}
FwdPlan plan(const ForwardParams& p, const DeviceInfo&) {
  FwdPlan plan;
  plan.path = CudaPath::kTile;
  plan.own_layout = cuda_tile::workspace_bytes(p);
  return plan;
}
void launch_path(const ForwardParams& p, const FwdPlan& plan, void* workspace, void* stream) {
  cuda_tile::forward(p, workspace, plan.total(), stream);
}
#else
std::string refusal(const ForwardParams&, const DeviceInfo&) {
  return "this build has no CUDA Tile C++ backend (configure with -DMAMBA2SSD_TILE=ON and a CUDA 13.3+ nvcc; "
         "see docs/tile-cpp.md)";
}
FwdPlan plan(const ForwardParams&, const DeviceInfo&) { return {}; }
void launch_path(const ForwardParams&, const FwdPlan&, void*, void*) {}
#endif

}  // namespace

const FwdPath kCudaTilePath = {CudaPath::kTile, false, nullptr, refusal, plan, launch_path};

}  // namespace mamba2ssd::cuda
