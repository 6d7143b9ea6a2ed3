// The backward's kernel arguments, layered on the forward's (fwd/args.cuh): the cotangents, the
// gradients, and the backward's workspace sections. Built once per call on the host (make_bwd_args).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/fwd/args.cuh"

namespace mamba2ssd::cuda {

// The backward runs chunks of 64 tokens (the function does not depend on the chunk length).
constexpr int kBwdChunk = 64;

// Cotangents and gradients (device pointers, element strides as in BackwardParams).
struct BwdTensors {
  const void* dout;  Strides4 dout_stride;                        // [b, L, H, P]
  const float* dfinal_states;  Strides4 dfinal_states_stride;     // [b, H, P, N] or null
  void* dx;  Strides4 dx_stride;
  void* ddt; Strides3 ddt_stride;                                 // dt_dtype
  float* dA;
  void* dB;  Strides4 dB_stride;
  void* dC;  Strides4 dC_stride;
  float* dD;                                                      // D's layout
  void* dz;  Strides4 dz_stride;
  float* ddt_bias;
  float* dinitial_states;  Strides4 dinitial_states_stride;
  bool dout_aligned, z_aligned;  // 16-byte rows: staged with cp.async
  bool dx_pairs, dz_pairs, dB_pairs, dC_pairs;  // two adjacent elements in one access
};

// Workspace sections of the backward besides the forward's (FwdArgs::chunk_states holds the state
// entering each chunk, stored as T).
struct BwdWork {
  void* dstates;   // [b, nchunks, H, P, N] of T: the adjoint of the state leaving each chunk
  void* intra;     // [b, nchunks, H, Q, Q] of T: (dy_i . x_j) exp2(g_i - g_j) dt_j, causal, one sequence
  float* dA;       // [b, nchunks, H]: each chunk's part of dA
  float* ddt_bias; // [b, nchunks, H]: of ddt_bias
  float* dD;       // [b, nchunks, H, P]: of dD (summed over P for D per head)
};

struct BwdArgs : FwdArgs {
  BwdTensors grad;
  BwdWork work;
  // The Hopper walks' segments of the adjoint's walk, in its walk order (the forward walk's are
  // FwdArgs::seg; the entries lie over the ends: chunk_walks_sm90.cuh).
  Segments adj;
};

// A walk block's direction and batch row from the grid's z: the forward's walk on the first batch
// rows, the adjoint's on the next; with the states the forward saved (FwdArgs::saved_states: the
// backward reads them, chunk_states points there) the adjoint's alone, on batch rows.
struct WalkRow {
  bool adjoint;
  unsigned b;
};
__device__ __forceinline__ WalkRow walk_row(const BwdArgs& a, unsigned z) {
  const auto batch = static_cast<unsigned>(a.geo.batch);
  if (a.saved_states) return {true, z};
  return {z >= batch, z >= batch ? z - batch : z};
}

// Offset of (b, c, h) in a [b, nchunks, H, ...] section, in units of the trailing block.
__device__ __forceinline__ int64_t chunk_head(const ScanArgs& a, int64_t b, int64_t c, int64_t h) {
  return (b * a.scan.nchunks + c) * a.geo.nheads + h;
}

}  // namespace mamba2ssd::cuda
