// The backward's Hopper kernels, host side (no CUDA types): whether each takes a call, and its
// launch. backward_path.cu chooses them over the portable kernels wherever they do: the walks
// (src/cuda/bwd/chunk_walks_sm90.cuh), chunk_grads (chunk_grads_sm90.cuh) and chunk_dbc
// (chunk_dbc_sm90.cuh).
#pragma once

#include <cstdint>
#include <string>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

struct BwdArgs;

// Why the Hopper walks cannot take p on the current device (empty if they can): sm_90a code and an
// sm_90 GPU, x, B, C, dout and z as TMA tiles, and the states' maps (fp32 inputs: TF32 products).
// The Hopper chunk kernels run only behind these walks, so this is their refusal too.
std::string walks_sm90_refusal(const BackwardParams& p);

// The state columns of one Hopper walk block (a block per such part of the state, each loading the
// chunk's x or dout and z): 64 with fp32 inputs, whose tiles take twice the bytes, else up to 128.
int64_t walks_sm90_cols(DType dtype, int64_t dstate);

// Both walks of the call (a's chunk_states and work.dstates, dinitial_states), in stream order
// after chunk_cumsum. a's segments (seg, adj) are those plan_backward chose.
void launch_walks_sm90(const BackwardParams& p, const BwdArgs& a, void* stream);

// Why the Hopper chunk_grads cannot take p (empty if it can), given walks_sm90_refusal(p): it runs
// only behind the Hopper walks (which checked the states' maps it reads), at head dim 32 or 64, and
// with fp32 inputs (TF32 products) at states of at most 128.
std::string grads_sm90_refusal(const BackwardParams& p, const std::string& walks_refusal);

// chunk_grads of the call, in stream order after the walks (which stored a's states); chained: as
// BwdPlan::chained().
void launch_grads_sm90(const BackwardParams& p, const BwdArgs& a, void* stream, bool chained);

// Why the Hopper chunk_dbc cannot take p (empty if it can), given walks_sm90_refusal(p): it runs
// only behind the Hopper walks (which checked the states' maps it reads), at head dim 32 or 64, with
// M's map, and at least kDbcSm90MinHeads heads a group (a block streams its group's heads; one head a
// block leaves it nothing to overlap); fp32 inputs on TF32 products.
constexpr int64_t kDbcSm90MinHeads = 2;
std::string dbc_sm90_refusal(const BackwardParams& p, const std::string& walks_refusal);

// chunk_dbc of the call (dB, dC), in stream order after chunk_grads (which stored a's M).
void launch_dbc_sm90(const BackwardParams& p, const BwdArgs& a, void* stream);

}  // namespace mamba2ssd::cuda
