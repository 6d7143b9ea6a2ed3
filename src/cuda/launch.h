// The launches of one (dtype, chunk) instance of the forward. Each dtype's instances compile in a
// translation unit of their own (launch_<dtype>.cu), so builds run in parallel.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/kernel_args.cuh"

namespace mamba2ssd::cuda {

// The three-kernel path (chunk 64 or 128).
template <typename T, int kChunk>
void launch_all(const Args& a, cudaStream_t stream);

// The fused path (chunk 128, head dim 64, state size up to 128); hopper: its wgmma kernels
// (state size up to 256, 16-bit types on sm_90 only; see hopper_kernels_built).
template <typename T>
void launch_fused(const Args& a, cudaStream_t stream, bool hopper);

// True if this build holds sm_90 code of the wgmma kernels.
bool hopper_kernels_built();

#define MAMBA2SSD_DECLARE_LAUNCH(T)                                   \
  extern template void launch_all<T, 64>(const Args&, cudaStream_t);  \
  extern template void launch_all<T, 128>(const Args&, cudaStream_t); \
  extern template void launch_fused<T>(const Args&, cudaStream_t, bool);
MAMBA2SSD_DECLARE_LAUNCH(__nv_bfloat16)
MAMBA2SSD_DECLARE_LAUNCH(__half)
MAMBA2SSD_DECLARE_LAUNCH(float)
#undef MAMBA2SSD_DECLARE_LAUNCH

}  // namespace mamba2ssd::cuda
