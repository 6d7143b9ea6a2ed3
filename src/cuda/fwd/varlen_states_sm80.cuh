// Three-kernel path, with packed sequences and varlen states requested: the state at each sequence's last token e, from the state entering e's
// chunk and the sequence's tokens inside that chunk:
//   h_e = exp2(g_e) h_chunk [same sequence as before the chunk] + sum_j exp2(g_e - g_j) dt_j x_j B_j^T
// One block per (sequence, head, 32-column N-tile); a lane owns one n, a warp a set of p rows.
#pragma once

#include "cuda/fwd/args.cuh"
#include "cuda/tile/types.cuh"

namespace mamba2ssd::cuda {

constexpr int kVarlenThreads = 256;
constexpr int kVarlenMaxRows = 128 / (kVarlenThreads / 32);  // p rows per warp for P = 128

template <typename T, int kChunk>
__global__ void __launch_bounds__(kVarlenThreads) varlen_states_sm80_kernel(FwdArgs a) {
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const int64_t s = blockIdx.x, h = blockIdx.y;
  const int64_t grp = geo.group_of(h);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = blockIdx.z * 32 + lane;
  const int rows_per_warp = static_cast<int>(geo.headdim) / (kVarlenThreads / 32);
  const Strides4& vs = io.varlen_states_stride;
  float* out = io.varlen_states + s * vs.s0 + h * vs.s1;

  // The only kernel that uses offsets from cu_seqlens as token indices: clamped to 0 <= start <=
  // end <= L, so that any contents (decreasing, negative, past the end, 2^62) address only tokens
  // of the call; an empty or inverted sequence stores a zero state (docs/reliability.md).
  const int64_t start = max(int64_t{0}, min(a.seqs.cu_seqlens[s], geo.seqlen));
  const int64_t end = max(start, min(a.seqs.cu_seqlens[s + 1], geo.seqlen));
  float acc[kVarlenMaxRows] = {};
  if (end > start && n < geo.dstate) {
    const int64_t e = end - 1, c = e / kChunk, t0 = c * kChunk;
    const float* g = a.scan.g + token_index(a, 0, h, 0);
    const float* dt = a.scan.dt + token_index(a, 0, h, 0);
    const int32_t seq_e = seq_of(a, 0, e), seq_prev = c > 0 ? seq_of(a, 0, t0 - 1) : 0;
    if (seq_e == seq_prev) {
      const float carry = exp2f(g[e]);
      const float* hc = a.chunk_states + chunk_state_index(a, 0, c, h);
#pragma unroll
      for (int r = 0; r < kVarlenMaxRows; ++r)
        if (r < rows_per_warp) acc[r] = carry * hc[(warp * rows_per_warp + r) * geo.dstate + n];
    }
    const T* x = static_cast<const T*>(io.x) + h * io.x_stride.s2;
    const T* B = static_cast<const T*>(io.B) + grp * io.B_stride.s2;
    for (int64_t j = t0; j <= e; ++j) {
      if (seq_of(a, 0, j) != seq_e) continue;
      const float w = exp2f(g[e] - g[j]) * dt[j] * tile::to_float(B[j * io.B_stride.s1 + n]);
#pragma unroll
      for (int r = 0; r < kVarlenMaxRows; ++r)
        if (r < rows_per_warp) acc[r] += w * tile::to_float(x[j * io.x_stride.s1 + warp * rows_per_warp + r]);
    }
  }
  if (n < geo.dstate) {
#pragma unroll
    for (int r = 0; r < kVarlenMaxRows; ++r)
      if (r < rows_per_warp) out[(warp * rows_per_warp + r) * vs.s2 + n] = acc[r];
  }
}

}  // namespace mamba2ssd::cuda
