// decode_cuda: the thread layout of decode_kernel.cuh chosen from the shape, then one launch.
// No allocation, no synchronization, no device query: safe in a CUDA graph.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "api/internal.h"
#include "cuda/common/check.h"
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
  // One block per work item up to the grid's limit; the kernel strides over the rest.
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(a.work, std::numeric_limits<int32_t>::max()));
  auto go = [&](auto kernel) {
    kernel<<<blocks, kDecodeThreads, 0, stream>>>(a);
    cuda_check(cudaGetLastError(), "decode_kernel launch");
  };
  if (chunks == 1) vec ? go(decode_kernel<StateT, 1, true>) : go(decode_kernel<StateT, 1, false>);
  else vec ? go(decode_kernel<StateT, 2, true>) : go(decode_kernel<StateT, 2, false>);
}

}  // namespace
}  // namespace cuda

void decode_cuda(const DecodeParams& p, void* stream) {
  validate(p);
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

  // Layout: a row is `chunks_per_row` 16-byte chunks, spread over L lanes (a power of two, at most
  // 32) with one or two chunks each; a thread holds kDecodeRegChunks chunks.
  const int64_t kV = 16 / static_cast<int64_t>(dtype_size(p.state_dtype));
  const int64_t chunks_per_row = p.dstate / kV;  // dstate is a multiple of 16
  int L = 1;
  while (L < chunks_per_row && L < 32) L *= 2;
  const int chunks = static_cast<int>((chunks_per_row + L - 1) / L);  // 1, or 2 for fp32 with N > 128
  a.lanes_per_row = L;
  a.tile_rows = (kDecodeRegChunks / chunks) * (kDecodeThreads / 32) * (32 / L);
  a.row_tiles = (p.headdim + a.tile_rows - 1) / a.tile_rows;
  a.work = p.batch * p.nheads * a.row_tiles;

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
