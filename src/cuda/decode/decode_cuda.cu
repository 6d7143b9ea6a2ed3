// decode_cuda: one of decode_kernel.cuh's two kernels (the rows kernel unless a test or the CLI forces
// the other) and its work layout, then one launch.
// No allocation, no synchronization (the device's attributes are host queries, not stream work):
// safe in a CUDA graph.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>

#include "api/internal.h"
#include "cuda/common/check.h"
#include "cuda/common/device.h"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/decode/decode_rows_kernel.cuh"
#include "cuda/decode/decode_stream_kernel.cuh"

namespace mamba2ssd {
namespace cuda {
namespace {

// True if every chunk of the cache's rows (16 bytes, from n = 0 in steps of 16 bytes) starts at a
// 16-byte boundary: the base and the strides of the dimensions with more than one element.
bool rows_16_byte_aligned(const DecodeParams& p) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.state_dtype));
  if (reinterpret_cast<uintptr_t>(p.state) % 16 != 0) return false;
  const int64_t sizes[3] = {p.nslots, p.nheads, p.headdim};
  const int64_t strides[3] = {p.state_stride.s0, p.state_stride.s1, p.state_stride.s2};
  for (int i = 0; i < 3; ++i)
    if (sizes[i] > 1 && (strides[i] * es) % 16 != 0) return false;
  return true;
}

std::atomic<int> g_forced_kernel{0};                 // detail::set_decode_kernel_for_testing
std::atomic<int64_t> g_forced_units_per_warp{0};

// Which kernel runs a call, from the H200: the rows kernel, whatever the call. Since its loads were
// reordered (docs/perf-log.md, "Decode d7": the slot first, the inputs kept as loaded bits) it is
// ahead of the stream kernel at every fp32 size timed, one token, 32 heads of 64 x 128 (CLI, L2
// cleared, us, rows against stream: batch 32 24.5 / 26.7, 64 43.5 / 45.8, 128 81.8 / 83.9, 256
// 155.4 / 159.4), where before it the stream kernel took fp32 calls from 48 MiB of state ("Decode
// d5"). The stream kernel stays, chosen only when forced (CLI `decode --kernel stream`, tests).
bool use_stream_kernel() { return g_forced_kernel.load() == 2; }

// A row of the state is N / kV 16-byte chunks (at least 2: N is a multiple of 16); a lane holds
// `chunks` of one row, so a row takes L = chunks_per_row / chunks lanes, rounded up to a power of
// two (at most 32, which is enough: chunks_per_row <= 64).
int lanes_per_row(int64_t chunks_per_row, int chunks) {
  int L = 1;
  while (L * chunks < chunks_per_row) L *= 2;
  return L;
}

template <typename StateT, typename In, bool kVec>
void launch_rows(DecodeArgs a, int64_t chunks_per_row, cudaStream_t stream) {
  const int chunks = chunks_per_row >= kDecodeRowsChunks ? kDecodeRowsChunks : 2;
  a.lanes_per_row = lanes_per_row(chunks_per_row, chunks);
  a.tile_rows = kDecodeWarps * (32 / a.lanes_per_row);  // a block's 4 warps
  a.row_tiles = static_cast<int>((a.headdim + a.tile_rows - 1) / a.tile_rows);
  // x: (head, row tile); y: requests, up to the grid's limit (the kernel strides over the rest).
  const dim3 grid(static_cast<unsigned>(a.nheads * a.row_tiles), static_cast<unsigned>(std::min<int64_t>(a.batch, 65535)));
  const auto kernel = chunks == kDecodeRowsChunks ? decode_rows_kernel<StateT, In, kDecodeRowsChunks, kVec>
                                                  : decode_rows_kernel<StateT, In, 2, kVec>;
  kernel<<<grid, kDecodeThreads, 0, stream>>>(a);
  cuda_check(cudaGetLastError(), "decode_rows_kernel launch");
}

// The inputs' dtype as the rows kernel's template parameter.
template <typename StateT, bool kVec>
void launch_rows(DecodeArgs a, int64_t chunks_per_row, cudaStream_t stream) {
  dispatch_dtype(a.dtype, [&](auto in) { launch_rows<StateT, decltype(in), kVec>(a, chunks_per_row, stream); });
}

// Warps of the stream kernel that run at once on one multiprocessor: its launch bounds guarantee
// the registers of kDecodeStreamMinBlocks blocks, and the shared memory may hold fewer (an sm_80
// holds four). From the device's attributes, not an occupancy query, so that the count is the same
// under graph capture.
template <typename StateT>
int64_t stream_warps_per_sm(const DeviceInfo& device) {
  constexpr int kPerBlock = decode_stream_smem_bytes<StateT>() + 1024;  // the runtime reserves 1 KiB a block
  const int blocks = std::clamp(device.smem_per_sm / kPerBlock, 1, kDecodeStreamMinBlocks);
  return int64_t{blocks} * kDecodeWarps;
}

