// The CUDA Tile C++ backend of the forward (issue 7): the seed's three kernels written as tile
// kernels (ssd_tile.cuh). Plain C++17 header: safe to include from code built without -enable-tile.
//
// Reached through forward_cuda with ForwardParams::cuda_path == CudaPath::kTile in a build with
// MAMBA2SSD_TILE=ON (MAMBA2SSD_HAVE_TILE), or called directly. Same contract as forward_cuda:
// device memory, launches on `stream`, never synchronizes or allocates; the caller provides a
// 256-byte-aligned workspace of at least cuda_tile_workspace_bytes(p) bytes.
//
// Not covered (throws mamba2ssd::Error naming it): varlen_states, and cu_seqlens without seq_idx.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {

std::size_t cuda_tile_workspace_bytes(const ForwardParams& p);
void forward_cuda_tile(const ForwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream);

namespace tile_cpp {

// How the tile backend runs a call and where its scratch lies in the workspace (byte offsets from
// the workspace start). Exposed for the tests, which read the scratch back to check each stage.
struct TileLayout {
  int64_t chunk = 128;  // the kernels' chunk length: 64, or 128 (requested 128 and 256)
  int64_t nchunks = 0;
  int64_t lpad = 0;     // nchunks * chunk
  std::size_t dt = 0, g = 0, seq = 0, states = 0;  // offsets of the four sections
  std::size_t total = 0;
};
// [b, H, lpad] fp32 dt and g (g = within-chunk cumsum of A dt, times log2(e)); [b, lpad] int32
// sequence ids; [b, nchunks, H, P, N] fp32 state entering each chunk.
TileLayout tile_layout(const ForwardParams& p);

// Throws Error if this backend cannot run p (after validate(p)).
void check_tile_supports(const ForwardParams& p);

}  // namespace tile_cpp
}  // namespace mamba2ssd
