// fwd_pass_state and compute_out tile kernels for float (chunk 64 and 128, head dim 32, 64, 128).
#include "launch_tile_impl.cuh"

namespace mamba2ssd::tile_cpp {
template void launch_state_and_output<float>(const TileRun&, cudaStream_t);
}  // namespace mamba2ssd::tile_cpp
