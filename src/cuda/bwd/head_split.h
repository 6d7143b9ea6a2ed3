// Head dim 128 on the backward's Hopper kernels, which take head dims 32 and 64 (docs/backward.md,
// "Kernels"; perf-log "Backward b24"). The recurrence never mixes a head's rows: row p of the state
// reads x[.., p] and the head's dt, A, B and C, nothing of another row. So a head of 128 is two
// heads of 64 that share dt, A, dt_bias and D, and the gradients of those shared inputs are the
// sums of the two halves'.
// The call runs as 2H heads of 64: x, dout, z, dx, dz, the states (initial, dfinal, dinitial,
// saved) and D [H, P] are the same memory read with twice the heads; dt, A, dt_bias and D [H] are
// copied out per half into the workspace (expand), and ddt, dA, ddt_bias and dD [H] come back as
// the sums of the halves' (fold), in a fixed order (the same bits every run).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

struct HeadSplit {
  int64_t halves = 1;     // heads of 64 a head runs as (1: the call runs as it is)
  std::size_t bytes = 0;  // workspace ahead of the split call's own (the copies and the halves' sums)
};

// The split p can run as: head dim 128 with every head-major tensor's heads P rows apart (so that a
// half is a head of its own); else none. Whether it pays (the split call on the Hopper chunk_grads)
// the split call's own plan says (dispatch.cpp).
HeadSplit head_split_of(const BackwardParams& p);

// The split call, over its workspace section at `workspace` (s.bytes of it; null for planning, where
// the section's pointers stand in and nothing is read or written).
BackwardParams split_heads(const BackwardParams& p, const HeadSplit& s, void* workspace);

// Before the split call q's kernels, in stream order: q's copies of dt, A, dt_bias and D.
void launch_expand_heads(const BackwardParams& p, const BackwardParams& q, void* stream);
// After them: p's ddt, dA, ddt_bias and dD as the sums of q's.
void launch_fold_heads(const BackwardParams& p, const BackwardParams& q, void* stream);

}  // namespace mamba2ssd::cuda
