// The three-kernel path: the seed's design, every feature, sm_80 and newer.
//   chunk_cumsum -> chunk_states_sm80 (the state entering each chunk, to the workspace)
//                -> chunk_outputs_sm80 (y, chunk by chunk in parallel)
//                -> varlen_states_sm80 (each packed sequence's final state, when asked for)
// Chunks of 64 or 128 tokens (a requested 256 runs as 128: the function does not depend on it; 128
// runs as 64 where its tiles do not fit the GPU's shared memory per block: three_kernel_chunk).
#include <algorithm>
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

// The largest shared memory a block of the path's kernels takes for p at chunk kChunk (chunk states,
// chunk outputs and, where asked for, the varlen states).
template <int kChunk>
int smem_bytes(const ForwardParams& p) {
  return smem_bytes_for(p.dtype, p.headdim, [&](auto t, auto head_dim) {
    using T = decltype(t);
    constexpr int kP = decltype(head_dim)::value;
    return std::max({int{ChunkStatesShape<T, kChunk>::kSmemBytes}, int{ChunkOutputsShape<T, kChunk, kP>::kSmemBytes},
                     p.varlen_states ? int{VarlenStatesShape<T, kChunk, kP>::kSmemBytes} : 0});
  });
}

std::string refusal(const ForwardParams& p, const DeviceInfo& d) {
  if (std::string why = grid_refusal(p); !why.empty()) return why;
  const int64_t chunk = three_kernel_chunk(p, d);
  return smem_refusal(chunk == 64 ? smem_bytes<64>(p) : smem_bytes<128>(p), d,
                      std::string("dtype ") + to_string(p.dtype) + ", head dim " + std::to_string(p.headdim) +
                          ", chunk " + std::to_string(chunk));
}

FwdPlan plan(const ForwardParams& p, const DeviceInfo& d) {
  FwdPlan plan = scan_plan(p, CudaPath::kThreeKernel, three_kernel_chunk(p, d));
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

int64_t three_kernel_chunk(const ForwardParams& p, const DeviceInfo& d) {
  return p.chunk_size == 64 || smem_bytes<128>(p) > d.smem_per_block ? 64 : 128;
}

const FwdPath kThreeKernelPath = {CudaPath::kThreeKernel, true, nullptr, refusal, plan, launch_path};

}  // namespace mamba2ssd::cuda
