// The arguments of the backward's Hopper kernels: the backward's (args.cuh) and the TMA maps of the
// tiles they read (tensor_map.h: boxes of 64 rows x 64 columns, the 128-byte swizzle).
#pragma once

#include <cuda.h>  // CUtensorMap

#include "cuda/bwd/args.cuh"

namespace mamba2ssd::cuda {

// The walks' maps: the inputs' [batch, token, head or group, column] tensors.
struct BwdSm90Args : BwdArgs {
  CUtensorMap x_map, B_map, dout_map, z_map, C_map;
};

// chunk_grads_sm90's: the walks' and the states they stored, each [b, nchunks, H, P, N] section
// seen as [b x nchunks, P, H, N] (a chunk's and head's state is one tile of P rows).
struct GradsSm90Args : BwdSm90Args {
  CUtensorMap h_map, dh_map;
};

// chunk_dbc_sm90's: chunk_grads' and M, the workspace's [b, nchunks, H, Q, Q] section seen as
// [b x nchunks, Q, H, Q] (a chunk's and head's M is one tile of Q rows).
struct DbcSm90Args : GradsSm90Args {
  CUtensorMap m_map;
};

}  // namespace mamba2ssd::cuda
