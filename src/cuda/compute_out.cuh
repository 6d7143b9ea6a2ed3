// Kernel 3, compute_out: one block per (chunk, head, batch row), one 16-row m-tile of the chunk's
// tokens per warp. With h the state entering the chunk:
//   Y = exp2(g) * (C h^T) + ((C B^T) * exp2(g_i - g_j) * dt_j * [j <= i]) X + D X,  then * silu(z)
// C B^T and C h^T accumulate together over 64-wide blocks of N; the decayed, masked C B^T stays in
// registers and is the A operand of the product with X. The causal mask comes from indices: each
// warp skips the column tiles right of its diagonal. Tokens of different sequences do not mix.
#pragma once

#include "cuda/kernel_args.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kChunk, int kHeadDim>
struct ComputeOutShape {
  static constexpr int kWarps = kChunk / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kNBlock = 64;  // N columns staged at a time
  // Padding keeps fragment loads free of bank conflicts: 16 bytes for 16-bit rows; for fp32,
  // 4 elements where fragments read along rows and 8 where they read down columns.
  static constexpr int kLdK = kNBlock + (sizeof(T) == 4 ? 4 : 8);  // C, B, h tiles ([row][n])
  static constexpr int kLdX = kHeadDim + 8;                          // X tile ([token][p])
  static constexpr int kCElems = kChunk * kLdK, kHElems = kHeadDim * kLdK, kXElems = kChunk * kLdX;
  static constexpr int kSmemBytes =
      (2 * kCElems + kHElems + kXElems) * sizeof(T) + kChunk * (2 * sizeof(float) + sizeof(int32_t));
};

template <typename T, int kChunk, int kHeadDim>
__global__ void __launch_bounds__(ComputeOutShape<T, kChunk, kHeadDim>::kThreads)
compute_out_kernel(Args a) {
  using Shape = ComputeOutShape<T, kChunk, kHeadDim>;
  using M = tile::Mma<T>;
  constexpr int kNB = Shape::kNBlock, kLdK = Shape::kLdK, kLdX = Shape::kLdX;
  constexpr int kSTiles = kChunk / 8, kYTiles = kHeadDim / 8;
  const ForwardParams& p = a.p;
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t grp = h / (p.nheads / p.ngroups);
  const int64_t t0 = c * kChunk;
  const int rows = static_cast<int>(p.seqlen - t0 < kChunk ? p.seqlen - t0 : kChunk);

  extern __shared__ __align__(16) unsigned char smem[];
  T* sC = reinterpret_cast<T*>(smem);  // [chunk][kLdK]   C, one N block
  T* sB = sC + Shape::kCElems;         // [chunk][kLdK]   B, one N block
  T* sH = sB + Shape::kCElems;         // [P][kLdK]       state entering the chunk, one N block
  T* sX = sH + Shape::kHElems;         // [chunk][kLdX]   X
  float* s_g = reinterpret_cast<float*>(sX + Shape::kXElems);  // [chunk]
  float* s_dt = s_g + kChunk;                                    // [chunk]
  int32_t* s_seq = reinterpret_cast<int32_t*>(s_dt + kChunk);    // [chunk]

  tile::stage<T, kChunk, kHeadDim, Shape::kThreads>(
      sX, kLdX,
      {static_cast<const T*>(p.x) + b * p.x_stride.s0 + t0 * p.x_stride.s1 + h * p.x_stride.s2,
       p.x_stride.s1, rows, kHeadDim, a.x_aligned});
  tile::cp_async_commit();
  for (int i = threadIdx.x; i < kChunk; i += Shape::kThreads) {
    s_g[i] = a.ws.g[token_index(a, b, h, t0 + i)];
    s_dt[i] = a.ws.dt[token_index(a, b, h, t0 + i)];
    s_seq[i] = a.resets ? seq_of(a, b, t0 + i) : 0;
  }
  const int32_t seq_prev = a.resets && c > 0 ? seq_of(a, b, t0 - 1) : 0;

  const int warp = tile::warp_id(), m0 = warp * 16;
  const int diag_tiles = 2 * warp + 2;  // column tiles of 8 at or left of this warp's diagonal
  tile::FragC acc_s[kSTiles];           // C B^T, this warp's rows
  tile::FragC acc_y[kYTiles];           // Y, this warp's rows

  const T* gC = static_cast<const T*>(p.C) + b * p.C_stride.s0 + t0 * p.C_stride.s1 + grp * p.C_stride.s2;
  const T* gB = static_cast<const T*>(p.B) + b * p.B_stride.s0 + t0 * p.B_stride.s1 + grp * p.B_stride.s2;
  const float* gH = a.ws.states + state_index(a, b, c, h);
  for (int nb = 0; nb < p.dstate; nb += kNB) {
    const int cols = static_cast<int>(p.dstate - nb < kNB ? p.dstate - nb : kNB);
    tile::stage<T, kChunk, kNB, Shape::kThreads>(sC, kLdK, {gC + nb, p.C_stride.s1, rows, cols, a.C_aligned});
    tile::stage<T, kChunk, kNB, Shape::kThreads>(sB, kLdK, {gB + nb, p.B_stride.s1, rows, cols, a.B_aligned});
    tile::cp_async_commit();
    for (int i = threadIdx.x; i < kHeadDim * kNB; i += Shape::kThreads) {  // fp32 state -> T
      const int r = i / kNB, n = i % kNB;
      sH[r * kLdK + n] = tile::from_float<T>(n < cols ? gH[r * p.dstate + nb + n] : 0.0f);
    }
    tile::cp_async_wait<0>();
    __syncthreads();

#pragma unroll
    for (int k0 = 0; k0 < kNB; k0 += M::kK) {
      const tile::FragA ca = M::load_a(sC, kLdK, m0, k0);
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
        if (nt < diag_tiles) M::mma(acc_s[nt], ca, M::load_b(sB, kLdK, nt * 8, k0));
#pragma unroll
      for (int pt = 0; pt < kYTiles; ++pt) M::mma(acc_y[pt], ca, M::load_b(sH, kLdK, pt * 8, k0));
    }
    __syncthreads();
  }

  // Inter-chunk term: exp2(g_i) (C h^T)_i, for tokens still in the sequence the state belongs to.
#pragma unroll
  for (auto& f : acc_y)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = m0 + tile::frag_row(e);
      f.v[e] *= s_seq[i] == seq_prev ? exp2f(s_g[i]) : 0.0f;
    }
  // Intra-chunk weights: (C B^T)_ij exp2(g_i - g_j) dt_j, causal and within one sequence.
