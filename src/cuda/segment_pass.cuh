// Fused path, between its two passes: the state entering each segment, from the segments' own end
// states (computed from zero, in parallel) and their decays:
//   entry_0 = initial state,  entry_{s+1} = decay_s entry_s + end_s
// A segment's decay is the product of its chunks' decays (zero if a sequence starts inside it).
// One thread per state element of one (batch, head); a short sequential loop over segments.
#pragma once

#include "cuda/kernel_args.cuh"

namespace mamba2ssd::cuda {

constexpr int kSegmentPassThreads = 256;

template <int kChunk>
__global__ void __launch_bounds__(kSegmentPassThreads) segment_pass_kernel(Args a) {
  const ForwardParams& p = a.p;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSegmentPassThreads + threadIdx.x;
  if (i >= p.headdim * p.dstate) return;
  const int64_t pi = i / p.dstate, ni = i % p.dstate;
  const float* g = a.ws.g + token_index(a, b, h, 0);

  float state = 0.0f;
  if (p.initial_states) {
    const Strides4& s = p.initial_states_stride;
    state = p.initial_states[b * s.s0 + h * s.s1 + pi * s.s2 + ni];
  }
  for (int64_t seg = 0; seg < a.nsegs; ++seg) {
    a.ws.seg_entries[seg_index(a, b, seg, h) + i] = state;
    if (seg + 1 == a.nsegs) break;
    float log2_decay = 0.0f;
    bool cut = false;
    for (int64_t c = seg * a.seg_chunks; c < (seg + 1) * a.seg_chunks; ++c) {
      const int64_t last = c * kChunk + kChunk - 1;
      log2_decay += g[last];
      if (a.resets) cut |= seq_of(a, b, last) != (c > 0 ? seq_of(a, b, c * kChunk - 1) : 0);
    }
    state = (cut ? 0.0f : exp2f(log2_decay)) * state + a.ws.seg_ends[seg_index(a, b, seg, h) + i];
  }
}

}  // namespace mamba2ssd::cuda
