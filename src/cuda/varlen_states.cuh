// With packed sequences: the state at each sequence's last token e, from the state entering e's
// chunk and the sequence's tokens inside that chunk:
//   h_e = exp2(g_e) h_chunk [same sequence as before the chunk] + sum_j exp2(g_e - g_j) dt_j x_j B_j^T
// One block per (sequence, head, 32-column N-tile); a lane owns one n, a warp a set of p rows.
#pragma once

#include "cuda/kernel_args.cuh"
#include "cuda/tile/types.cuh"

namespace mamba2ssd::cuda {

constexpr int kVarlenThreads = 256;
constexpr int kVarlenMaxRows = 128 / (kVarlenThreads / 32);  // p rows per warp for P = 128

template <typename T, int kChunk>
__global__ void __launch_bounds__(kVarlenThreads) varlen_states_kernel(Args a) {
  const ForwardParams& p = a.p;
  const int64_t s = blockIdx.x, h = blockIdx.y;
  const int64_t grp = h / (p.nheads / p.ngroups);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = blockIdx.z * 32 + lane;
  const int rows_per_warp = static_cast<int>(p.headdim) / (kVarlenThreads / 32);
  const Strides4& vs = p.varlen_states_stride;
  float* out = p.varlen_states + s * vs.s0 + h * vs.s1;

  // Clamped so that malformed offsets cannot address outside the tensors.
  const int64_t start = max(int64_t{0}, min(p.cu_seqlens[s], p.seqlen));
  const int64_t end = max(start, min(p.cu_seqlens[s + 1], p.seqlen));
  float acc[kVarlenMaxRows] = {};
  if (end > start && n < p.dstate) {
    const int64_t e = end - 1, c = e / kChunk, t0 = c * kChunk;
    const float* g = a.ws.g + token_index(a, 0, h, 0);
    const float* dt = a.ws.dt + token_index(a, 0, h, 0);
    const int32_t seq_e = seq_of(a, 0, e), seq_prev = c > 0 ? seq_of(a, 0, t0 - 1) : 0;
    if (seq_e == seq_prev) {
      const float carry = exp2f(g[e]);
      const float* hc = a.ws.states + state_index(a, 0, c, h);
#pragma unroll
      for (int r = 0; r < kVarlenMaxRows; ++r)
        if (r < rows_per_warp) acc[r] = carry * hc[(warp * rows_per_warp + r) * p.dstate + n];
    }
    const T* x = static_cast<const T*>(p.x) + h * p.x_stride.s2;
    const T* B = static_cast<const T*>(p.B) + grp * p.B_stride.s2;
    for (int64_t j = t0; j <= e; ++j) {
      if (seq_of(a, 0, j) != seq_e) continue;
      const float w = exp2f(g[e] - g[j]) * dt[j] * tile::to_float(B[j * p.B_stride.s1 + n]);
#pragma unroll
      for (int r = 0; r < kVarlenMaxRows; ++r)
        if (r < rows_per_warp) acc[r] += w * tile::to_float(x[j * p.x_stride.s1 + warp * rows_per_warp + r]);
    }
  }
  if (n < p.dstate) {
#pragma unroll
    for (int r = 0; r < kVarlenMaxRows; ++r)
      if (r < rows_per_warp) out[(warp * rows_per_warp + r) * vs.s2 + n] = acc[r];
  }
}

}  // namespace mamba2ssd::cuda
