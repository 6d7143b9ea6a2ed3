// What every kernel of the CUDA forward receives: the caller's params, the workspace carved out of
// the caller's buffer, and the sizes derived once on the host.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "common/dt.h"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Scratch shared by the kernels, all in [batch, head, token]-major order so that a chunk's values
// are one contiguous run. Tokens are padded to whole chunks (padding has dt = 0: no effect).
struct Workspace {
  float* dt;       // [b, H, Lpad] dt after bias, softplus and clamp
  float* g;        // [b, H, Lpad] within-chunk inclusive cumsum of A * dt, times log2(e)
  int32_t* seq;    // [b, Lpad] sequence id per token; nullptr when the call has no resets
  float* states;   // [b, nchunks, H, P, N] state entering each chunk (three-kernel path)
  // Fused path, states of width kN (fused_state_cols; zero columns past dstate):
  float* seg_ends;     // [b, nsegs, H, P, kN] end state of each segment but the last, from zero
  float* seg_entries;  // [b, nsegs, H, P, kN] state entering each segment
  float* seg_decay;    // [b, nsegs, H] decay across each segment but the last (zero if a sequence
                       // starts in it), from the first pass
};

// The fused path cuts a sequence into at most this many segments (more would buy nothing: the
// segment count is sized to one wave of blocks).
constexpr int kMaxSegments = 32;

// Blocks of the Hopper kernels that share a multiprocessor (one warpgroup each; the segment count
// is sized to them). The main kernel with state size 256 runs two warpgroups, one block per
// multiprocessor.
constexpr int kHopperBlocksPerSm = 2;
__host__ __device__ constexpr int hopper_blocks_per_sm(int64_t dstate) { return dstate > 128 ? 1 : kHopperBlocksPerSm; }

struct Args {
  ForwardParams p;
  Workspace ws;
  int64_t nchunks;   // chunks of the kernels' chunk length
  int64_t lpad;      // nchunks * chunk
  bool resets;       // seq_idx or cu_seqlens given
  int64_t nsegs;     // fused path: segments of seg_chunks chunks, each one block per (batch, head)
  int64_t seg_chunks;
  // 16-byte alignment of each staged tensor (base pointer and every stride), for the paths that
  // stage with cp.async (the Hopper path's TMA needs it of x, B, C and y: hopper_refusal).
  bool x_aligned, B_aligned, C_aligned;
  // y and z allow two adjacent elements in one access (aligned base and even strides).
  bool y_pairs, z_pairs;
  // Hopper path only: TMA maps of x, B, C and y for boxes of one column block (64 columns) x
  // tile::tma::kBoxRows tokens (tile/tma.cuh); the kernels that use them take Args as
  // __grid_constant__.
  CUtensorMap x_map, B_map, C_map, y_map;
};

// z sigmoid(z) with the fast division: an IEEE division adds a slow-path call per element, which
// bloats the epilogues (for z below about -87 the denominator passes 2^126 and __fdividef returns
// 0, where z sigmoid(z) is below 1e-36 anyway).
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }

// 2^x in one MUFU instruction (exp2f adds a range check around it). Results below 2^-126 flush to
// zero, which no sum here can tell from the true value.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (sm_90): a kernel launched with the programmatic stream
// serialization attribute may start while the kernel before it still runs; it calls
// wait_previous_kernel before it touches anything that kernel writes (a no-op for a kernel launched
// without the attribute, and before sm_90). start_next_kernel lets such a next kernel start now.
__device__ __forceinline__ void wait_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void start_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Offsets in the workspace.
__device__ __forceinline__ int64_t token_index(const Args& a, int64_t b, int64_t h, int64_t t) {
  return (b * a.p.nheads + h) * a.lpad + t;
}
__device__ __forceinline__ int64_t state_index(const Args& a, int64_t b, int64_t c, int64_t h) {
  return ((b * a.nchunks + c) * a.p.nheads + h) * a.p.headdim * a.p.dstate;
}

// The fused paths' state width: state sizes up to 64 run as 64 columns, up to 128 as 128, larger
// ones (Hopper path only) as 256 (the kernels' kN; the columns past dstate stay zero).
__host__ __device__ constexpr int fused_state_cols(int64_t dstate) { return dstate <= 64 ? 64 : dstate <= 128 ? 128 : 256; }

// Segment s's state in a [b, nsegs, H, P, kN] workspace array (seg_ends, seg_entries).
template <int kN>
__device__ __forceinline__ float* seg_state(float* base, const Args& a, int64_t b, int64_t s, int64_t h) {
  return base + ((b * a.nsegs + s) * a.p.nheads + h) * a.p.headdim * kN;
}

