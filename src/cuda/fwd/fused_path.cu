// The fused path (sm_80 and newer): the state never goes to memory between chunks. Every head dim
// (a block per 64 columns of it), state size up to 128; chunks of 128 tokens.
//   chunk_cumsum -> segment_ends_sm80 (each segment's end state from zero; with several segments)
//                -> segment_entries   (the state entering each segment)
//                -> segment_scan_sm80 (every segment walked from its entry state: y, final states)
//                -> varlen_states_sm80 (each packed sequence's final state, when asked for)
#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/paths.h"
#include "cuda/fwd/segment_entries.cuh"
#include "cuda/fwd/segment_scan_sm80.cuh"
#include "cuda/fwd/varlen_states_sm80.cuh"

namespace mamba2ssd::cuda {

namespace {

// k3xTf32: fp32 products as 3xTF32 (fp32_math accurate); kTiled: the head dim as 64-column tiles.
template <typename T, int kN, bool k3xTf32, bool kTiled>
void launch_kernels(const FwdArgs& a, cudaStream_t stream) {
  using Shape = SegmentScanShape<T, kN>;
  launch_chunk_cumsum<Shape::kChunk>(a, stream);
  auto walk = [&](auto kernel, const char* name, int64_t segments) {  // (walk_block reads the x index)
    allow_smem(kernel, Shape::kSmemBytes);
    launch(kernel, name,
           dim3(static_cast<unsigned>(segments * a.seg.ptiles), static_cast<unsigned>(a.geo.nheads),
                static_cast<unsigned>(a.geo.batch)),
           Shape::kThreads, Shape::kSmemBytes, stream, a);
  };
  if (a.seg.count > 1) {
    walk(segment_ends_sm80_kernel<T, kN, k3xTf32, kTiled>, "segment_ends_sm80_kernel", a.seg.count - 1);
    launch_segment_entries<kN>(a, stream, false);
  }
  if (a.scan.carry) walk(segment_scan_sm80_kernel<T, kN, true, k3xTf32, kTiled>, "segment_scan_sm80_kernel", a.seg.count);
  else walk(segment_scan_sm80_kernel<T, kN, false, k3xTf32, kTiled>, "segment_scan_sm80_kernel", a.seg.count);
  launch_varlen_states<T, Shape::kChunk, k3xTf32>(a, stream);
}

// The largest shared memory a block of the path's kernels takes for p (the walks' tiles; the varlen
// states' kernel where asked for): 120-123 KiB at state size 64, 192-203 KiB at 128 (fp32 the more).
int smem_bytes(const ForwardParams& p) {
  return smem_bytes_for(p.dtype, p.headdim, [&](auto t, auto head_dim) {
    using T = decltype(t);
    constexpr int kP = decltype(head_dim)::value, kChunk = SegmentScanShape<T, 64>::kChunk;
    const int walk = fused_state_cols(p.dstate) == 64 ? SegmentScanShape<T, 64>::kSmemBytes
                                                       : SegmentScanShape<T, 128>::kSmemBytes;
    return std::max(walk, p.varlen_states ? int{VarlenStatesShape<T, kChunk, kP>::kSmemBytes} : 0);
  });
}

std::string refusal(const ForwardParams& p, const DeviceInfo& d) {
  if (p.dstate > 128) return "it needs state size at most 128 (dstate " + std::to_string(p.dstate) + ")";
  if (std::string why = grid_refusal(p); !why.empty()) return why;
  return smem_refusal(smem_bytes(p), d,
                      std::string("dtype ") + to_string(p.dtype) + ", state size " + std::to_string(p.dstate));
}

FwdPlan plan(const ForwardParams& p, const DeviceInfo& d) {
  FwdPlan plan = scan_plan(p, CudaPath::kFused, 128);
  plan_segments(plan, p, d.sm_count);  // one block per multiprocessor
  return plan;
}

void launch_path(const ForwardParams& p, const FwdPlan& plan, void* workspace, void* stream) {
  const FwdArgs a = make_fwd_args(p, plan, workspace);
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype_math(p.dtype, p.fp32_math, [&](auto t, auto three_tf32) {
    using T = decltype(t);
    constexpr bool k3xTf32 = decltype(three_tf32)::value;
    auto go = [&](auto tiled) {
      constexpr bool kTiled = decltype(tiled)::value;
      fused_state_cols(p.dstate) == 64 ? launch_kernels<T, 64, k3xTf32, kTiled>(a, s)
                                       : launch_kernels<T, 128, k3xTf32, kTiled>(a, s);
    };
    // The column-tile form for every head dim but 64 (kernels of their own: segment_walk_sm80).
    p.headdim == kWalkPCols ? go(std::false_type{}) : go(std::true_type{});
  });
}

}  // namespace

const FwdPath kFusedPath = {CudaPath::kFused, true, nullptr, refusal, plan, launch_path};

}  // namespace mamba2ssd::cuda
