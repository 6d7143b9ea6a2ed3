// decode_cuda: the thread layout of decode_kernel.cuh chosen from the shape, then one launch.
// No allocation, no synchronization, no device query: safe in a CUDA graph.
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

template <typename StateT>
void launch_for(const DecodeArgs& a, int chunks, bool vec, cudaStream_t stream) {
  // x: (head, row tile); y: requests, up to the grid's limit (the kernel strides over the rest).
  const dim3 grid(static_cast<unsigned>(a.nheads * a.row_tiles), static_cast<unsigned>(std::min<int64_t>(a.batch, 65535)));
  auto go = [&](auto kernel) {
    kernel<<<grid, kDecodeThreads, 0, stream>>>(a);
    cuda_check(cudaGetLastError(), "decode_kernel launch");
  };
  if (chunks == kDecodeChunks) vec ? go(decode_kernel<StateT, kDecodeChunks, true>) : go(decode_kernel<StateT, kDecodeChunks, false>);
  else vec ? go(decode_kernel<StateT, 2, true>) : go(decode_kernel<StateT, 2, false>);
}

}  // namespace
}  // namespace cuda

void decode_cuda(const DecodeParams& p, void* stream) {
  validate(p);
  cuda::current_device();  // throws CudaError naming a GPU below sm_80
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

  // Layout: a row of the state is `chunks_per_row` 16-byte chunks (a multiple of 2: dstate is a
  // multiple of 16); a thread holds kDecodeChunks of one row (2 if the row has only 2), so a row
  // takes L = chunks_per_row / chunks lanes, rounded up to a power of two (at most 32, which is
  // enough: chunks_per_row <= 64). A block's 4 warps then take 4 * 32 / L rows.
  const int64_t kV = 16 / static_cast<int64_t>(dtype_size(p.state_dtype));
  const int64_t chunks_per_row = p.dstate / kV;
  const int chunks = chunks_per_row >= kDecodeChunks ? kDecodeChunks : 2;
  int L = 1;
  while (L * chunks < chunks_per_row) L *= 2;
  a.lanes_per_row = L;
  a.tile_rows = (kDecodeThreads / 32) * (32 / L);
  a.row_tiles = static_cast<int>((p.headdim + a.tile_rows - 1) / a.tile_rows);
  const bool vec = rows_16_byte_aligned(p);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.state_dtype) {
    case DType::kF32: return launch_for<float>(a, chunks, vec, s);
    case DType::kF16: return launch_for<__half>(a, chunks, vec, s);
    case DType::kBF16: return launch_for<__nv_bfloat16>(a, chunks, vec, s);
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
