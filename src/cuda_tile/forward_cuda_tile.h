// The CUDA Tile C++ backend of the forward (issue 7): the seed's three kernels written as tile
// kernels (ssd_tile.cuh). Plain C++17 header: safe to include from code built without -enable-tile.
//
// The host interface every CUDA path of the library has: refusal, workspace_bytes, forward. Reached
// through forward_cuda with ForwardParams::cuda_path == CudaPath::kTile in a build with
// MAMBA2SSD_TILE=ON (MAMBA2SSD_HAVE_TILE), or called directly. Same contract as forward_cuda:
// device memory, launches on `stream`, never synchronizes or allocates; the caller provides a
// 256-byte-aligned workspace of at least workspace_bytes(p) bytes. Every function takes a p that
// has already passed validate(p) (the dispatch validates once).
//
// Not covered (refusal names it): varlen_states, cu_seqlens without seq_idx, nheads or batch above
// 65535.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda_tile {

// Why this backend cannot run p, as an error message; empty when it can.
std::string refusal(const ForwardParams& p);

// The workspace forward(p, ...) needs, in bytes. Throws Error if refusal(p) is non-empty.
std::size_t workspace_bytes(const ForwardParams& p);

// Launches the three kernels on `stream` (a cudaStream_t; null: the default stream). Throws Error
// if refusal(p) is non-empty, or if the workspace is null, smaller than workspace_bytes(p) or not
// 256-byte aligned. Ignores p.cuda_path.
void forward(const ForwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream);

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

}  // namespace mamba2ssd::cuda_tile
