// Private to the tile backend: what the launches of one call receive, and the per-dtype launch
// functions (each dtype's kernels compile in a translation unit of their own).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_tile/forward_cuda_tile.h"

namespace mamba2ssd::cuda_tile {

struct TileRun {
  ForwardParams p;
  TileLayout layout;
  float* ws_dt = nullptr;
  float* ws_g = nullptr;
  int32_t* ws_seq = nullptr;
  float* ws_states = nullptr;
};

// fwd_pass_state and compute_out for x/B/C/z/y of element type T (__nv_bfloat16, __half, float).
template <typename T>
void launch_state_and_output(const TileRun& run, cudaStream_t stream);

// Kernel tiles: fwd_pass_state keeps a kStateP x kStateN piece of the state per block;
// compute_out walks N in blocks of kOutN.
constexpr int kStateP = 32;
constexpr int kStateN = 64;
constexpr int kOutN = 64;

}  // namespace mamba2ssd::cuda_tile
