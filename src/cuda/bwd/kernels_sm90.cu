// The backward's Hopper kernels, host side: when they take a call, their TMA maps, their launches.
// The walks (chunk_walks_sm90.cuh):
//   with several segments: chunk_walks_sm90 (kEnds: each segment's end state from zero, both
//                          directions in one grid) -> segment_entries (per direction)
//   chunk_walks_sm90 (every segment from its entry: the states at every chunk, dinitial_states)
// chunk_grads_sm90 (chunk_grads_sm90.cuh): the per-token gradients, one block per chunk and head.
// chunk_dbc_sm90 (chunk_dbc_sm90.cuh): dB and dC, one block per chunk and group (and state columns).
#include <algorithm>
#include <atomic>
#include <string>

#include "api/internal.h"
#include "cuda/bwd/chunk_dbc_sm90.cuh"
#include "cuda/bwd/chunk_grads_sm90.cuh"
#include "cuda/bwd/chunk_walks_sm90.cuh"
#include "cuda/bwd/kernels_sm90.h"
#include "cuda/common/device.h"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/tensor_map.h"
#include "cuda/fwd/paths.h"
#include "cuda/fwd/segment_entries.cuh"

namespace mamba2ssd::cuda {
namespace {

std::atomic<bool> g_portable{false};  // detail::set_portable_backward_for_testing

// The maps of the tiles the walks read; false if the driver refuses one.
bool encode_maps(BwdSm90Args& a, const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  const int64_t rows = tile::tma::kBoxRows;
  auto heads = [&](CUtensorMap* map, const void* ptr, const Strides4& s) {
    return encode_row_tiles(map, ptr, f.dtype, f.batch, f.seqlen, f.nheads, f.headdim, s, rows);
  };
  auto groups = [&](CUtensorMap* map, const void* ptr, const Strides4& s) {
    return encode_row_tiles(map, ptr, f.dtype, f.batch, f.seqlen, f.ngroups, f.dstate, s, rows);
  };
  return heads(&a.x_map, f.x, f.x_stride) && heads(&a.dout_map, p.dout, p.dout_stride) &&
         (!f.z || heads(&a.z_map, f.z, f.z_stride)) && groups(&a.B_map, f.B, f.B_stride) &&
         groups(&a.C_map, f.C, f.C_stride);
}

// The maps of the states the walks stored (h entering each chunk, dh leaving it): each section
// [b, nchunks, H, P, N] seen as [b x nchunks, P, H, N], so that a chunk's and head's 64 x N state
// is one row tile.
bool encode_state_maps(GradsSm90Args& a, const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  const int64_t rows = f.batch * a.scan.nchunks, P = f.headdim, N = f.dstate, H = f.nheads;
  const Strides4 s{H * P * N, N, P * N, 1};
  return encode_row_tiles(&a.h_map, a.chunk_states, f.dtype, rows, P, H, N, s, tile::tma::kBoxRows) &&
         encode_row_tiles(&a.dh_map, a.work.dstates, f.dtype, rows, P, H, N, s, tile::tma::kBoxRows);
}

// M's map: the [b, nchunks, H, Q, Q] section seen as [b x nchunks, Q, H, Q].
bool encode_m_map(DbcSm90Args& a, const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  const int64_t rows = f.batch * a.scan.nchunks, Q = kBwdChunk, H = f.nheads;
  const Strides4 s{H * Q * Q, Q, Q * Q, 1};
  return encode_row_tiles(&a.m_map, a.work.intra, f.dtype, rows, Q, H, Q, s, tile::tma::kBoxRows);
}

// The workspace's sections at a stand-in address, for the refusals' maps (encoding reads no memory).
DbcSm90Args workspace_probe(const ForwardParams& f) {
  DbcSm90Args probe{};
  probe.scan.nchunks = (f.seqlen + kBwdChunk - 1) / kBwdChunk;
  probe.chunk_states = reinterpret_cast<float*>(uintptr_t{1024});
  probe.work.dstates = probe.work.intra = probe.chunk_states;
  return probe;
}

// Why the states' maps cannot be made for p, which the walks store the states through and
// chunk_grads_sm90 and chunk_dbc_sm90 read them through; empty if they can.
std::string states_maps_refusal(const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  if (f.dstate % 8 != 0)  // the workspace's state rows as TMA rows: 16-byte strides
    return "it needs a state size that is a multiple of 8 (dstate " + std::to_string(f.dstate) + ")";
  if (static_cast<int64_t>(f.batch) * ((f.seqlen + kBwdChunk - 1) / kBwdChunk) >= (int64_t{1} << 31))
    return "its state coordinates (TMA) are 32-bit";
  DbcSm90Args probe = workspace_probe(f);
  return encode_state_maps(probe, p) ? "" : "the driver refused a TMA map of the states";
}

// The inputs' and the states' maps of the call over base's arguments (the refusals encoded the same
// at planning).
GradsSm90Args chunk_kernel_args(const BackwardParams& p, const BwdArgs& base) {
  GradsSm90Args a{};
  static_cast<BwdArgs&>(a) = base;
  if (!encode_maps(a, p) || !encode_state_maps(a, p))
    throw CudaError("backward: the driver refused a TMA map that it accepted when the call was planned");
  return a;
}

// chunk_dbc_sm90's state columns a block: the whole state up to 64, else blocks of 128; blocks of 64
// with fp32 inputs, whose tiles take twice the bytes.
int64_t dbc_sm90_cols(DType dtype, int64_t dstate) {
  return dtype == DType::kF32 || dstate <= 64 ? 64 : 128;
}

// The walks of the call (walk_row: both directions, or the adjoint's alone when the forward saved
// the states).
template <typename T, int kN>
void launch_walks(const GradsSm90Args& a, cudaStream_t stream) {
  using Shape = ChunkWalksSm90Shape<T, kN>;
  const auto per_seg = static_cast<unsigned>(a.seg.ptiles * Shape::kParts);
  const bool both = !a.saved_states;
  const auto heads = static_cast<unsigned>(a.geo.nheads), rows = static_cast<unsigned>((both ? 2 : 1) * a.geo.batch);
  if (a.seg.count > 1) {
    auto ends = chunk_walks_sm90_kernel<T, kN, true>;
    allow_smem(ends, Shape::kSmemBytes, true);
    launch(ends, "chunk_walks_sm90_kernel (segment ends)", dim3(static_cast<unsigned>(a.seg.count - 1) * per_seg, heads, rows),
           Shape::kThreads, Shape::kSmemBytes, stream, a, true);
    if (both) launch_segment_entries<kN>(a, stream, true);
    FwdArgs adjoint = a;  // the adjoint's chain starts from dfinal_states
    adjoint.seg = a.adj;
    adjoint.io.initial_states = a.grad.dfinal_states, adjoint.io.initial_states_stride = a.grad.dfinal_states_stride;
    launch_segment_entries<kN>(adjoint, stream, true);
  }
  auto walk = chunk_walks_sm90_kernel<T, kN, false>;
  allow_smem(walk, Shape::kSmemBytes, true);
  launch(walk, "chunk_walks_sm90_kernel", dim3(static_cast<unsigned>(a.seg.count) * per_seg, heads, rows),
         Shape::kThreads, Shape::kSmemBytes, stream, a, true);
}

}  // namespace

// (Every Hopper kernel of the backward runs behind the walks, so their refusal is all of theirs.)
std::string walks_sm90_refusal(const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  if (g_portable.load()) return "the portable kernels are forced (tests)";
  if (f.seqlen >= (int64_t{1} << 31)) return "their token coordinates (TMA) are 32-bit";
  if (!tma_aligned(f.x, f.x_stride, f.dtype, f.batch, f.seqlen, f.nheads) ||
      !tma_aligned(p.dout, p.dout_stride, f.dtype, f.batch, f.seqlen, f.nheads) ||
      (f.z && !tma_aligned(f.z, f.z_stride, f.dtype, f.batch, f.seqlen, f.nheads)) ||
      !tma_aligned(f.B, f.B_stride, f.dtype, f.batch, f.seqlen, f.ngroups) ||
      !tma_aligned(f.C, f.C_stride, f.dtype, f.batch, f.seqlen, f.ngroups))
    return "x, dout, z, B and C need 16-byte aligned base pointers and strides (TMA)";
  if (!current_device().is_sm90()) return "they need an sm_90 GPU";
  static const bool built = sm90_kernels_built();
  if (!built) return "this build has no sm_90a code";
  if (!tensor_maps_available()) return "the driver has no cuTensorMapEncodeTiled";
  GradsSm90Args probe{};  // the inputs' maps at a stand-in address (encoding reads no memory)
  if (!encode_maps(probe, p)) return "the driver refused a TMA map";
  return states_maps_refusal(p);  // the states' maps, for the stores
}

int64_t walks_sm90_cols(DType dtype, int64_t dstate) {
  static_assert(ChunkWalksSm90Shape<float, 256>::kCols == 64 && ChunkWalksSm90Shape<__half, 256>::kCols == 128 &&
                    ChunkWalksSm90Shape<__half, 64>::kCols == 64,
                "walks_sm90_cols follows the walks' shape");
  return dtype == DType::kF32 ? 64 : std::min<int64_t>(fused_state_cols(dstate), 128);
}

// Head dim 32 runs in the Hopper kernels' 64 columns: TMA fills the columns of x, dout and z and
// the rows of h and dh past the head dim with zeros, which add nothing to any product or sum, and
// chunk_grads stores none of its columns there (half of each product over the head dim is wasted,
// against the portable kernels' scalar steps). Head dim 128 comes as twice the heads of 64
// (head_split.h) where its tensors allow.
namespace {
bool sm90_head_dim(int64_t headdim) { return headdim == 32 || headdim == 64; }
constexpr const char* kBehindWalks = "it runs only behind the Hopper walks";  // (it reads the states they store)
std::string head_dim_refusal(int64_t headdim) {
  return "it takes head dim 32 or 64 (head dim " + std::to_string(headdim) + ")";
}
}  // namespace

std::string grads_sm90_refusal(const BackwardParams& p, const std::string& walks_refusal) {
  const ForwardParams& f = p.fwd;
  if (!walks_refusal.empty()) return kBehindWalks;  // (they checked the maps)
  if (f.dtype == DType::kF32) {
    constexpr int kMaxState = ChunkGradsSm90Shape<float, 64>::kMaxState;
    if (f.dstate > kMaxState)
      return "fp32 inputs take state sizes up to " + std::to_string(kMaxState) + " (dstate " + std::to_string(f.dstate) + ")";
  }
  return sm90_head_dim(f.headdim) ? "" : head_dim_refusal(f.headdim);
}

void launch_grads_sm90(const BackwardParams& p, const BwdArgs& base, void* stream, bool chained) {
  const GradsSm90Args a = chunk_kernel_args(p, base);
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(a.scan.nchunks), static_cast<unsigned>(a.geo.nheads),
                  static_cast<unsigned>(a.geo.batch));
  auto run = [&](auto kernel, auto shape) {
    using Shape = decltype(shape);
    allow_smem(kernel, Shape::kSmemBytes, true);
    launch(kernel, "chunk_grads_sm90_kernel", grid, Shape::kThreads, Shape::kSmemBytes, s, a, chained);
  };
  dispatch_dtype(p.fwd.dtype, [&](auto t) {
    using T = decltype(t);
    switch (fused_state_cols(p.fwd.dstate)) {
      case 64: return run(chunk_grads_sm90_kernel<T, 64>, ChunkGradsSm90Shape<T, 64>{});
      case 128: return run(chunk_grads_sm90_kernel<T, 128>, ChunkGradsSm90Shape<T, 128>{});
      default:
        if constexpr (sizeof(T) == 2) return run(chunk_grads_sm90_kernel<T, 256>, ChunkGradsSm90Shape<T, 256>{});
        else throw CudaError("backward: fp32 chunk_grads_sm90 got a state past its two halves (grads_sm90_refusal)");
    }
  });
}