// What the first pass leaves for segment_pass besides the end state: the decay across segment s.
__device__ __forceinline__ float& seg_decay(const Args& a, int64_t b, int64_t s, int64_t h) {
  return a.ws.seg_decay[(b * a.nsegs + s) * a.p.nheads + h];
}

// Sequence id of token t (padding belongs to the last real token's sequence).
__device__ __forceinline__ int32_t seq_of(const Args& a, int64_t b, int64_t t) {
  return a.ws.seq[b * a.lpad + t];
}

// The jump of the state across one chunk: h_next = decay h + sum_j weight_j x_j B_j^T, where only
// tokens of the chunk's last sequence contribute, and the carried state survives only if no
// sequence starts inside the chunk. g, dt, seq are the chunk's values (shared memory); g_base is g
// before the chunk's first token (nonzero for a chunk that starts inside the cumsum's chunk).
struct ChunkJump {
  float g_last;
  int32_t seq_last;
  float decay;
  __device__ ChunkJump(const float* g, const int32_t* seq, int chunk, int32_t seq_prev, float g_base = 0.0f)
      : g_last(g[chunk - 1]),
        seq_last(seq[chunk - 1]),
        decay(seq_last == seq_prev ? exp2f(g_last - g_base) : 0.0f) {}
  __device__ float weight(const float* g, const float* dt, const int32_t* seq, int j) const {
    return seq[j] == seq_last ? dt[j] * fast_exp2(g_last - g[j]) : 0.0f;
  }
  // All the chunk's token weights into s_w, by the block's threads (a barrier must follow).
  template <int kChunk, int kThreads>
  __device__ void weights(const float* g, const float* dt, const int32_t* seq, float* s_w) const {
    for (int j = threadIdx.x; j < kChunk; j += kThreads) s_w[j] = weight(g, dt, seq, j);
  }
};

// The fused walks' state at a segment's edges, for a block whose state elements for_each_state
// visits as f(value, p index, n index) (kN columns; those past dstate are padding and stay zero).
// The entry: the segment pass's entry state with several segments, else initial_states or zero;
// the first pass (kSegmentEnds) starts from zero. The exit: the first pass stores the segment's end
// state (all kN columns, so that segment_pass and the entry read them without a test per column);
// the last segment's block stores final_states.
template <bool kSegmentEnds, int kN, typename ForEach>
__device__ void load_segment_entry(const Args& a, int64_t b, int64_t seg, int64_t h, ForEach for_each_state) {
  const ForwardParams& p = a.p;
  if (kSegmentEnds) return;
  if (a.nsegs > 1) {
    const float* entry = seg_state<kN>(a.ws.seg_entries, a, b, seg, h);
    for_each_state([&](float& v, int pi, int ni) { v = entry[pi * kN + ni]; });
  } else if (p.initial_states) {
    const Strides4& s = p.initial_states_stride;
    for_each_state([&](float& v, int pi, int ni) {
      if (ni < p.dstate) v = p.initial_states[b * s.s0 + h * s.s1 + pi * s.s2 + ni];
    });
  }
}
template <bool kSegmentEnds, int kN, typename ForEach>
__device__ void store_segment_exit(const Args& a, int64_t b, int64_t seg, int64_t h, ForEach for_each_state) {
  const ForwardParams& p = a.p;
  if (kSegmentEnds) {
    float* out = seg_state<kN>(a.ws.seg_ends, a, b, seg, h);
    for_each_state([&](float& v, int pi, int ni) { out[pi * kN + ni] = v; });
  } else if (seg + 1 == a.nsegs && p.final_states) {
    const Strides4& s = p.final_states_stride;
    for_each_state([&](float& v, int pi, int ni) {
      if (ni < p.dstate) p.final_states[b * s.s0 + h * s.s1 + pi * s.s2 + ni] = v;
    });
  }
}

// Starts the async copy of chunk c's g, dt and sequence ids (zeros without resets) into shared memory.
template <int kChunk, int kThreads>
__device__ __forceinline__ void stage_chunk_scalars(const Args& a, int64_t b, int64_t h, int64_t c, float* s_g,
                                                    float* s_dt, int32_t* s_seq) {
  const int64_t t0 = c * kChunk;
  const float* g = a.ws.g + token_index(a, b, h, t0);
  const float* dt = a.ws.dt + token_index(a, b, h, t0);
  for (int i = threadIdx.x; i < kChunk / 4; i += kThreads) {
    tile::cp_async_16(s_g + 4 * i, g + 4 * i, true);
    tile::cp_async_16(s_dt + 4 * i, dt + 4 * i, true);
    if (a.resets) tile::cp_async_16(s_seq + 4 * i, a.ws.seq + b * a.lpad + t0 + 4 * i, true);
  }
  if (!a.resets)
    for (int i = threadIdx.x; i < kChunk; i += kThreads) s_seq[i] = 0;
}

}  // namespace mamba2ssd::cuda