#pragma unroll
  for (int nt = 0; nt < kSTiles; ++nt) {
    if (nt >= diag_tiles) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = m0 + tile::frag_row(e), j = nt * 8 + tile::frag_col(e);
      const bool keep = j <= i && s_seq[i] == s_seq[j];
      acc_s[nt].v[e] = keep ? acc_s[nt].v[e] * exp2f(s_g[i] - s_g[j]) * s_dt[j] : 0.0f;
    }
  }
#pragma unroll
  for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
    if (k0 > m0 + 15) continue;
    const tile::FragA sa = tile::a_from_accum<T>(acc_s, k0 / M::kK);
#pragma unroll
    for (int pt = 0; pt < kYTiles; ++pt) M::mma(acc_y[pt], sa, M::load_b_trans(sX, kLdX, pt * 8, k0));
  }

  // Epilogue: + D x, gate, one store of y.
  T* y = static_cast<T*>(p.y) + b * p.y_stride.s0 + t0 * p.y_stride.s1 + h * p.y_stride.s2;
  const T* z = p.z ? static_cast<const T*>(p.z) + b * p.z_stride.s0 + t0 * p.z_stride.s1 + h * p.z_stride.s2
                   : nullptr;
#pragma unroll
  for (int pt = 0; pt < kYTiles; ++pt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = m0 + tile::frag_row(e), pi = pt * 8 + tile::frag_col(e);
      if (i >= rows) continue;
      float v = acc_y[pt].v[e];
      if (p.D_layout != DLayout::kNone) {
        const float d = p.D_layout == DLayout::kPerHead ? p.D[h] : p.D[h * kHeadDim + pi];
        v += d * tile::to_float(sX[i * kLdX + pi]);
      }
      if (z) v *= silu(tile::to_float(z[i * p.z_stride.s1 + pi]));
      y[i * p.y_stride.s1 + pi] = tile::from_float<T>(v);
    }
}

}  // namespace mamba2ssd::cuda
