#include "cuda/launch_impl.cuh"

namespace mamba2ssd::cuda {
template void launch_all<__nv_bfloat16, 64>(const Args&, cudaStream_t);
template void launch_all<__nv_bfloat16, 128>(const Args&, cudaStream_t);
template void launch_fused<__nv_bfloat16>(const Args&, cudaStream_t);
}  // namespace mamba2ssd::cuda
