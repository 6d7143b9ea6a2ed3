// fwd_pass_state and compute_out tile kernels for float (chunk 64 and 128, head dim 32, 64, 128).
#include "cuda_tile/launch_tile_impl.cuh"

namespace mamba2ssd::cuda_tile {
template void launch_state_and_output<float>(const TileRun&, cudaStream_t);
}  // namespace mamba2ssd::cuda_tile
