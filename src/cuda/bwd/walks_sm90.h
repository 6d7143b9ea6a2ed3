// The backward's Hopper walks, host side (no CUDA types): whether they take a call, and their
// launch (src/cuda/bwd/chunk_walks_sm90.cuh), which backward_path.cu chooses over the portable
// walks wherever they do.
#pragma once

#include <string>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

struct BwdArgs;

// Why the Hopper walks cannot take p on the current device (empty if they can): sm_90a code and an
// sm_90 GPU, 16-bit inputs, and x, B, C, dout and z as TMA tiles.
std::string walks_sm90_refusal(const BackwardParams& p);

// Both walks of the call (a's chunk_states and work.dstates, dinitial_states), in stream order
// after chunk_cumsum. a's segments (seg, adj) are those plan_backward chose.
void launch_walks_sm90(const BackwardParams& p, const BwdArgs& a, void* stream);

}  // namespace mamba2ssd::cuda
