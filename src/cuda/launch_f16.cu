#include "cuda/launch_impl.cuh"

namespace mamba2ssd::cuda {
template void launch_all<__half, 64>(const Args&, cudaStream_t);
template void launch_all<__half, 128>(const Args&, cudaStream_t);
template void launch_fused<__half>(const Args&, cudaStream_t, bool);
}  // namespace mamba2ssd::cuda
