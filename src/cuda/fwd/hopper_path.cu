// The hopper path: the fused walk on Hopper's TMA and warpgroup tensor-core instructions (sm_90a
// code, an sm_90 GPU). bf16 and fp16 with state size up to 256, fp32 (TF32 products) up to 128;
// every head dim (a block per 64 columns of it); x, B, C and y 16-byte aligned. Each kernel after
// chunk_cumsum up to the main walk is chained behind the one before it (programmatic dependent
// launch).
//   chunk_cumsum -> segment_ends_sm90 (each segment's end state from zero; with several segments)
//                -> segment_entries   (the state entering each segment)
//                -> segment_scan_sm90 (every segment walked from its entry state: y, final states;
//                                      fp32: segment_scan_tf32_sm90)
//                -> varlen_states_sm80 (each packed sequence's final state, when asked for)
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>

#include "api/internal.h"
#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/tensor_map.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/paths.h"
#include "cuda/fwd/segment_ends_sm90.cuh"
#include "cuda/fwd/segment_entries.cuh"
#include "cuda/fwd/segment_scan_sm90.cuh"
#include "cuda/fwd/segment_scan_tf32_sm90.cuh"
#include "cuda/fwd/varlen_states_sm80.cuh"
#include "cuda/prefill/request_edges.cuh"

