// The state's side of the forward, shared by the kernels that walk chunks: the jump of the state
// across a chunk (or a step of one), the state at a walk's edges, and the chunk scalars' staging.
#pragma once

#include "cuda/common/math.cuh"
#include "cuda/fwd/args.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

// Element (p, n) of (b, h)'s state in a [b, H, P, N] tensor (initial_states, final_states).
__device__ __forceinline__ int64_t state_offset(const Strides4& s, int64_t b, int64_t h, int64_t pi, int64_t ni) {
  return b * s.s0 + h * s.s1 + pi * s.s2 + ni;
}

// The jump of the state across one chunk: h_next = decay h + sum_j weight_j x_j B_j^T, where only
// tokens of the chunk's last sequence contribute, and the carried state survives only if no
// sequence starts inside the chunk. g, dt, seq are the chunk's values (shared memory); g_base is g
// before the chunk's first token (nonzero for a step that starts inside the cumsum's chunk).
struct StateJump {
  float g_last;
  int32_t seq_last;
  float decay;
  __device__ StateJump(const float* g, const int32_t* seq, int chunk, int32_t seq_prev, float g_base = 0.0f)
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

// acc += X^T (w B) for one warp's 16 state rows (p from p0) and kTiles 8-column tiles (n from
// n0), on mma.sync: X [token][p] and B [token][n] in shared memory, w the token weights. The
// caller has decayed acc already. kUnroll: the k loop's unroll factor (register budget). k3xTf32:
// fp32 products as 3xTF32 (tile::Mma3xTf32; ForwardParams::fp32_math).
template <typename T, int kChunk, int kTiles, int kUnroll, bool k3xTf32 = false>
__device__ __forceinline__ void add_state_jump(tile::FragC (&acc)[kTiles], const T* x, int ldx, const T* B, int ldb,
                                               const float* s_w, int p0, int n0) {
  using M = tile::MmaFor<T, k3xTf32>;
#pragma unroll (kUnroll)
  for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
    tile::FragA xw = M::load_a_trans(x, ldx, p0, k0);  // X^T: [p][token], times w per token
    M::scale_a_cols(xw, [&](int k) { return s_w[k0 + k]; });
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) M::mma(acc[nt], xw, M::load_b_trans(B, ldb, n0 + nt * 8, k0));  // B: [token][n]
  }
}

// A walk block's rows of the state (and columns of x and y): p_base + p of the head, those at or
// past the head dim being padding (head dim 32). kTiled false: a kernel compiled for head dim 64,
// where p_base is 0 and no row is padding, so that every test below folds away (the tests cost the
// Hopper main kernel 1% on the headline shape, the fused walk 3% on fp32).
template <bool kTiled>
struct HeadRows {
  int p_base;
  int64_t headdim;
  __device__ bool in(int p) const { return !kTiled || p_base + p < headdim; }
};

// The fused walks' state at a segment's edges, for a block whose state elements for_each_state
// visits as f(value, p index, n index): rows p_base + p of the head (HeadRows; those past the head
// dim are padding, never loaded or stored, and stay zero) and kN columns (those past dstate are
// padding and stay zero).
// The entry: the segment's entry state with several segments, else initial_states or zero; the
// first pass (kSegmentEnds) starts from zero. The exit: the first pass stores the segment's end
// state (all kN columns, so that segment_entries and the next walk read them without a test per
// column); the last segment's block stores final_states.
template <bool kSegmentEnds, int kN, bool kTiled, typename ForEach>
__device__ void load_segment_entry(const FwdArgs& a, int64_t b, int64_t seg, int64_t h, HeadRows<kTiled> rows,
                                   ForEach for_each_state) {
  if (kSegmentEnds) return;
  if (a.seg.count > 1) {
    const float* entry = seg_state<kN>(a.seg.entries, a, b, seg, h) + rows.p_base * kN;
    for_each_state([&](float& v, int pi, int ni) {
      if (rows.in(pi)) v = entry[pi * kN + ni];
    });
  } else if (a.io.initial_states) {
    for_each_state([&](float& v, int pi, int ni) {
      if (rows.in(pi) && ni < a.geo.dstate)
        v = a.io.initial_states[state_offset(a.io.initial_states_stride, b, h, rows.p_base + pi, ni)];
    });
  }
}
template <bool kSegmentEnds, int kN, bool kTiled, typename ForEach>
__device__ void store_segment_exit(const FwdArgs& a, int64_t b, int64_t seg, int64_t h, HeadRows<kTiled> rows,
                                   ForEach for_each_state) {
  if (kSegmentEnds) {
    float* out = seg_state<kN>(a.seg.ends, a, b, seg, h) + rows.p_base * kN;
    for_each_state([&](float& v, int pi, int ni) {
      if (rows.in(pi)) out[pi * kN + ni] = v;
    });
  } else if (seg + 1 == a.seg.count && a.io.final_states) {
    for_each_state([&](float& v, int pi, int ni) {
      if (rows.in(pi) && ni < a.geo.dstate)
        a.io.final_states[state_offset(a.io.final_states_stride, b, h, rows.p_base + pi, ni)] = v;
    });
  }
}

// Varlen states on the fused walks: at the entry of each chunk, the state entering it goes into the
// varlen_states entry of the sequence that ends inside the chunk, if one does (ChunkScan::carry;
// varlen_states_sm80 finishes the entry after the walk). The answer for a chunk is loaded a chunk
// ahead, off the walk's critical path.
struct CarriedStates {
  int32_t next;  // the answer for the chunk the walk enters next
  __device__ CarriedStates(const FwdArgs& a, int64_t c_begin) : next(a.scan.carry ? a.scan.carry[c_begin] : -1) {}
  // At the entry of chunk c, with the state entering it visited by for_each_state as in the walks
  // (rows as at the segment's edges).
  template <bool kTiled, typename ForEach>
  __device__ __forceinline__ void enter(const FwdArgs& a, int64_t h, int64_t c, int64_t c_end, HeadRows<kTiled> rows,
                                        ForEach for_each_state) {
    if (!a.scan.carry) return;
    const int32_t s = next;
    if (c + 1 < c_end) next = a.scan.carry[c + 1];
    if (s < 0) return;
    for_each_state([&](float& v, int pi, int ni) {
      if (rows.in(pi) && ni < a.geo.dstate)
        a.io.varlen_states[state_offset(a.io.varlen_states_stride, s, h, rows.p_base + pi, ni)] = v;
    });
  }
};

// Starts the async copy of chunk c's g, dt and sequence ids (zeros without resets) into shared memory.
template <int kChunk, int kThreads>
__device__ __forceinline__ void stage_chunk_scalars(const ScanArgs& a, int64_t b, int64_t h, int64_t c, float* s_g,
                                                    float* s_dt, int32_t* s_seq) {
  const int64_t t0 = c * kChunk;
  const float* g = a.scan.g + token_index(a, b, h, t0);
  const float* dt = a.scan.dt + token_index(a, b, h, t0);
  for (int i = threadIdx.x; i < kChunk / 4; i += kThreads) {
    tile::cp_async_16(s_g + 4 * i, g + 4 * i, true);
    tile::cp_async_16(s_dt + 4 * i, dt + 4 * i, true);
    if (a.scan.resets) tile::cp_async_16(s_seq + 4 * i, a.scan.seq + b * a.scan.lpad + t0 + 4 * i, true);
  }
  if (!a.scan.resets)
    for (int i = threadIdx.x; i < kChunk; i += kThreads) s_seq[i] = 0;
}

}  // namespace mamba2ssd::cuda