std::string dbc_sm90_refusal(const BackwardParams& p, const std::string& walks_refusal) {
  const ForwardParams& f = p.fwd;
  if (!walks_refusal.empty()) return kBehindWalks;
  if (!sm90_head_dim(f.headdim)) return head_dim_refusal(f.headdim);
  if (f.nheads / f.ngroups < kDbcSm90MinHeads)
    return "it takes at least " + std::to_string(kDbcSm90MinHeads) + " heads a group (" + std::to_string(f.nheads / f.ngroups) + ")";
  DbcSm90Args probe = workspace_probe(p.fwd);  // (the states' maps: walks_sm90_refusal's)
  return encode_m_map(probe, p) ? "" : "the driver refused a TMA map of the workspace";
}

void launch_dbc_sm90(const BackwardParams& p, const BwdArgs& base, void* stream) {
  DbcSm90Args a{};
  static_cast<GradsSm90Args&>(a) = chunk_kernel_args(p, base);
  if (!encode_m_map(a, p))  // dbc_sm90_refusal encoded it at planning
    throw CudaError("backward: the driver refused a TMA map that it accepted when the call was planned");
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t cols = dbc_sm90_cols(p.fwd.dtype, p.fwd.dstate);
  const dim3 grid(static_cast<unsigned>(a.scan.nchunks),
                  static_cast<unsigned>(p.fwd.ngroups * ((p.fwd.dstate + cols - 1) / cols)),
                  static_cast<unsigned>(a.geo.batch));
  auto run = [&](auto kernel, auto shape) {
    using Shape = decltype(shape);
    allow_smem(kernel, Shape::kSmemBytes, true);
    launch(kernel, "chunk_dbc_sm90_kernel", grid, Shape::kThreads, Shape::kSmemBytes, s, a, true);
  };
  dispatch_dtype(p.fwd.dtype, [&](auto t) {
    using T = decltype(t);
    if (cols == 64) return run(chunk_dbc_sm90_kernel<T, 64>, ChunkDbcSm90Shape<T, 64>{});
    if constexpr (sizeof(T) == 2) return run(chunk_dbc_sm90_kernel<T, 128>, ChunkDbcSm90Shape<T, 128>{});
    else throw CudaError("backward: fp32 chunk_dbc_sm90 got blocks of 128 state columns (dbc_sm90_cols)");
  });
}

void launch_walks_sm90(const BackwardParams& p, const BwdArgs& base, void* stream) {
  const GradsSm90Args a = chunk_kernel_args(p, base);  // the inputs' maps, and the states' for the stores
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype(p.fwd.dtype, [&](auto t) {
    using T = decltype(t);
    switch (fused_state_cols(p.fwd.dstate)) {
      case 64: return launch_walks<T, 64>(a, s);
      case 128: return launch_walks<T, 128>(a, s);
      default: return launch_walks<T, 256>(a, s);
    }
  });
}

}  // namespace mamba2ssd::cuda

void mamba2ssd::detail::set_portable_backward_for_testing(bool portable) { mamba2ssd::cuda::g_portable = portable; }