namespace mamba2ssd::cuda {

// The wgmma kernels exist as sm_90a code in this build and the device runs it (else their body
// traps). binaryVersion reads 90 for plain sm_90 code too, so the build says whether its targets
// include sm_90a (MAMBA2SSD_SM90A_CODE, set by CMake and setup.py).
bool sm90_kernels_built() {
#ifdef MAMBA2SSD_SM90A_CODE
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, segment_scan_sm90_kernel<__nv_bfloat16, 128, false, false>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
#else
  return false;
#endif
}

namespace {

std::atomic<bool> g_refuse_maps{false};  // detail::refuse_tma_maps_for_testing
std::atomic<int64_t> g_request_groups{0};  // detail::set_prefill_request_groups_for_testing

// Rows of saved_states seen as [b x steps, P, H, N]: the map's outer dimension and the walk's
// 32-bit row coordinate.
int64_t saved_state_rows(const ForwardParams& p) { return p.batch * saved_states_chunks(p.seqlen); }

// The walk saves the states for the backward as it goes (kSave) with 16-bit inputs and no varlen
// states (the calls the backward's Hopper kernels take, at every head dim), by TMA: whole 16-byte
// pieces of state rows (the state size is a multiple of 16) at 32-bit row coordinates, each block
// its column tile's rows.
bool saves_states(const ForwardParams& p) {
  return p.dtype != DType::kF32 && !p.varlen_states && saved_state_rows(p) < (int64_t{1} << 31);
}

// The maps of x, B, C and y into a, and of saved_states where the walk saves them; false if the
// driver refuses one.
bool encode_maps(Sm90FwdArgs& a, const ForwardParams& p) {
  const int64_t rows = tile::tma::kBoxRows;
  auto saved = [&] {  // [b, steps, H, P, N] as [b x steps, P, H, N]: a step's and head's state, one row tile
    const int64_t P = p.headdim, N = p.dstate, H = p.nheads;
    return encode_row_tiles(&a.saved_map, p.saved_states, p.dtype, saved_state_rows(p), P, H, N,
                            Strides4{H * P * N, N, P * N, 1}, rows);
  };
  return !g_refuse_maps.load() &&
         encode_row_tiles(&a.x_map, p.x, p.dtype, p.batch, p.seqlen, p.nheads, p.headdim, p.x_stride, rows) &&
         encode_row_tiles(&a.y_map, p.y, p.dtype, p.batch, p.seqlen, p.nheads, p.headdim, p.y_stride, rows) &&
         encode_row_tiles(&a.B_map, p.B, p.dtype, p.batch, p.seqlen, p.ngroups, p.dstate, p.B_stride, rows) &&
         encode_row_tiles(&a.C_map, p.C, p.dtype, p.batch, p.seqlen, p.ngroups, p.dstate, p.C_stride, rows) &&
         (!p.saved_states || !saves_states(p) || saved());
}

// The main walk per input type: the 16-bit walk, or fp32's TF32 walk (which has no prefill form).
template <typename T, int kN>
struct MainWalk {
  using Shape = SegmentScanSm90Shape<T, kN>;
  static constexpr const char* kName = "segment_scan_sm90_kernel";
  template <bool kCarry, bool kTiled, bool kPrefill, bool kSave = false>
  static constexpr auto kernel() { return segment_scan_sm90_kernel<T, kN, kCarry, kTiled, kPrefill, kSave>; }
};
template <int kN>
struct MainWalk<float, kN> {
  using Shape = SegmentScanTf32Shape<kN>;
  static constexpr const char* kName = "segment_scan_tf32_sm90_kernel";
  template <bool kCarry, bool kTiled, bool kPrefill>
  static constexpr auto kernel() {
    static_assert(!kPrefill, "the prefill's hopper kernels take 16-bit inputs");
    return segment_scan_tf32_sm90_kernel<kN, kCarry, kTiled>;
  }
};

// kPrefill: the packed prefill's padded layout (its chunk map built before chunk_cumsum); with
// several segments, the final states the walk deferred are stored after it (deferred_states_kernel).
template <typename T, int kN, bool kPrefill = false>
void launch_kernels(const Sm90FwdArgs& a, cudaStream_t stream) {
  launch_chunk_cumsum<Sm90Step::kChunk>(a, stream);
  const unsigned heads = static_cast<unsigned>(a.geo.nheads), batch = static_cast<unsigned>(a.geo.batch);
  // (The prefill's segments per request each enter their request from its slot: no first pass.)
  const bool chained_segments = a.seg.count > 1 && !a.prefill.request_chunks;
  if (chained_segments) {
    using Shape = SegmentEndsSm90Shape<T, kN>;
    auto kernel = segment_ends_sm90_kernel<T, kN, kPrefill>;
    allow_smem(kernel, Shape::kSmemBytes, true);
    launch(kernel, "segment_ends_sm90_kernel",
           dim3(static_cast<unsigned>((a.seg.count - 1) * a.seg.ptiles * Shape::kParts), heads, batch),
           Shape::kThreads, Shape::kSmemBytes, stream, a, true);
    launch_segment_entries<kN>(a, stream, true);
  }
  using Walk = MainWalk<T, kN>;
  using Shape = typename Walk::Shape;
  // The prefill with segments of whole requests: the heads and column tiles on x, the segments on
  // y, so that the blocks of a segment, which read its B and C, run together (as the forward's heads
  // of a segment do). With the requests on x, a request's B and C had left L2 before the next head's
  // blocks came to read them (docs/perf-log.md, "Prefill p6").
  const unsigned segs = static_cast<unsigned>(a.seg.count), ptiles = static_cast<unsigned>(a.seg.ptiles);
  const dim3 grid =
      kPrefill && a.prefill.request_chunks ? dim3(heads * ptiles, segs, 1) : dim3(segs * ptiles, heads, batch);
  auto main_walk = [&](auto kernel) {
    allow_smem(kernel, Shape::kSmemBytes, true);  // all of shared memory: two blocks fit (state 256, fp32: one)
    launch(kernel, Walk::kName, grid, Shape::kThreads, Shape::kSmemBytes, stream, a, true);
  };
  // The column-tile form for every head dim but 64 (a kernel of its own: HeadRows).
  const bool tiled = a.geo.headdim != kWalkPCols;
  if constexpr (kPrefill) {
    tiled ? main_walk(Walk::template kernel<false, true, true>())
          : main_walk(Walk::template kernel<false, false, true>());
    if (chained_segments)  // (stream order: after the walk)
      launch(deferred_states_kernel<kN>, "deferred_states_kernel", dim3(static_cast<unsigned>(a.seg.count), heads),
             kDeferredStatesThreads, 0, stream, static_cast<const FwdArgs&>(a));
    return;
  }
  if constexpr (sizeof(T) == 2)
    if (a.saved_states) {  // (set only where saves_states())
      tiled ? main_walk(Walk::template kernel<false, true, false, true>())
            : main_walk(Walk::template kernel<false, false, false, true>());
      return;
    }
  if (a.scan.carry)
    tiled ? main_walk(Walk::template kernel<true, true, false>())
          : main_walk(Walk::template kernel<true, false, false>());
  else
    tiled ? main_walk(Walk::template kernel<false, true, false>())
          : main_walk(Walk::template kernel<false, false, false>());
  launch_varlen_states<T, Sm90Step::kChunk>(a, stream);
}

// Blocks per multiprocessor of the path's main walk.
int blocks_per_sm(const ForwardParams& p) { return p.dtype == DType::kF32 ? 1 : sm90_blocks_per_sm(p.dstate); }

std::string refusal(const ForwardParams& p, const DeviceInfo& d) {
  if (p.dstate > 256) return "it needs state size at most 256 (dstate " + std::to_string(p.dstate) + ")";
  if (p.dtype == DType::kF32 && p.dstate > 128)
    return "fp32 inputs need state size at most 128 on it (dstate " + std::to_string(p.dstate) + ")";
  if (p.dtype == DType::kF32 && p.fp32_math == Fp32Math::kAccurate)
    return "its fp32 products are TF32 (fp32_math accurate, 3xTF32, runs on the fused path)";
  if (p.seqlen >= (int64_t{1} << 31)) return "its token coordinates (TMA) are 32-bit";
  if (std::string why = grid_refusal(p); !why.empty()) return why;
  if (!tma_aligned(p.x, p.x_stride, p.dtype, p.batch, p.seqlen, p.nheads) ||
      !tma_aligned(p.y, p.y_stride, p.dtype, p.batch, p.seqlen, p.nheads) ||
      !tma_aligned(p.B, p.B_stride, p.dtype, p.batch, p.seqlen, p.ngroups) ||
      !tma_aligned(p.C, p.C_stride, p.dtype, p.batch, p.seqlen, p.ngroups))
    return "x, B, C and y need 16-byte aligned base pointers and strides (TMA)";
  if (!d.is_sm90()) return "it needs an sm_90 GPU, this one is " + d.arch();
  // The build's code for sm_90 devices does not change: asked once, not on every call.
  static const bool built = sm90_kernels_built();
  if (!built) return "this build has no sm_90a code (MAMBA2SSD_CUDA_GENCODE)";
  if (!tensor_maps_available()) return "the driver has no cuTensorMapEncodeTiled";
  // Decided here, not at the launch, so that the plan (and the workspace) is that of the path
  // that runs: a host computation, no allocation, no synchronization.
  Sm90FwdArgs probe{};
  if (!encode_maps(probe, p)) return "the driver refused a TMA map of x, B, C, y or saved_states";
  return "";
}

FwdPlan plan(const ForwardParams& p, const DeviceInfo& d) {
  FwdPlan plan = scan_plan(p, CudaPath::kHopper, Sm90Step::kChunk);
  plan_segments(plan, p, static_cast<int64_t>(d.sm_count) * blocks_per_sm(p), kSm90FwdSegments);
  return plan;
}

// The kernels of the path, on args `base` of the call p (the forward's, or the packed prefill's).
template <bool kPrefill>
void launch_on(const ForwardParams& p, const FwdArgs& base, void* stream) {
  Sm90FwdArgs a{};
  static_cast<FwdArgs&>(a) = base;
  if (!encode_maps(a, p))  // refusal() encoded the same maps
    throw CudaError("cuda_path hopper: the driver refused a TMA map that it accepted when the call was planned");
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype(p.dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (sizeof(T) == 2) {
      switch (fused_state_cols(p.dstate)) {
        case 64: return launch_kernels<T, 64, kPrefill>(a, s);
        case 128: return launch_kernels<T, 128, kPrefill>(a, s);
        default: return launch_kernels<T, 256, kPrefill>(a, s);
      }
    } else if constexpr (!kPrefill) {  // fp32 (the prefill's hopper kernels take 16-bit inputs only)
      fused_state_cols(p.dstate) == 64 ? launch_kernels<T, 64>(a, s) : launch_kernels<T, 128>(a, s);
    }
  });
}

void launch_path(const ForwardParams& p, const FwdPlan& plan, void* workspace, void* stream) {
  launch_on<false>(p, make_fwd_args(p, plan, workspace), stream);
}

}  // namespace

