// The portable CUDA backward (sm_80 and newer, every feature but dvarlen_states), chunks of 64:
//   chunk_cumsum -> chunk_walks_sm80: in one launch, the forward's walk (the state entering each
//                   chunk, recomputed) and the adjoint's (the adjoint of the state leaving each
//                   chunk; dinitial_states); on Hopper the same walks by TMA and wgmma (fp32 on
//                   TF32), in segments (kernels_sm90.cu), wherever they take the call
//                -> chunk_grads_sm80 (dx, dz, ddt, and the parts of dA, dD, ddt_bias; M for dB, dC);
//                   on Hopper the same on TMA and wgmma (chunk_grads_sm90, fp32 on TF32) wherever
//                   it takes the call
//                -> chunk_dbc_sm80 (dB, dC: a group's heads summed in the block); on Hopper the same
//                   on TMA and wgmma (chunk_dbc_sm90) wherever it takes the call
//                -> head_sums (dA, dD, ddt_bias)
// No atomics anywhere: every sum runs in a fixed order, so reruns give the same bits.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/bwd/args.cuh"
#include "cuda/bwd/chunk_dbc_sm80.cuh"
#include "cuda/bwd/chunk_dstates_sm80.cuh"
#include "cuda/bwd/chunk_grads_sm80.cuh"
#include "cuda/bwd/head_sums.cuh"
#include "cuda/bwd/kernels_sm90.h"
#include "cuda/bwd/path.h"
#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/common/device.h"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/chunk_states_sm80.cuh"

