#include "cuda/launch_impl.cuh"

namespace mamba2ssd::cuda {
template void launch_all<float, 64>(const Args&, cudaStream_t);
template void launch_all<float, 128>(const Args&, cudaStream_t);
template void launch_fused<float>(const Args&, cudaStream_t, bool);
}  // namespace mamba2ssd::cuda
