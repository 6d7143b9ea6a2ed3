// The fused walks (fused and hopper paths), between their two passes: the state entering each
// segment, from the segments' own end states (computed from zero, in parallel) and their decays,
// both from the first pass:
//   entry_0 = initial state,  entry_{s+1} = decay_s entry_s + end_s
// A segment's decay is the product of its chunks' decays; where a sequence starts inside it the
// first pass leaves kSegmentCut, and entry_{s+1} = end_s (next_segment_entry, common/segment_entry.h).
// One thread per 4 state elements of one (batch, head) (16-byte accesses; states are [P][kN]), a
// short sequential loop over segments. Behind the first pass on the Hopper path (programmatic
// dependent launch).
#pragma once

#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/state_steps.cuh"

namespace mamba2ssd::cuda {

constexpr int kSegmentEntriesThreads = 256;
constexpr int kSegmentEntriesElems = 4;  // state elements per thread

template <int kN>
__global__ void __launch_bounds__(kSegmentEntriesThreads) segment_entries_kernel(FwdArgs a) {
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kSegmentEntriesThreads + threadIdx.x) * kSegmentEntriesElems;
  if (i >= geo.headdim * kN) return;
  float4 state = {0.0f, 0.0f, 0.0f, 0.0f};
  if (io.initial_states) {
    float* v = &state.x;
    for (int k = 0; k < kSegmentEntriesElems; ++k) {
      const int64_t pi = (i + k) / kN, ni = (i + k) % kN;
      if (ni < geo.dstate) v[k] = io.initial_states[state_offset(io.initial_states_stride, b, h, pi, ni)];
    }
  }
  wait_previous_kernel();  // the first pass's end states and decays
  start_next_kernel();
  // Consecutive segments of one (batch, head) lie seg_stride apart. The end states and decays are
  // loaded kBatch segments at a time before any is used, so that their loads overlap (4: 44
  // registers, so that the 640 blocks of 80 heads fit the GPU at once).
  const int64_t seg_stride = geo.nheads * geo.headdim * kN;
  const float4* ends = reinterpret_cast<const float4*>(seg_state<kN>(a.seg.ends, a, b, 0, h) + i);
  float4* entries = reinterpret_cast<float4*>(seg_state<kN>(a.seg.entries, a, b, 0, h) + i);
  constexpr int kBatch = 4;
  for (int64_t seg0 = 0; seg0 < a.seg.count; seg0 += kBatch) {
    float4 end[kBatch];
    float decay[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (seg0 + k + 1 < a.seg.count) {
        end[k] = ends[(seg0 + k) * seg_stride / kSegmentEntriesElems];
        decay[k] = seg_decay(a, b, seg0 + k, h);
      }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t seg = seg0 + k;
      if (seg >= a.seg.count) break;
      entries[seg * seg_stride / kSegmentEntriesElems] = state;
      if (seg + 1 == a.seg.count) break;
      const float d = decay[k];
      state = {next_segment_entry(d, state.x, end[k].x), next_segment_entry(d, state.y, end[k].y),
               next_segment_entry(d, state.z, end[k].z), next_segment_entry(d, state.w, end[k].w)};
    }
  }
}

// The state entering each segment, from the first pass's end states and decays (with several
// segments). behind: chained to the first pass (programmatic dependent launch; the sm_90 path).
template <int kN>
void launch_segment_entries(const FwdArgs& a, cudaStream_t stream, bool behind) {
  constexpr int kPerBlock = kSegmentEntriesThreads * kSegmentEntriesElems;
  const dim3 grid(static_cast<unsigned>((a.geo.headdim * kN + kPerBlock - 1) / kPerBlock),
                  static_cast<unsigned>(a.geo.nheads), static_cast<unsigned>(a.geo.batch));
  launch(segment_entries_kernel<kN>, "segment_entries_kernel", grid, kSegmentEntriesThreads, 0, stream, a, behind);
}

}  // namespace mamba2ssd::cuda
