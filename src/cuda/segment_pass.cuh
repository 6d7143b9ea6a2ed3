// Fused path, between its two passes: the state entering each segment, from the segments' own end
// states (computed from zero, in parallel) and their decays, both from the first pass:
//   entry_0 = initial state,  entry_{s+1} = decay_s entry_s + end_s
// A segment's decay is the product of its chunks' decays (zero if a sequence starts inside it).
// One thread per 4 state elements of one (batch, head) (16-byte accesses; states are [P][kN]), a
// short sequential loop over segments. Behind the first pass on the Hopper path (programmatic
// dependent launch).
#pragma once

#include "cuda/kernel_args.cuh"

namespace mamba2ssd::cuda {

constexpr int kSegmentPassThreads = 256;
constexpr int kSegmentPassElems = 4;  // state elements per thread

template <int kN>
__global__ void __launch_bounds__(kSegmentPassThreads) segment_pass_kernel(Args a) {
  const ForwardParams& p = a.p;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kSegmentPassThreads + threadIdx.x) * kSegmentPassElems;
  if (i >= p.headdim * kN) return;
  float4 state = {0.0f, 0.0f, 0.0f, 0.0f};
  if (p.initial_states) {
    const Strides4& s = p.initial_states_stride;
    float* v = &state.x;
    for (int k = 0; k < kSegmentPassElems; ++k) {
      const int64_t pi = (i + k) / kN, ni = (i + k) % kN;
      if (ni < p.dstate) v[k] = p.initial_states[b * s.s0 + h * s.s1 + pi * s.s2 + ni];
    }
  }
  wait_previous_kernel();  // the first pass's end states and decays
  start_next_kernel();
  // Consecutive segments of one (batch, head) lie seg_stride apart. The end states and decays are
  // loaded kBatch segments at a time before any is used, so that their loads overlap (4: 44
  // registers, so that the 640 blocks of 80 heads fit the GPU at once).
  const int64_t seg_stride = p.nheads * p.headdim * kN;
  const float4* ends = reinterpret_cast<const float4*>(seg_state<kN>(a.ws.seg_ends, a, b, 0, h) + i);
  float4* entries = reinterpret_cast<float4*>(seg_state<kN>(a.ws.seg_entries, a, b, 0, h) + i);
  constexpr int kBatch = 4;
  for (int64_t seg0 = 0; seg0 < a.nsegs; seg0 += kBatch) {
    float4 end[kBatch];
    float decay[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (seg0 + k + 1 < a.nsegs) {
        end[k] = ends[(seg0 + k) * seg_stride / kSegmentPassElems];
        decay[k] = seg_decay(a, b, seg0 + k, h);
      }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t seg = seg0 + k;
      if (seg >= a.nsegs) break;
      entries[seg * seg_stride / kSegmentPassElems] = state;
      if (seg + 1 == a.nsegs) break;
      const float d = decay[k];
      state = {d * state.x + end[k].x, d * state.y + end[k].y, d * state.z + end[k].z, d * state.w + end[k].w};
    }
  }
}

}  // namespace mamba2ssd::cuda
