// decode_cuda: the work layout of decode_kernel.cuh chosen from the shape, then one launch.
// No allocation, no synchronization (the device's properties and the kernel's occupancy are host
// queries, not stream work): safe in a CUDA graph.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "api/internal.h"
#include "cuda/common/check.h"
#include "cuda/common/device.h"
#include "cuda/decode/decode_kernel.cuh"

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

// Warps of decode_kernel<StateT, ...> that run at once on one multiprocessor (queried once per
// instantiation: the count depends on the kernel's registers and shared memory, not on the call).
template <typename Kernel>
int resident_warps_per_sm(Kernel kernel) {
  int blocks = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kDecodeThreads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(decode_kernel)");
  return std::max(blocks, 1) * kDecodeWarps;
}

template <typename StateT, bool kVec>
void launch(DecodeArgs a, int sm_count, cudaStream_t stream) {
  if (a.units == 0) return;  // no requests
  const auto kernel = decode_kernel<StateT, kVec>;
  static const int warps_per_sm = resident_warps_per_sm(kernel);
  // One wave of warps, each taking an equal contiguous range of units (the last ones may be
  // idle); small calls get one unit a warp, so that every unit starts at once.
  const int64_t warps = std::min<int64_t>(a.units, static_cast<int64_t>(sm_count) * warps_per_sm);
  a.units_per_warp = (a.units + warps - 1) / warps;
  const int64_t busy_warps = (a.units + a.units_per_warp - 1) / a.units_per_warp;
  const auto blocks = static_cast<unsigned>((busy_warps + kDecodeWarps - 1) / kDecodeWarps);
  kernel<<<blocks, kDecodeThreads, 0, stream>>>(a);
  cuda_check(cudaGetLastError(), "decode_kernel launch");
}

template <typename StateT>
void launch_for(DecodeArgs a, bool vec, int sm_count, cudaStream_t stream) {
  // A row of the state is N / kV chunks (at least 2: N is a multiple of 16); a lane holds
  // `chunks` of one row, so a row takes L = chunks_per_row / chunks lanes, rounded up to a power
  // of two (at most 32, which is enough: chunks_per_row <= 64). A warp's unit is then 32 / L rows
  // of one (request, head).
  const int64_t chunks_per_row = a.dstate / (16 / static_cast<int64_t>(sizeof(StateT)));
  int L = 1;
  while (L * decode_chunks<StateT>() < chunks_per_row) L *= 2;
  a.lanes_per_row = L;
  a.row_tiles = static_cast<int>((a.headdim + 32 / L - 1) / (32 / L));
  a.units = a.batch * a.nheads * a.row_tiles;
  vec ? launch<StateT, true>(a, sm_count, stream) : launch<StateT, false>(a, sm_count, stream);
}

}  // namespace
}  // namespace cuda

void decode_cuda(const DecodeParams& p, void* stream) {
  validate(p);
  const int sm_count = cuda::current_device().sm_count;  // throws CudaError naming a GPU below sm_80
  using namespace cuda;
  DecodeArgs a{};
  a.batch = p.batch, a.ntokens = p.ntokens, a.nheads = p.nheads, a.headdim = p.headdim, a.dstate = p.dstate;
  a.heads_per_group = p.nheads / p.ngroups;
  a.dtype = p.dtype, a.dt_dtype = p.dt_dtype;
  a.state = p.state, a.state_stride = p.state_stride;
  a.x = p.x, a.x_stride = p.x_stride, a.dt = p.dt, a.dt_stride = p.dt_stride, a.A = p.A;
  a.B = p.B, a.B_stride = p.B_stride, a.C = p.C, a.C_stride = p.C_stride;
  a.D_layout = p.D_layout, a.D = p.D, a.z = p.z, a.z_stride = p.z_stride, a.dt_bias = p.dt_bias;
  a.dt_softplus = p.dt_softplus, a.dt_min = p.dt_min, a.dt_max = p.dt_max;
  a.slots = decode_slots(p);
  a.out = p.out, a.out_stride = p.out_stride;

  const bool vec = rows_16_byte_aligned(p);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.state_dtype) {
    case DType::kF32: return launch_for<float>(a, vec, sm_count, s);
    case DType::kF16: return launch_for<__half>(a, vec, sm_count, s);
    case DType::kBF16: return launch_for<__nv_bfloat16>(a, vec, sm_count, s);
  }
}

namespace detail {

void decode_cuda_blocking(const DecodeParams& p, void* stream) {
  validate(p);
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is available");
  decode_cuda(p, stream);
  cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

}  // namespace detail
}  // namespace mamba2ssd