namespace mamba2ssd::cuda {
namespace {

// The forward's inputs of the call, its outputs dropped: the backward neither reads nor writes them
// (saved_states, which it reads, stays).
ForwardParams inputs_only(const ForwardParams& f) {
  ForwardParams g = f;
  g.y = nullptr, g.final_states = nullptr, g.varlen_states = nullptr;
  return g;
}

// chunk_dbc's wide block (128 state columns, eight warps) for 16-bit inputs with a state above 64.
bool dbc_wide(const ForwardParams& p) { return dtype_size(p.dtype) == 2 && p.dstate > 64; }

// The state columns of one chunk_dbc block (the grid's y is groups x column blocks).
int64_t dbc_block_cols(const ForwardParams& p) {
  if (dbc_wide(p)) return ChunkDbcShape<__half, 64, true>::kNBlock;
  int64_t cols = 0;
  dispatch_dtype(p.dtype, [&](auto t) { cols = ChunkDbcShape<decltype(t), 64>::kNBlock; });
  return cols;
}

// chunk_dbc's grid in y: every group's column blocks (the refusal and the launch count them alike).
int64_t dbc_grid_y(const ForwardParams& p) {
  const int64_t cols = dbc_block_cols(p);
  return p.ngroups * ((p.dstate + cols - 1) / cols);
}

// The largest shared memory of the backward's kernels for p's dtype and head dim.
int smem_bytes(const BackwardParams& p) {
  return smem_bytes_for(p.fwd.dtype, p.fwd.headdim, [&](auto t, auto head_dim) {
    using T = decltype(t);
    constexpr int P = decltype(head_dim)::value;
    const bool z = p.fwd.z != nullptr;
    int bytes = std::max({ChunkGradsShape<T, P>::smem_bytes(z), ChunkDbcShape<T, P>::smem_bytes(z),
                          int{ChunkWalksShape<T>::kSmemBytes}});
    if constexpr (sizeof(T) == 2)
      if (dbc_wide(p.fwd)) bytes = std::max(bytes, ChunkDbcShape<T, P, true>::smem_bytes(z));
    return bytes;
  });
}

BwdArgs make_bwd_args(const BackwardParams& p, const BwdPlan& plan, void* workspace) {
  const ForwardParams& f = p.fwd;
  BwdArgs a{};
  static_cast<FwdArgs&>(a) = make_fwd_args(inputs_only(f), plan.fwd, workspace);
  const int64_t e = static_cast<int64_t>(dtype_size(f.dtype));
  auto aligned4 = [&](const void* ptr, const Strides4& s) {
    return tile::aligned16(ptr, s.s0, e) && tile::aligned16(ptr, s.s1, e) && tile::aligned16(ptr, s.s2, e);
  };
  auto pairs = [&](const void* ptr, const Strides4& s) {
    return reinterpret_cast<uintptr_t>(ptr) % (2 * e) == 0 && s.s0 % 2 == 0 && s.s1 % 2 == 0 && s.s2 % 2 == 0;
  };
  a.grad = {p.dout, p.dout_stride, p.dfinal_states, p.dfinal_states_stride, p.dx, p.dx_stride, p.ddt, p.ddt_stride,
            p.dA, p.dB, p.dB_stride, p.dC, p.dC_stride, p.dD, p.dz, p.dz_stride, p.ddt_bias,
            p.dinitial_states, p.dinitial_states_stride,
            aligned4(p.dout, p.dout_stride), f.z != nullptr && aligned4(f.z, f.z_stride),
            pairs(p.dx, p.dx_stride), p.dz && pairs(p.dz, p.dz_stride), pairs(p.dB, p.dB_stride),
            pairs(p.dC, p.dC_stride)};
  if (f.saved_states) a.chunk_states = static_cast<float*>(f.saved_states);  // (stored as T, as the walk's)
  char* next = static_cast<char*>(workspace) + plan.fwd.total();
  auto take = [&next](std::size_t bytes) {
    char* at = next;
    next += bytes;
    return at;
  };
  a.work.dstates = take(plan.dstates);
  a.work.intra = take(plan.intra);
  a.work.dA = reinterpret_cast<float*>(take(plan.dA));
  a.work.ddt_bias = reinterpret_cast<float*>(take(plan.ddt_bias));
  a.work.dD = reinterpret_cast<float*>(take(plan.dD));
  if (plan.sm90_walks) {  // each segment's entry over its end (segment_entries reads one before writing it)
    a.seg.entries = a.seg.ends;
    float* adj_ends = reinterpret_cast<float*>(take(plan.adj_ends));
    a.adj = {a.seg.count, a.seg.chunks, a.seg.ptiles, adj_ends, adj_ends, reinterpret_cast<float*>(take(plan.adj_decay))};
  }
  return a;
}

template <typename T, int kHeadDim>
void launch_kernels(const BackwardParams& p, const BwdPlan& plan, const BwdArgs& a, cudaStream_t stream) {
  const Geometry& geo = a.geo;
  const bool chained = plan.chained();
  const bool z = p.fwd.z != nullptr;  // chunk_grads and chunk_dbc stage z only with it
  const auto nc = static_cast<unsigned>(a.scan.nchunks), H = static_cast<unsigned>(geo.nheads),
             batch = static_cast<unsigned>(geo.batch);
  launch_chunk_cumsum<kBwdChunk>(a, stream);
  if (plan.sm90_walks) {
    launch_walks_sm90(p, a, stream);
  } else {
    using Shape = ChunkWalksShape<T>;
    auto kernel = chunk_walks_sm80_kernel<T>;
    allow_smem(kernel, Shape::kSmemBytes);
    launch(kernel, "chunk_walks_sm80_kernel", dim3(state_tiles(geo), H, walk_directions(p.fwd) * batch),
           Shape::kThreads, Shape::kSmemBytes, stream, a, chained);
  }
  if (plan.sm90_grads) {
    launch_grads_sm90(p, a, stream, chained);
  } else {
    using Shape = ChunkGradsShape<T, kHeadDim>;
    auto kernel = chunk_grads_sm80_kernel<T, kHeadDim>;
    allow_smem(kernel, Shape::kSmemBytes);
    launch(kernel, "chunk_grads_sm80_kernel", dim3(nc, H, batch), Shape::kThreads, Shape::smem_bytes(z), stream, a,
           chained);
  }
  auto launch_dbc = [&](auto kernel, auto shape, const char* name) {
    using Shape = decltype(shape);
    allow_smem(kernel, Shape::kSmemBytes);
    launch(kernel, name, dim3(nc, static_cast<unsigned>(dbc_grid_y(p.fwd)), batch), Shape::kThreads,
           Shape::smem_bytes(z), stream, a, chained);
  };
  auto launch_narrow_dbc = [&] {
    launch_dbc(chunk_dbc_sm80_kernel<T, kHeadDim>, ChunkDbcShape<T, kHeadDim>{}, "chunk_dbc_sm80_kernel");
  };
  if (plan.sm90_dbc) {
    launch_dbc_sm90(p, a, stream);
  } else if constexpr (sizeof(T) == 2) {  // (the wide block exists for 16-bit inputs only)
    if (dbc_wide(p.fwd))
      launch_dbc(chunk_dbc_wide_sm80_kernel<T, kHeadDim>, ChunkDbcShape<T, kHeadDim, true>{}, "chunk_dbc_wide_sm80_kernel");
    else
      launch_narrow_dbc();
  } else {
    launch_narrow_dbc();
  }
  launch(head_sums_kernel, "head_sums_kernel", dim3(H), kHeadSumsThreads, 0, stream, a, chained);
}

}  // namespace

std::string backward_refusal(const BackwardParams& p) {
  const DeviceInfo d = current_device();  // throws CudaError naming a GPU below sm_80
  const ForwardParams& f = p.fwd;
  if (p.dvarlen_states)
    return "dvarlen_states (gradients through varlen states) is not supported by the CUDA backward yet; "
           "backend cpu takes it";
  if (std::string why = grid_refusal(f); !why.empty()) return why;
  if (walk_directions(f) * f.batch > 65535)  // (the walks' grid z: both directions' batch rows, or the adjoint's)
    return "its walks' grid takes at most " + std::to_string(65535 / walk_directions(f)) + " batch rows" +
           (f.saved_states ? "" : " without saved_states") + " (batch " + std::to_string(f.batch) + ")";
  if (dbc_grid_y(f) > 65535)
    return "its dB/dC grid takes at most 65535 (group, " + std::to_string(dbc_block_cols(f)) + " state columns) pairs (ngroups " +
           std::to_string(f.ngroups) + ", dstate " + std::to_string(f.dstate) + ")";
  const std::string why = smem_refusal(smem_bytes(p), d, std::string("dtype ") + to_string(f.dtype) + ", head dim " +
                                                              std::to_string(f.headdim));
  return why.empty() ? why : why + "; backend cpu takes it";
}

std::size_t saved_states_walk_bytes(const ForwardParams& f) {
  return scan_plan(inputs_only(f), CudaPath::kThreeKernel, kBwdChunk).total();
}

void launch_saved_states_walk(const ForwardParams& f, void* workspace, void* stream) {
  const FwdPlan plan = scan_plan(inputs_only(f), CudaPath::kThreeKernel, kBwdChunk);
  BwdArgs a{};
  static_cast<FwdArgs&>(a) = make_fwd_args(inputs_only(f), plan, workspace);
  a.chunk_states = static_cast<float*>(f.saved_states);  // (stored as T, as the backward's walk stores them)
  a.saved_states = nullptr;  // (walk_row: the forward's walk, on the grid's batch rows)
  const auto s = static_cast<cudaStream_t>(stream);
  launch_chunk_cumsum<kBwdChunk>(a, s);
  dispatch_dtype(f.dtype, [&](auto t) {
    using T = decltype(t);
    using Shape = ChunkWalksShape<T>;
    auto kernel = chunk_walks_sm80_kernel<T>;
    allow_smem(kernel, Shape::kSmemBytes);
    launch(kernel, "chunk_walks_sm80_kernel (saved states)", dim3(state_tiles(a.geo), static_cast<unsigned>(f.nheads),
           static_cast<unsigned>(f.batch)), Shape::kThreads, Shape::kSmemBytes, s, a, false);
  });
}

// The storing walk's pace where its states' stores bind it, from H200 measurements (docs/perf-log.md,
// "Backward b10"): a block's chunk step where latency binds it (the segment-end walk at the headline
// shape: 73 us over 64 chunks, ncu), and DRAM's speed (kDramBytesPerUs). On an H100 (3.35 TB/s)
// DRAM binds sooner than this says, so the plan may keep a segment count too many.
constexpr double kWalkStepUs = 1.14;

FwdPlan walks_sm90_plan(const ForwardParams& p, const DeviceInfo& d) {
  FwdPlan plan = scan_plan(p, CudaPath::kThreeKernel, kBwdChunk);
  // Segments sized so that both directions' blocks (and the state's column parts, walks_sm90_cols)
  // fill the multiprocessors' slots together, but no more of them once the storing walk is bound by DRAM:
  // each step of each block loads x or dout (z on half of them) and stores a state of `cols`
  // columns, so at 80 heads one segment already moves bytes for longer than its steps take
  // (b 1, L 8192, H 80: 8 segments 851 us, one 731 us, for the whole backward).
  // With the states saved by the forward, the adjoint's walk alone, and no more than one wave of its
  // blocks: at b 1, L 8192 and 16384, H 80 the model's 13 segments ran 7% and 4% slower than 3, the
  // wave, on an H100 (docs/perf-log.md, "Backward b20"), as the forward's plan caps its walk.
  const int64_t cols = walks_sm90_cols(p.dtype, p.dstate), parts = fused_state_cols(p.dstate) / cols;
  const int64_t walks = walk_directions(p) * parts;
  const double step_bytes = static_cast<double>(dtype_size(p.dtype)) * kBwdChunk * (kWalkPCols + cols + (p.z ? kWalkPCols / 2 : 0));
  const double steps = static_cast<double>(walks * p.batch * p.nheads * walk_ptiles(p.headdim) * plan.nchunks);
  const double floor = steps * step_bytes / kDramBytesPerUs / kWalkStepUs;
  const int64_t slots = std::max<int64_t>(1, d.sm_count * kSm90BlocksPerSm / walks);
  SegmentModel model;
  model.max_blocks = p.saved_states ? slots : 0, model.floor = floor, model.step_us = kWalkStepUs;
  plan_segments(plan, inputs_only(p), slots, model);
  plan.seg_entries = 0;  // over the ends
  return plan;
}

BwdPlan plan_backward(const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  BwdPlan plan;
  const std::string walks = walks_sm90_refusal(p);
  plan.sm90_walks = walks.empty();
  plan.fwd = plan.sm90_walks ? walks_sm90_plan(f, current_device()) : scan_plan(f, CudaPath::kThreeKernel, kBwdChunk);
  const std::size_t states = dtype_size(f.dtype) * f.batch * plan.fwd.nchunks * f.nheads * f.headdim * f.dstate;
  const std::size_t chunk_heads = static_cast<std::size_t>(f.batch * plan.fwd.nchunks * f.nheads);
  plan.fwd.chunk_states = f.saved_states ? 0 : round_up(states);  // (saved: read where the forward left them)
  plan.dstates = round_up(states);
  plan.intra = round_up(dtype_size(f.dtype) * chunk_heads * kBwdChunk * kBwdChunk);
  plan.dA = plan.ddt_bias = round_up(sizeof(float) * chunk_heads);
  plan.dD = round_up(sizeof(float) * chunk_heads * f.headdim);
  if (plan.sm90_walks) plan.adj_ends = plan.fwd.seg_ends, plan.adj_decay = plan.fwd.seg_decay;
  plan.sm90_grads = grads_sm90_refusal(p, walks).empty();
  plan.sm90_dbc = dbc_sm90_refusal(p, walks).empty();
  return plan;
}

void launch_backward(const BackwardParams& p, const BwdPlan& plan, void* workspace, void* stream) {
  const BwdArgs a = make_bwd_args(p, plan, workspace);
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype(p.fwd.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_headdim(p.fwd.headdim, [&](auto head_dim) { launch_kernels<T, decltype(head_dim)::value>(p, plan, a, s); });
  });
}

}  // namespace mamba2ssd::cuda
