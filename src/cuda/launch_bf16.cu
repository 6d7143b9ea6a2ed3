#include "cuda/launch_impl.cuh"

namespace mamba2ssd::cuda {
template void launch_all<__nv_bfloat16, 64>(const Args&, cudaStream_t);
template void launch_all<__nv_bfloat16, 128>(const Args&, cudaStream_t);
template void launch_fused<__nv_bfloat16>(const Args&, cudaStream_t, bool);

// The wgmma kernels exist as sm_90a code in this build and the device runs it (else their body
// traps; see chunk_scan_hopper.cuh). binaryVersion reads 90 for plain sm_90 code too, so the build
// says whether its targets include sm_90a (MAMBA2SSD_SM90A_CODE, set by CMake and setup.py).
bool hopper_kernels_built() {
#ifdef MAMBA2SSD_SM90A_CODE
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, chunk_scan_hopper_kernel<__nv_bfloat16, 128>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
#else
  return false;
#endif
}
}  // namespace mamba2ssd::cuda