template <typename StateT, bool kVec>
void launch_stream(DecodeArgs a, int64_t chunks_per_row, const DeviceInfo& device, cudaStream_t stream) {
  a.lanes_per_row = lanes_per_row(chunks_per_row, decode_stream_chunks<StateT>());
  a.tile_rows = 32 / a.lanes_per_row;  // a warp's
  a.row_tiles = static_cast<int>((a.headdim + a.tile_rows - 1) / a.tile_rows);
  a.units = a.batch * a.nheads * a.row_tiles;
  // One wave of warps, each taking an equal contiguous range of units (the last ones may be
  // idle); small calls get one unit a warp, so that every unit starts at once.
  const int64_t warps = std::min<int64_t>(a.units, device.sm_count * stream_warps_per_sm<StateT>(device));
  const int64_t forced = g_forced_units_per_warp.load();
  a.units_per_warp = forced > 0 ? forced : (a.units + warps - 1) / warps;
  const int64_t busy_warps = (a.units + a.units_per_warp - 1) / a.units_per_warp;
  const auto blocks = static_cast<unsigned>((busy_warps + kDecodeWarps - 1) / kDecodeWarps);
  decode_stream_kernel<StateT, kVec><<<blocks, kDecodeThreads, 0, stream>>>(a);
  cuda_check(cudaGetLastError(), "decode_stream_kernel launch");
}

template <typename StateT>
void launch_for(const DecodeParams& p, const DecodeArgs& a, const DeviceInfo& device, cudaStream_t stream) {
  if (a.batch == 0) return;  // no requests
  const int64_t chunks_per_row = a.dstate / (16 / static_cast<int64_t>(sizeof(StateT)));
  const bool vec = rows_16_byte_aligned(p);
  if (use_stream_kernel())
    vec ? launch_stream<StateT, true>(a, chunks_per_row, device, stream)
        : launch_stream<StateT, false>(a, chunks_per_row, device, stream);
  else
    vec ? launch_rows<StateT, true>(a, chunks_per_row, stream) : launch_rows<StateT, false>(a, chunks_per_row, stream);
}

}  // namespace
}  // namespace cuda

void decode_cuda(const DecodeParams& p, void* stream) {
  validate(p);
  const cuda::DeviceInfo device = cuda::current_device();  // throws CudaError naming a GPU below sm_80
  using namespace cuda;
  DecodeArgs a{};
  a.batch = p.batch, a.ntokens = p.ntokens, a.nheads = p.nheads, a.headdim = p.headdim, a.dstate = p.dstate;
  a.heads_per_group = p.nheads / p.ngroups;
  a.dtype = p.dtype, a.dt_dtype = p.dt_dtype;
  const auto outer3 = [](const Strides4& s) { return Strides3{s.s0, s.s1, s.s2}; };  // s3 is 1 (validate)
  a.state = p.state, a.state_stride = outer3(p.state_stride);
  a.x = p.x, a.x_stride = outer3(p.x_stride), a.dt = p.dt, a.dt_stride = p.dt_stride, a.A = p.A;
  a.B = p.B, a.B_stride = outer3(p.B_stride), a.C = p.C, a.C_stride = outer3(p.C_stride);
  a.D_layout = p.D_layout, a.D = p.D, a.z = p.z, a.z_stride = outer3(p.z_stride), a.dt_bias = p.dt_bias;
  a.dt_softplus = p.dt_softplus, a.dt_min = p.dt_min, a.dt_max = p.dt_max;
  a.slots = decode_slots(p);
  a.out = p.out, a.out_stride = outer3(p.out_stride);

  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.state_dtype) {
    case DType::kF32: return launch_for<float>(p, a, device, s);
    case DType::kF16: return launch_for<__half>(p, a, device, s);
    case DType::kBF16: return launch_for<__nv_bfloat16>(p, a, device, s);
  }
}

namespace detail {

void set_decode_kernel_for_testing(int kernel, int64_t units_per_warp) {
  cuda::g_forced_kernel = kernel;
  cuda::g_forced_units_per_warp = units_per_warp;
}

void decode_cuda_blocking(const DecodeParams& p, void* stream) {
  validate(p);
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is available");
  decode_cuda(p, stream);
  cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

}  // namespace detail
}  // namespace mamba2ssd
