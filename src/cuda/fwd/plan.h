// How one forward call runs on the GPU (host side, no CUDA types): the path, its chunking and
// segments, and the workspace sections. Planning is a pure function of the call and the device, so
// cuda_workspace_bytes and forward_cuda agree (dispatch.cpp); the tests read intermediate results
// back through carve().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

// The fused walks cut a sequence into at most this many segments (more would buy nothing: the
// segment count is sized to one wave of blocks).
constexpr int kMaxSegments = 32;

// The fused walks' state width: state sizes up to 64 run as 64 columns, up to 128 as 128, larger
// ones (Hopper path only) as 256 (the kernels' kN; the columns past dstate stay zero).
constexpr int fused_state_cols(int64_t dstate) { return dstate <= 64 ? 64 : dstate <= 128 ? 128 : 256; }

// The fused walks' head-dim columns per block: a head of head dim P runs as ceil(P / 64) blocks per
// segment, each with 64 columns of x, y and the state (P 32: one block, columns 32..63 zero). The
// columns of a head are independent given B, C, dt and A, so the blocks share nothing but the reads
// of B and C (and the C B^T that each recomputes).
constexpr int kWalkPCols = 64;
constexpr int64_t walk_ptiles(int64_t headdim) { return (headdim + kWalkPCols - 1) / kWalkPCols; }

// Blocks of the Hopper kernels that share a multiprocessor (one warpgroup each; the segment count
// is sized to them). The main kernel with state size 256 runs two warpgroups, one block per
// multiprocessor.
constexpr int kSm90BlocksPerSm = 2;
constexpr int sm90_blocks_per_sm(int64_t dstate) { return dstate > 128 ? 1 : kSm90BlocksPerSm; }

// The pace the segment plans assume, from H200 measurements: DRAM's speed (bench.py's copy
// ceiling) and a Hopper forward walk's chunk step of 128 tokens at one block a multiprocessor
// (docs/perf-log.md, "Prefill p6": 3.1 us a step of 64 tokens at state size 256).
constexpr double kDramBytesPerUs = 4.27e6, kFwdChunkStepUs = 6.2;

// A workspace section's bytes, rounded up so that the next section starts as aligned as the
// workspace itself (256 bytes: every CUDA entry point asks for it; TMA and cp.async need 16).
constexpr std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

struct FwdPlan {
  CudaPath path = CudaPath::kThreeKernel;
  int64_t chunk = 128;   // the kernels' chunk length: 64 or 128
  int64_t nchunks = 0, lpad = 0;
  int64_t nsegs = 1, seg_chunks = 0;  // the fused walks: segments of seg_chunks chunks
  int64_t ptiles = 1;                 // the fused walks: blocks per segment and head (walk_ptiles)
  bool request_segments = false;      // the packed prefill: segments of whole requests (nsegs of them)
  // Workspace sections in bytes, in the order carve() lays them out, each a multiple of 256.
  std::size_t dt = 0, g = 0, seq = 0;            // chunk_cumsum's results (ChunkScan)
  std::size_t chunk_states = 0;                  // three-kernel: the state entering each chunk
  std::size_t seg_ends = 0, seg_entries = 0;     // fused walks: [b, nsegs, H, P, state cols]
  std::size_t seg_decay = 0;                     // fused walks: [b, nsegs, H]
  std::size_t carry = 0;                         // fused walks with varlen states: [nchunks] int32
  std::size_t own_layout = 0;                    // a backend that lays out its workspace itself
  std::size_t total() const {
    return dt + g + seq + chunk_states + seg_ends + seg_entries + seg_decay + carry + own_layout;
  }
  // e.g. "chunk 128, 8 segments of 16 chunks, workspace 3.1 MB"; `workspace`: the whole call's, where
  // this plan is part of a larger one (the backward's)
  std::string describe(std::size_t workspace) const;
  std::string describe() const { return describe(total()); }
};

// The sections of a plan in a workspace (null where a section is empty).
struct FwdWorkspace {
  float *dt, *g;
  int32_t* seq;
  float *chunk_states, *seg_ends, *seg_entries, *seg_decay;
  int32_t* carry;
};
FwdWorkspace carve(const FwdPlan& plan, void* workspace);

// Why the grids of the forward's kernels (heads on y, batch rows on z) cannot hold p; empty if they can.
std::string grid_refusal(const ForwardParams& p);

// Whether a test (or the CLI's --segments) fixed the fused walks' segment count
// (detail::set_fused_segments_for_testing).
bool segments_forced_for_testing();

// The parts of a plan every path shares: chunk_cumsum's sections for chunks of `chunk` tokens.
FwdPlan scan_plan(const ForwardParams& p, CudaPath path, int64_t chunk);
// What a segment plan weighs besides the chunk steps of its longest run of waves (choose_segments).
struct SegmentModel {
  int64_t max_blocks = 0;  // > 0: no more segments than keep all their blocks within it (at least one)
  double floor = 0.0;      // chunk steps of one block the main pass's bytes take at DRAM speed
  double step_us = kFwdChunkStepUs;  // the time of a chunk step, which prices the segments' states
  double second_pass = 1.35;         // a split walk's steps, as a factor: its pass over the segment ends
  double block_steps = 0.0;          // a block's fixed cost, in chunk steps, once a wave
};

// The Hopper forward's walk (and the packed prefill's): a block's start and end cost about a chunk
// step, and the second pass less than the walks' 1.35. Fitted to the forced-segment sweep of eleven
// shapes (docs/perf-log.md, v19: the plan within 3.3% of each shape's best count, where 0 and 1.35
// left six of them 7-16% slower).
constexpr SegmentModel kSm90FwdSegments{0, 0.0, kFwdChunkStepUs, 1.3, 1.0};

// The fused walks' segments (chosen for `slots` blocks running at once, priced by `model`), their
// head-dim tiles and their sections, and with varlen states the chunks' carried sequences
// (ChunkScan::carry).
void plan_segments(FwdPlan& plan, const ForwardParams& p, int64_t slots, const SegmentModel& model = {});

}  // namespace mamba2ssd::cuda
