// Packed sequences with varlen states requested (every path): the state at each sequence's last
// token e, from the state entering e's chunk and the sequence's tokens inside that chunk:
//   h_e = exp2(g_e) h_chunk [if the sequence runs into the chunk] + sum_j exp2(g_e - g_j) dt_j x_j B_j^T
// h_chunk comes from the three-kernel path's chunk states, or, on the fused walks, from the
// sequence's own entry, where the walk stored it (ChunkScan::carry, carried_sequence).
// One block per (sequence, head, 32-column N-tile); a lane owns one n, a warp a set of p rows. The
// chunk's tokens go through shared memory kVarlenTokens at a time (x rows, B's 32 columns and the
// token weights, loaded by the whole block at once), so that the sum is FMAs on staged values
// rather than a chain of dependent global loads per token.
#pragma once

#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/tile/types.cuh"

namespace mamba2ssd::cuda {

constexpr int kVarlenThreads = 256;
constexpr int kVarlenMaxRows = 128 / (kVarlenThreads / 32);  // p rows per warp for P = 128
constexpr int kVarlenTokens = 32;                             // tokens staged at a time

template <typename T, int kChunk>
__global__ void __launch_bounds__(kVarlenThreads) varlen_states_sm80_kernel(FwdArgs a) {
  __shared__ float s_x[kVarlenTokens][128];  // x rows (P <= 128)
  __shared__ float s_b[kVarlenTokens][32];   // the block's 32 columns of B
  __shared__ float s_w[kVarlenTokens];       // exp2(g_e - g_j) dt_j, zero outside the sequence
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const int64_t s = blockIdx.x, h = blockIdx.y;
  const int64_t grp = geo.group_of(h);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n0 = blockIdx.z * 32, n = n0 + lane;
  const int rows_per_warp = static_cast<int>(geo.headdim) / (kVarlenThreads / 32);
  const Strides4& vs = io.varlen_states_stride;
  float* out = io.varlen_states + s * vs.s0 + h * vs.s1;

  // The only kernel that uses offsets from cu_seqlens as token indices: clamped (packed_tokens).
  const TokenRange tokens = packed_tokens(a.seqs, geo.seqlen, s);
  float acc[kVarlenMaxRows] = {};
  if (tokens.end > tokens.start) {  // (uniform across the block: its barriers are safe)
    const int64_t e = tokens.end - 1, c = e / kChunk, t0 = c * kChunk;
    const float* g = a.scan.g + token_index(a, 0, h, 0);
    const float* dt = a.scan.dt + token_index(a, 0, h, 0);
    const int32_t seq_e = seq_of(a, 0, e);
    const float g_e = g[e];
    // The state entering the chunk: the walk's store into this entry, or the chunk states.
    const bool carried = a.scan.carry ? a.scan.carry[c] == s : seq_e == (c > 0 ? seq_of(a, 0, t0 - 1) : 0);
    if (carried && n < geo.dstate) {
      const float carry = exp2f(g_e);
      const float* hc = a.scan.carry ? out : a.chunk_states + chunk_state_index(a, 0, c, h);
      const int64_t ld = a.scan.carry ? vs.s2 : geo.dstate;
#pragma unroll
      for (int r = 0; r < kVarlenMaxRows; ++r)
        if (r < rows_per_warp) acc[r] = carry * hc[(warp * rows_per_warp + r) * ld + n];
    }
    const T* x = static_cast<const T*>(io.x) + h * io.x_stride.s2;
    const T* B = static_cast<const T*>(io.B) + grp * io.B_stride.s2;
    for (int64_t j0 = t0; j0 <= e; j0 += kVarlenTokens) {
      const int m = static_cast<int>(e - j0 + 1 < kVarlenTokens ? e - j0 + 1 : kVarlenTokens);
      for (int i = threadIdx.x; i < kVarlenTokens * static_cast<int>(geo.headdim); i += kVarlenThreads) {
        const int jj = i / static_cast<int>(geo.headdim), p = i % static_cast<int>(geo.headdim);
        s_x[jj][p] = jj < m ? tile::to_float(x[(j0 + jj) * io.x_stride.s1 + p]) : 0.0f;
      }
      for (int i = threadIdx.x; i < kVarlenTokens * 32; i += kVarlenThreads) {
        const int jj = i / 32, nn = i % 32;
        s_b[jj][nn] = jj < m && n0 + nn < geo.dstate ? tile::to_float(B[(j0 + jj) * io.B_stride.s1 + n0 + nn]) : 0.0f;
      }
      if (threadIdx.x < kVarlenTokens) {
        const int64_t j = j0 + threadIdx.x;
        s_w[threadIdx.x] = threadIdx.x < m && seq_of(a, 0, j) == seq_e ? exp2f(g_e - g[j]) * dt[j] : 0.0f;
      }
      __syncthreads();
#pragma unroll 4
      for (int jj = 0; jj < kVarlenTokens; ++jj) {
        const float wb = s_w[jj] * s_b[jj][lane];
#pragma unroll
        for (int r = 0; r < kVarlenMaxRows; ++r)
          if (r < rows_per_warp) acc[r] += wb * s_x[jj][warp * rows_per_warp + r];
      }
      __syncthreads();  // the next tokens overwrite the stage
    }
  }
  if (n < geo.dstate) {
#pragma unroll
    for (int r = 0; r < kVarlenMaxRows; ++r)
      if (r < rows_per_warp) out[(warp * rows_per_warp + r) * vs.s2 + n] = acc[r];
  }
}

// The kernel for every sequence, after the walk (stream order: never behind it).
template <typename T, int kChunk>
void launch_varlen_states(const FwdArgs& a, cudaStream_t stream) {
  if (!a.io.varlen_states) return;
  launch(varlen_states_sm80_kernel<T, kChunk>, "varlen_states_sm80_kernel",
         dim3(static_cast<unsigned>(a.seqs.nseqs), static_cast<unsigned>(a.geo.nheads),
              static_cast<unsigned>((a.geo.dstate + 31) / 32)),
         kVarlenThreads, 0, stream, a);
}

}  // namespace mamba2ssd::cuda
