// The three-kernel path: the seed's design, every feature, sm_80 and newer.
//   chunk_cumsum -> chunk_states_sm80 (the state entering each chunk, to the workspace)
//                -> chunk_outputs_sm80 (y, chunk by chunk in parallel)
//                -> varlen_states_sm80 (each packed sequence's final state, when asked for)
// Chunks of 64 or 128 tokens (a requested 256 runs as 128: the function does not depend on it).
#include <string>

#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/chunk_outputs_sm80.cuh"
#include "cuda/fwd/chunk_states_sm80.cuh"
#include "cuda/fwd/paths.h"
#include "cuda/fwd/varlen_states_sm80.cuh"

namespace mamba2ssd::cuda {
namespace {

// k3xTf32: fp32 products as 3xTF32 (fp32_math accurate).
template <typename T, int kChunk, bool k3xTf32>
void launch_kernels(const FwdArgs& a, cudaStream_t stream) {
  launch_chunk_cumsum<kChunk>(a, stream);
  launch_chunk_states<T, kChunk, k3xTf32>(a, stream);
  launch_chunk_outputs<T, kChunk, k3xTf32>(a, stream);
  launch_varlen_states<T, kChunk, k3xTf32>(a, stream);
}

std::string refusal(const ForwardParams& p, const DeviceInfo&) {
  if (std::string why = grid_refusal(p); !why.empty()) return why;
  return "";
}

FwdPlan plan(const ForwardParams& p, const DeviceInfo&) {
  FwdPlan plan = scan_plan(p, CudaPath::kThreeKernel, p.chunk_size == 64 ? 64 : 128);
  plan.chunk_states =
      (sizeof(float) * p.headdim * p.dstate * p.batch * plan.nchunks * p.nheads + 255) / 256 * 256;
  return plan;
}

void launch_path(const ForwardParams& p, const FwdPlan& plan, void* workspace, void* stream) {
  const FwdArgs a = make_fwd_args(p, plan, workspace);
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype_math(p.dtype, p.fp32_math, [&](auto t, auto three_tf32) {
    using T = decltype(t);
    constexpr bool k3xTf32 = decltype(three_tf32)::value;
    plan.chunk == 64 ? launch_kernels<T, 64, k3xTf32>(a, s) : launch_kernels<T, 128, k3xTf32>(a, s);
  });
}

}  // namespace

const FwdPath kThreeKernelPath = {CudaPath::kThreeKernel, true, nullptr, refusal, plan, launch_path};

}  // namespace mamba2ssd::cuda
