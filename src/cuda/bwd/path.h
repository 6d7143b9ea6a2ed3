// The CUDA backward's host side (no CUDA types): its plan, why it refuses a call, its launch.
// One path (the portable one, sm_80 and newer) whose two walks and chunk_grads run on Hopper's TMA
// and wgmma where they can (kernels_sm90.h).
#pragma once

#include <cstddef>
#include <string>

#include "cuda/common/device.h"
#include "cuda/fwd/plan.h"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

struct BwdPlan {
  FwdPlan fwd;  // chunk_cumsum's sections and the state entering each chunk, for chunks of 64
  // The backward's own sections in bytes, after the forward's, each a multiple of 256.
  std::size_t dstates = 0, intra = 0, dA = 0, ddt_bias = 0, dD = 0;
  // The Hopper walks (fwd.nsegs segments per direction): the adjoint's segment ends (their entries
  // lie over them, as the forward direction's over fwd.seg_ends) and decays.
  bool sm90_walks = false;
  std::size_t adj_ends = 0, adj_decay = 0;
  bool sm90_grads = false;  // chunk_grads on Hopper (kernels_sm90.h)
  bool sm90_dbc = false;    // chunk_dbc on Hopper (kernels_sm90.h)
  // Every launch after chunk_cumsum chained to the one before it (programmatic dependent launch: each
  // kernel waits for the one before it at its start) where it was measured to pay (docs/perf-log.md,
  // "Backward b8"): with the Hopper walks, 8-12 us a call; the portable chain came out 2% slower
  // chained. (The Hopper walks and chunk_dbc chain always: they run only with those walks;
  // chunk_grads, which fp32 may run behind the portable walks, as this says.)
  bool chained() const { return sm90_walks; }
  std::size_t total() const { return fwd.total() + dstates + intra + dA + ddt_bias + dD + adj_ends + adj_decay; }
};

// The walks that run: the forward's (the state entering each chunk) and the adjoint's, or the
// adjoint's alone when the forward saved the states (ForwardParams::saved_states).
constexpr int64_t walk_directions(const ForwardParams& f) { return f.saved_states ? 1 : 2; }

// The states for the backward where the forward's path does not save them itself
// (ForwardParams::saved_states; FwdPath::saves_states): chunk_cumsum at the backward's chunk, then
// the backward's portable state walk into saved_states, after the path (its workspace: the bytes).
std::size_t saved_states_walk_bytes(const ForwardParams& f);
void launch_saved_states_walk(const ForwardParams& f, void* workspace, void* stream);

// Why the CUDA backward cannot run p on the current device; empty if it can. p is valid.
std::string backward_refusal(const BackwardParams& p);
BwdPlan plan_backward(const BackwardParams& p);
// BwdPlan::fwd where the Hopper walks run p on a GPU like d: chunk_cumsum's sections and the walks'
// segments. A host computation, so that a test needs no GPU.
FwdPlan walks_sm90_plan(const ForwardParams& p, const DeviceInfo& d);
void launch_backward(const BackwardParams& p, const BwdPlan& plan, void* workspace, void* stream);

}  // namespace mamba2ssd::cuda