// Segments of whole requests where the requests alone give the walk kRequestSegmentWaves waves of
// blocks (requests x heads x head-dim tiles) and are short on average (at most
// kRequestSegmentMeanTokens): no block then walks a request that another block entered, so the
// first pass, segment_entries and deferred_states_kernel do not run. Measured on the H200
// (docs/perf-log.md, "Prefill p4", a segment per request): 16 requests of 256 tokens, H 80, 238.8 ->
// 164.8 us; chat-like mixes (mean about 400 tokens) 5-11% faster; 13 documents of mean 5041 tokens
// 14% slower (the longest, 16K tokens, walked by one block a head), hence the mean. The plan sees
// the request count and the total, not the lengths: a mix of short requests and one very long one
// can still take this form and wait for the long one.
// Their count K (request_groups): fewer segments save each removed block's fixed cost (its
// prologue, first loads and last wait: o), more shorten the tail, where the last blocks run alone
// for about half a segment's walk. For C padded chunks (about L / 128 + S / 2) and X blocks a
// segment (heads x column tiles) on `slots` blocks at once, time ~ o K X / slots + c C / K (c a
// chunk's walk), least at K = sqrt(C slots / (o / c X)); at least a wave of blocks, at most a
// request a segment. o / c = kBlockCostChunks from the H200 ("Prefill p7": 128 requests of 256
// tokens at P 128 N 256 took 1.45 ms with a segment per request and 1.29 with 16 segments, 68
// fewer blocks a multiprocessor: o about 2.4 us, c about 6 us; chat mixes flat within 2% from half
// to twice the K this gives).
// Else segments as the forward's, but no more than two segment blocks per multiprocessor: over nine
// request mixes on the H200 (docs/perf-log.md, "Prefill p3") every segment past that cost more than
// its parallelism gained (41 requests of 16K tokens, H 80: 13 segments 807 us, 3 segments 645 us).
// A final state the walk cannot store before the slot is read (its request began in an earlier
// segment's block) waits for deferred_states_kernel.
constexpr int64_t kRequestSegmentWaves = 2, kRequestSegmentMeanTokens = 1024;
constexpr double kBlockCostChunks = 1.0;  // o / c: a block's fixed cost in chunk walks (each two steps)
FwdPlan sm90_prefill_plan(const ForwardParams& p, const DeviceInfo& d, int64_t nchunks) {
  FwdPlan plan = scan_plan(p, CudaPath::kHopper, Sm90Step::kChunk);
  plan.nchunks = nchunks, plan.lpad = nchunks * plan.chunk, plan.seq = 0;
  plan.dt = plan.g = (sizeof(float) * p.nheads * plan.lpad + 255) / 256 * 256;
  const int64_t slots = static_cast<int64_t>(d.sm_count) * sm90_blocks_per_sm(p.dstate);
  const int64_t blocks = p.nheads * walk_ptiles(p.headdim);  // a segment's
  const int64_t forced = g_request_groups.load();
  const bool whole_requests = forced != 0 ? forced > 0
                                          : !segments_forced_for_testing() &&
                                                p.nseqs * blocks >= kRequestSegmentWaves * slots &&
                                                p.seqlen <= p.nseqs * kRequestSegmentMeanTokens;
  if (whole_requests && p.nseqs > 0 && nchunks < (int64_t{1} << 30)) {  // (WalkedRequest's steps are 32-bit)
    const double chunks = static_cast<double>(p.seqlen) / plan.chunk + static_cast<double>(p.nseqs) / 2.0;
    const auto best = std::llround(std::sqrt(chunks * static_cast<double>(slots) / (kBlockCostChunks * blocks)));
    const int64_t wave = (slots + blocks - 1) / blocks;
    const int64_t k = forced > 0 ? forced : std::max<int64_t>(best, wave);
    plan.request_segments = true;
    plan.nsegs = std::clamp<int64_t>(k, 1, std::min<int64_t>(p.nseqs, 65535));  // (the walk's grid y)
    plan.seg_chunks = 0, plan.ptiles = walk_ptiles(p.headdim);
    return plan;
  }
  SegmentModel model = kSm90FwdSegments;
  model.max_blocks = 2 * int64_t{d.sm_count};
  plan_segments(plan, p, slots, model);
  return plan;
}

void launch_sm90_prefill(const ForwardParams& p, const FwdArgs& a, void* stream) { launch_on<true>(p, a, stream); }

const FwdPath kSm90Path = {CudaPath::kHopper, true, saves_states, refusal, plan, launch_path};

}  // namespace mamba2ssd::cuda

void mamba2ssd::detail::refuse_tma_maps_for_testing(bool refuse) { cuda::g_refuse_maps = refuse; }
void mamba2ssd::detail::set_prefill_request_groups_for_testing(int64_t groups) { cuda::g_request_groups = groups; }
