// The CUDA forward: workspace layout, the one dispatch from runtime values to kernel instances, and
// the launches of the three kernels (plus varlen states). Nothing here synchronizes or allocates:
// the call can be captured in a CUDA graph.
//
// Chunk length: the kernels run with chunk 64 or 128. A requested chunk of 256 runs as chunks of
// 128; the function computed is the same (chunking is a way to organize the scan, not part of it).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "api/internal.h"
#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/tma.cuh"
#if MAMBA2SSD_HAVE_TILE
#include "forward_tile.h"  // tile/kernels: the CUDA Tile C++ backend (cuda_path tile)
#endif

namespace mamba2ssd {
namespace {

using cuda::Args;
using cuda::launch_all;

constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool fused_applies(const ForwardParams& p) { return p.headdim == 64 && p.dstate <= 128 && !p.varlen_states; }

int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

// Multiprocessors of the current device (the segment heuristic sizes work to them).
int sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }

// TMA can move a [batch, token, head, column] tensor: a 16-byte aligned base and strides that are
// positive multiples of 16 bytes (a dimension of extent 1 has no stride that matters).
bool tma_aligned(const void* ptr, const Strides4& s, DType t, int64_t batch, int64_t tokens, int64_t heads) {
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  auto ok = [&](int64_t extent, int64_t stride) { return extent == 1 || (stride > 0 && (stride * e) % 16 == 0); };
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && ok(batch, s.s0) && ok(tokens, s.s1) && ok(heads, s.s2);
}

// cuTensorMapEncodeTiled from the driver, looked up once (the runtime links no driver symbols;
// CUDA before 12.5 has only the unversioned lookup).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                             cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess) (void)cudaGetLastError();  // clears only the lookup's own error
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// Why the Hopper (wgmma) form of the fused path cannot run this call; empty if it can.
std::string hopper_refusal(const ForwardParams& p) {
  if (p.headdim != 64 || p.dstate > 256 || p.varlen_states)
    return "it needs head dim 64, state size at most 256 and no varlen_states";
  if (p.dtype == DType::kF32) return "it needs bf16 or fp16 inputs";
  if (p.seqlen >= (int64_t{1} << 31)) return "its token coordinates (TMA) are 32-bit";
  if (!tma_aligned(p.x, p.x_stride, p.dtype, p.batch, p.seqlen, p.nheads) ||
      !tma_aligned(p.y, p.y_stride, p.dtype, p.batch, p.seqlen, p.nheads) ||
      !tma_aligned(p.B, p.B_stride, p.dtype, p.batch, p.seqlen, p.ngroups) ||
      !tma_aligned(p.C, p.C_stride, p.dtype, p.batch, p.seqlen, p.ngroups))
    return "x, B, C and y need 16-byte aligned base pointers and strides (TMA)";
  const int major = device_attribute(cudaDevAttrComputeCapabilityMajor);
  const int minor = device_attribute(cudaDevAttrComputeCapabilityMinor);
  if (major != 9 || minor != 0)
    return "it needs an sm_90 GPU, this one is sm_" + std::to_string(major) + std::to_string(minor);
  // The build's code for sm_90 devices does not change: asked once, not on every call.
  static const bool built = cuda::hopper_kernels_built();
  if (!built) return "this build has no sm_90a code (MAMBA2SSD_CUDA_GENCODE)";
  // Decided here, not at the launch: the plan sizes the workspace for the path it picks.
  if (!tensor_map_encoder()) return "the driver has no cuTensorMapEncodeTiled";
  return "";
}

// The TMA map of a [batch, token, head or group, column] tensor (columns contiguous) for boxes of
// 64 columns x `rows` tokens with the 128-byte swizzle: one box is one column block of `rows` rows
// of a SwizzledTile, a tile of more rows takes several (tile/tma.cuh). Boxes past the last token or
// column read as zeros. False if the driver
// refuses the tensor (a stride that is not a multiple of 16 bytes, a base that is not aligned).
bool encode_row_tiles(CUtensorMap* map, const void* base, DType t, int64_t batch, int64_t tokens, int64_t heads,
                      int64_t cols, const Strides4& s, int64_t rows) {
  const auto encode = tensor_map_encoder();
  if (!encode) return false;
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  auto stride = [&](int64_t extent, int64_t elems) {  // a dimension of one element: any stride
    return static_cast<cuuint64_t>(extent == 1 ? 16 : elems * e);
  };
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(tokens), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {stride(heads, s.s2), stride(tokens, s.s1), stride(batch, s.s0)};
  const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(rows), 1}, unit[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      t == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 4, const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The hopper path's tensor maps into a; false if one of x, B, C, y cannot have one.
bool encode_hopper_maps(Args& a) {
  const ForwardParams& p = a.p;
  const int64_t chunk = tile::tma::kBoxRows;
  return encode_row_tiles(&a.x_map, p.x, p.dtype, p.batch, p.seqlen, p.nheads, p.headdim, p.x_stride, chunk) &&
         encode_row_tiles(&a.y_map, p.y, p.dtype, p.batch, p.seqlen, p.nheads, p.headdim, p.y_stride, chunk) &&
         encode_row_tiles(&a.B_map, p.B, p.dtype, p.batch, p.seqlen, p.ngroups, p.dstate, p.B_stride, chunk) &&
         encode_row_tiles(&a.C_map, p.C, p.dtype, p.batch, p.seqlen, p.ngroups, p.dstate, p.C_stride, chunk);
}

// How a call runs: the path, the chunk length of the kernels, the segments of the fused path, and
// the workspace sections (bytes) in order: dt, g, seq, chunk states, segment ends, segment entries,
// segment decays.
struct Plan {
  bool fused = false, hopper = false;
  int64_t chunk = 128, nchunks = 0, nsegs = 1, seg_chunks = 0;
  std::size_t dt = 0, g = 0, seq = 0, states = 0, seg_ends = 0, seg_entries = 0, seg_decay = 0;
  std::size_t total() const { return dt + g + seq + states + seg_ends + seg_entries + seg_decay; }
};

// Segments for the fused path, chosen ahead of time from the shape: `slots` blocks of the main
// kernel run at once (one per multiprocessor; on the Hopper path hopper_blocks_per_sm), so minimize
// waves x chunks per segment, charging the extra pass that more than one segment needs (it re-reads
// x and B: about a third of the main pass).
std::atomic<int64_t> g_forced_segments{0};  // detail::set_fused_segments_for_testing
std::atomic<bool> g_refuse_maps{false};      // detail::refuse_tma_maps_for_testing

int64_t choose_segments(int64_t blocks_per_segment, int64_t nchunks, int64_t slots) {
  int64_t best = 1;
  double best_cost = 0.0;
  for (int64_t segs = 1; segs <= cuda::kMaxSegments && segs <= nchunks; ++segs) {
    const int64_t seg_chunks = (nchunks + segs - 1) / segs;
    if ((nchunks + seg_chunks - 1) / seg_chunks != segs) continue;  // no empty segments
    const int64_t waves = (blocks_per_segment * segs + slots - 1) / slots;
    const double cost = static_cast<double>(waves * seg_chunks) * (segs > 1 ? 1.35 : 1.0);
    if (segs == 1 || cost < best_cost) best = segs, best_cost = cost;
  }
  return best;
}

Plan make_plan(const ForwardParams& p) {
  Plan plan;
  if (p.cuda_path == CudaPath::kFused && !fused_applies(p))
    throw Error("cuda_path fused needs headdim 64, dstate <= 128 and no varlen_states; got headdim " +
                std::to_string(p.headdim) + ", dstate " + std::to_string(p.dstate) +
                (p.varlen_states ? ", varlen_states" : ""));
  if (p.cuda_path == CudaPath::kHopper || p.cuda_path == CudaPath::kAuto) {
    const std::string why = hopper_refusal(p);
    if (p.cuda_path == CudaPath::kHopper && !why.empty())
      throw Error("cuda_path hopper cannot run this call: " + why + " (headdim " + std::to_string(p.headdim) +
                  ", dstate " + std::to_string(p.dstate) + ", dtype " + to_string(p.dtype) +
                  (p.varlen_states ? ", varlen_states" : "") + ")");
    plan.hopper = why.empty();
  }
  // The fused walk: on the Hopper kernels, or on the portable ones (state size up to 128).
  plan.fused = plan.hopper || (p.cuda_path != CudaPath::kThreeKernel && fused_applies(p));
  plan.chunk = plan.fused || p.chunk_size != 64 ? 128 : 64;
  plan.nchunks = (p.seqlen + plan.chunk - 1) / plan.chunk;
  const int64_t lpad = plan.nchunks * plan.chunk;
  plan.dt = plan.g = round_up(sizeof(float) * p.batch * p.nheads * lpad);
  if (p.seq_idx || p.cu_seqlens) plan.seq = round_up(sizeof(int32_t) * p.batch * lpad);
  if (plan.fused) {
    const int64_t forced = g_forced_segments.load();
    plan.nsegs = forced > 0 ? std::min({forced, plan.nchunks, static_cast<int64_t>(cuda::kMaxSegments)})
                            : choose_segments(p.batch * p.nheads, plan.nchunks,
                                              sm_count() * (plan.hopper ? cuda::hopper_blocks_per_sm(p.dstate) : 1));
    plan.seg_chunks = (plan.nchunks + plan.nsegs - 1) / plan.nsegs;
    plan.nsegs = (plan.nchunks + plan.seg_chunks - 1) / plan.seg_chunks;  // no empty segments
    const std::size_t end_bytes = sizeof(float) * p.headdim * cuda::fused_state_cols(p.dstate);  // padded
    if (plan.nsegs > 1) {
      plan.seg_ends = plan.seg_entries = round_up(end_bytes * p.batch * plan.nsegs * p.nheads);
      plan.seg_decay = round_up(sizeof(float) * p.batch * plan.nsegs * p.nheads);
    }
  } else {
    plan.states = round_up(sizeof(float) * p.headdim * p.dstate * p.batch * plan.nchunks * p.nheads);
  }
  return plan;
}

// The one dispatch: path x dtype x chunk. Head dim and state size are dispatched at the launches.
void dispatch(const Args& a, const Plan& plan, cudaStream_t stream) {
  const bool q64 = plan.chunk == 64;
  switch (a.p.dtype) {
    case DType::kBF16:
      if (plan.fused) return cuda::launch_fused<__nv_bfloat16>(a, stream, plan.hopper);
      return q64 ? launch_all<__nv_bfloat16, 64>(a, stream) : launch_all<__nv_bfloat16, 128>(a, stream);
    case DType::kF16:
      if (plan.fused) return cuda::launch_fused<__half>(a, stream, plan.hopper);
      return q64 ? launch_all<__half, 64>(a, stream) : launch_all<__half, 128>(a, stream);
    case DType::kF32:
      if (plan.fused) return cuda::launch_fused<float>(a, stream, false);
      return q64 ? launch_all<float, 64>(a, stream) : launch_all<float, 128>(a, stream);
  }
}

bool aligned4(const void* ptr, const Strides4& s, DType t) {
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  return tile::aligned16(ptr, s.s0, e) && tile::aligned16(ptr, s.s1, e) && tile::aligned16(ptr, s.s2, e);
}

// Two adjacent elements of every row can move as one access.
bool pairs_aligned(const void* ptr, const Strides4& s, DType t) {
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  return reinterpret_cast<uintptr_t>(ptr) % (2 * e) == 0 && s.s0 % 2 == 0 && s.s1 % 2 == 0 && s.s2 % 2 == 0;
}

// cuda_path tile: the CUDA Tile C++ backend (tile/), present only in builds with MAMBA2SSD_TILE=ON.
#if MAMBA2SSD_HAVE_TILE
std::size_t tile_workspace_bytes(const ForwardParams& p) { return cuda_tile_workspace_bytes(p); }
void run_tile(const ForwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream) {
  forward_cuda_tile(p, workspace, workspace_bytes, stream);
}
#else
[[noreturn]] void no_tile() {
  throw Error("cuda_path tile: this build has no CUDA Tile C++ backend (configure with -DMAMBA2SSD_TILE=ON "
              "and a CUDA 13.3+ nvcc; see docs/tile-cpp.md)");
}
std::size_t tile_workspace_bytes(const ForwardParams&) { no_tile(); }
void run_tile(const ForwardParams&, void*, std::size_t, void*) { no_tile(); }
#endif

}  // namespace

void detail::set_fused_segments_for_testing(int64_t n) { g_forced_segments = n; }
void detail::refuse_tma_maps_for_testing(bool refuse) { g_refuse_maps = refuse; }

std::size_t cuda_workspace_bytes(const ForwardParams& p) {
  validate(p);
  if (p.cuda_path == CudaPath::kTile) return tile_workspace_bytes(p);
  return make_plan(p).total();
}

void forward_cuda(const ForwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream) {
  validate(p);
  if (p.cuda_path == CudaPath::kTile) return run_tile(p, workspace, workspace_bytes, stream);
  Plan plan = make_plan(p);
  if (!workspace) throw Error("workspace is null");
  if (workspace_bytes < plan.total())
    throw Error("workspace_bytes is " + std::to_string(workspace_bytes) + ", needs at least " +
                std::to_string(plan.total()) + " (cuda_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) throw Error("workspace must be 256-byte aligned");
  if (p.nheads > 65535 || p.batch * plan.nsegs > 65535)
    throw Error("nheads and batch must be at most 65535 for the CUDA backend, got nheads " +
                std::to_string(p.nheads) + ", batch " + std::to_string(p.batch));

  Args a{};
  a.p = p;
  a.nchunks = plan.nchunks;
  a.lpad = plan.nchunks * plan.chunk;
  a.resets = p.seq_idx || p.cu_seqlens;
  a.nsegs = plan.nsegs;
  a.seg_chunks = plan.seg_chunks;
  char* next = static_cast<char*>(workspace);
  auto carve = [&next](std::size_t bytes) {
    char* at = next;
    next += bytes;
    return bytes ? at : nullptr;
  };
  a.ws.dt = reinterpret_cast<float*>(carve(plan.dt));
  a.ws.g = reinterpret_cast<float*>(carve(plan.g));
  a.ws.seq = reinterpret_cast<int32_t*>(carve(plan.seq));
  a.ws.states = reinterpret_cast<float*>(carve(plan.states));
  a.ws.seg_ends = reinterpret_cast<float*>(carve(plan.seg_ends));
  a.ws.seg_entries = reinterpret_cast<float*>(carve(plan.seg_entries));
  a.ws.seg_decay = reinterpret_cast<float*>(carve(plan.seg_decay));
  a.x_aligned = aligned4(p.x, p.x_stride, p.dtype);
  a.B_aligned = aligned4(p.B, p.B_stride, p.dtype);
  a.C_aligned = aligned4(p.C, p.C_stride, p.dtype);
  a.y_pairs = pairs_aligned(p.y, p.y_stride, p.dtype);
  a.z_pairs = p.z && pairs_aligned(p.z, p.z_stride, p.dtype);
  if (plan.hopper && (g_refuse_maps.load() || !encode_hopper_maps(a))) {
    // The driver refused a tensor map that hopper_refusal expected to work. Up to state size 128
    // under auto, the portable fused path takes the call (the same workspace); above, no other
    // path fits the workspace that was planned.
    if (p.cuda_path == CudaPath::kHopper)
      throw Error("cuda_path hopper cannot run this call: the driver refused a TMA map of x, B, C or y");
    if (!fused_applies(p))
      throw Error("cuda_path auto cannot run this call: the driver refused a TMA map of x, B, C or y, and with "
                  "dstate " + std::to_string(p.dstate) + " no other path fits the planned workspace "
                  "(cuda_path three-kernel runs it)");
    plan.hopper = false;
  }
  dispatch(a, plan, static_cast<cudaStream_t>(stream));
}

}  // namespace mamba2ssd
