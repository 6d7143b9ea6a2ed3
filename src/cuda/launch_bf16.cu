#include "cuda/launch_impl.cuh"

namespace mamba2ssd::cuda {
template void launch_all<__nv_bfloat16, 64>(const Args&, cudaStream_t);
template void launch_all<__nv_bfloat16, 128>(const Args&, cudaStream_t);
template void launch_fused<__nv_bfloat16>(const Args&, cudaStream_t, bool);

// The wgmma kernels exist as sm_90 code in this build (else they trap; see chunk_scan_hopper.cuh).
bool hopper_kernels_built() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, chunk_scan_hopper_kernel<__nv_bfloat16, 128, false>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
}
}  // namespace mamba2ssd::cuda
