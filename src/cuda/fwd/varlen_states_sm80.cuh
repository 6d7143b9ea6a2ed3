// Packed sequences with varlen states requested (every path): the state at each sequence's last
// token e, from the state h_c entering e's chunk and the sequence's tokens in that chunk:
//   h_e = exp2(g_e) h_c [if the sequence runs into the chunk] + X^T (w B),
//   w_j = exp2(g_e - g_j) dt_j for the chunk's tokens j <= e of e's sequence, else 0
// (the walks' state jump, ended at e and masked to e's sequence). h_c comes from the three-kernel
// path's chunk states, or, on the fused walks, from the sequence's own entry, where the walk stored
// it (ChunkScan::carry, carried_sequence).
// One block per (sequence, head, kCols state columns), a warp per 16 rows of P: the chunk's X and
// B tiles staged once (cp.async), the token weights, then X^T (w B) on tensor cores
// (add_state_jump, as in the walks; k3xTf32: fp32 products as 3xTF32, ForwardParams::fp32_math).
#pragma once

#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kChunk, int kHeadDim>
struct VarlenStatesShape {
  static constexpr int kCols = 64;  // state columns of a block
  static constexpr int kWarps = kHeadDim / 16, kThreads = kWarps * 32;
  static constexpr int kLdX = kHeadDim + 8, kLdB = kCols + 8;  // rows 8 elements apart in banks
  struct SharedStorage {
    alignas(16) T X[kChunk][kLdX];  // the chunk's x rows of the head
    alignas(16) T B[kChunk][kLdB];  // the block's columns of the chunk's B rows
    float w[kChunk];                // token weights
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
};

template <typename T, int kChunk, int kHeadDim, bool k3xTf32 = false>
__global__ void __launch_bounds__(VarlenStatesShape<T, kChunk, kHeadDim>::kThreads)
    varlen_states_sm80_kernel(FwdArgs a) {
  using Shape = VarlenStatesShape<T, kChunk, kHeadDim>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Shape::SharedStorage*>(smem_bytes);
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const int64_t s = blockIdx.x, h = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.z) * Shape::kCols;
  const int64_t grp = geo.group_of(h);
  const Strides4& vs = io.varlen_states_stride;
  float* out = io.varlen_states + s * vs.s0 + h * vs.s1;

  // This warp's 16 rows of the state (p from p0) and the block's kCols columns (n from n0); the
  // rows past the head dim (kHeadDim holds it) neither read nor stored.
  const int p0 = tile::warp_id() * 16, P = static_cast<int>(geo.headdim);
  tile::FragC acc[Shape::kCols / 8] = {};
  auto for_each_state = [&](auto&& f) {  // f(value, p, column within the block)
#pragma unroll
    for (int nt = 0; nt < Shape::kCols / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int p = p0 + tile::frag_row(e);
        if (p < P) f(acc[nt].v[e], p, nt * 8 + tile::frag_col(e));
      }
  };

  // The only kernel that uses offsets from cu_seqlens as token indices: clamped (packed_tokens).
  const TokenRange tokens = packed_tokens(a.seqs, geo.seqlen, s);
  if (tokens.end > tokens.start) {  // (uniform across the block: its barrier is safe)
    const int64_t e = tokens.end - 1, c = e / kChunk, t0 = c * kChunk;
    const int rows = static_cast<int>(e - t0 + 1);  // the chunk's tokens up to e; later rows read as zero
    const int cols = static_cast<int>(geo.dstate - n0 < Shape::kCols ? geo.dstate - n0 : Shape::kCols);
    tile::stage<T, kChunk, kHeadDim, Shape::kThreads>(
        smem.X[0], Shape::kLdX,
        {static_cast<const T*>(io.x) + t0 * io.x_stride.s1 + h * io.x_stride.s2, io.x_stride.s1, rows, P,
         io.x_aligned});
    tile::stage<T, kChunk, Shape::kCols, Shape::kThreads>(
        smem.B[0], Shape::kLdB,
        {static_cast<const T*>(io.B) + t0 * io.B_stride.s1 + grp * io.B_stride.s2 + n0, io.B_stride.s1, rows, cols,
         io.B_aligned});
    tile::cp_async_commit();

    const float* g = a.scan.g + token_index(a, 0, h, t0);
    const float* dt = a.scan.dt + token_index(a, 0, h, t0);
    const int32_t seq_e = seq_of(a, 0, e);
    const float g_e = g[rows - 1];
    for (int j = threadIdx.x; j < kChunk; j += Shape::kThreads)
      smem.w[j] = j < rows && seq_of(a, 0, t0 + j) == seq_e ? exp2f(g_e - g[j]) * dt[j] : 0.0f;
    // The state entering the chunk: the walk's store into this entry, or the chunk states.
    const bool carried = a.scan.carry ? a.scan.carry[c] == s : seq_e == (c > 0 ? seq_of(a, 0, t0 - 1) : 0);
    if (carried) {
      const float decay_e = exp2f(g_e);  // across the chunk up to e
      const float* hc = a.scan.carry ? out : a.chunk_states + chunk_state_index(a, 0, c, h);
      const int64_t ld = a.scan.carry ? vs.s2 : geo.dstate;
      for_each_state([&](float& v, int p, int n) {
        if (n < cols) v = decay_e * hc[p * ld + n0 + n];
      });
    }
    tile::cp_async_wait<0>();
    __syncthreads();
    add_state_jump<T, kChunk, Shape::kCols / 8, 2, k3xTf32>(acc, smem.X[0], Shape::kLdX, smem.B[0], Shape::kLdB, smem.w, p0, 0);
  }
  for_each_state([&](float& v, int p, int n) {
    if (n0 + n < geo.dstate) out[p * vs.s2 + n0 + n] = v;
  });
}

// The kernel for every sequence, after the walk (stream order: never behind it).
template <typename T, int kChunk, bool k3xTf32 = false>
void launch_varlen_states(const FwdArgs& a, cudaStream_t stream) {
  if (!a.io.varlen_states) return;
  dispatch_headdim(a.geo.headdim, [&](auto head_dim) {
    constexpr int kHeadDim = decltype(head_dim)::value;
    using Shape = VarlenStatesShape<T, kChunk, kHeadDim>;
    auto kernel = varlen_states_sm80_kernel<T, kChunk, kHeadDim, k3xTf32>;
    allow_smem(kernel, Shape::kSmemBytes);
    launch(kernel, "varlen_states_sm80_kernel",
           dim3(static_cast<unsigned>(a.seqs.nseqs), static_cast<unsigned>(a.geo.nheads),
                static_cast<unsigned>((a.geo.dstate + Shape::kCols - 1) / Shape::kCols)),
           Shape::kThreads, Shape::kSmemBytes, stream, a);
  });
}

}  // namespace mamba2ssd::cuda
