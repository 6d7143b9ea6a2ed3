// Fused path, between its two passes: the state entering each segment, from the segments' own end
// states (computed from zero, in parallel) and their decays:
//   entry_0 = initial state,  entry_{s+1} = decay_s entry_s + end_s
// A segment's decay is the product of its chunks' decays (zero if a sequence starts inside it).
// One thread per 4 state elements of one (batch, head) (16-byte accesses; states are [P][kN]); the
// block first sums each segment's log2 decay (warp w takes segments w, w + 8, ...), then a short
// sequential loop over segments. Behind the first pass on the Hopper path (programmatic dependent
// launch), the decays, which need only chunk_cumsum's g, are summed while the first pass ends.
#pragma once

#include "cuda/kernel_args.cuh"

namespace mamba2ssd::cuda {

constexpr int kSegmentPassThreads = 256;
constexpr int kSegmentPassElems = 4;  // state elements per thread

template <int kChunk, int kN>
__global__ void __launch_bounds__(kSegmentPassThreads) segment_pass_kernel(Args a) {
  __shared__ float s_decay[kMaxSegments];  // make_plan never plans more segments
  const ForwardParams& p = a.p;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  // g and the sequence ids come from chunk_cumsum, which ended before this kernel started (the
  // first pass lets it start only after its own wait for chunk_cumsum), but this kernel waits on
  // the first pass alone: read them from L2 (__ldcg), never from a line this SM's L1 kept.
  const float* g = a.ws.g + token_index(a, b, h, 0);
  const int32_t* seq = a.ws.seq + b * a.lpad;

  const int lane = tile::lane_id();
  for (int64_t seg = tile::warp_id(); seg + 1 < a.nsegs; seg += kSegmentPassThreads / 32) {
    float log2_decay = 0.0f;
    bool cut = false;
    for (int64_t c = seg * a.seg_chunks + lane; c < (seg + 1) * a.seg_chunks; c += 32) {
      const int64_t last = c * kChunk + kChunk - 1;
      log2_decay += __ldcg(g + last);
      if (a.resets) cut |= __ldcg(seq + last) != (c > 0 ? __ldcg(seq + c * kChunk - 1) : 0);
    }
    for (int d = 16; d > 0; d /= 2) log2_decay += __shfl_xor_sync(0xffffffffu, log2_decay, d);
    cut = __any_sync(0xffffffffu, cut);
    if (lane == 0) s_decay[seg] = cut ? 0.0f : exp2f(log2_decay);
  }
  __syncthreads();
  wait_previous_kernel();  // the first pass's end states
  start_next_kernel();

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
  // Consecutive segments of one (batch, head) lie seg_stride apart. The end states are loaded
  // kBatch segments at a time before any is used, so that their loads overlap (4: 40 registers, so
  // that the 640 blocks of 80 heads fit the GPU at once).
  const int64_t seg_stride = p.nheads * p.headdim * kN;
  const float4* ends = reinterpret_cast<const float4*>(seg_state<kN>(a.ws.seg_ends, a, b, 0, h) + i);
  float4* entries = reinterpret_cast<float4*>(seg_state<kN>(a.ws.seg_entries, a, b, 0, h) + i);
  constexpr int kBatch = 4;
  for (int64_t seg0 = 0; seg0 < a.nsegs; seg0 += kBatch) {
    float4 end[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (seg0 + k + 1 < a.nsegs) end[k] = ends[(seg0 + k) * seg_stride / kSegmentPassElems];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t seg = seg0 + k;
      if (seg >= a.nsegs) break;
      entries[seg * seg_stride / kSegmentPassElems] = state;
      if (seg + 1 == a.nsegs) break;
      const float d = s_decay[seg];
      state = {d * state.x + end[k].x, d * state.y + end[k].y, d * state.z + end[k].z, d * state.w + end[k].w};
    }
  }
}

}  // namespace mamba2ssd::cuda
