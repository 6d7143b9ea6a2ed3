// Kernel 3, compute_out: one block per (chunk, head, batch row), one 16-row m-tile of the chunk's
// tokens per warp. With h the state entering the chunk:
//   Y = exp2(g) * (C h^T) + ((C B^T) * exp2(g_i - g_j) * dt_j * [j <= i]) X + D X,  then * silu(z)
// C B^T and C h^T accumulate together over 64-wide blocks of N; the decayed, masked C B^T stays in
// registers and is the A operand of the product with X. The causal mask comes from indices: each
// warp skips the column tiles right of its diagonal. Tokens of different sequences do not mix.
#pragma once

#include "cuda/chunk_output.cuh"
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
  constexpr int kNB = Shape::kNBlock, kLdK = Shape::kLdK, kLdX = Shape::kLdX;
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
  stage_chunk_scalars<kChunk, Shape::kThreads>(a, b, h, c, s_g, s_dt, s_seq);
  tile::cp_async_commit();
  const int32_t seq_prev = a.resets && c > 0 ? seq_of(a, b, t0 - 1) : 0;

  using Out = ChunkOutput<T, kChunk, kHeadDim>;
  const int m0 = tile::warp_id() * 16;
  tile::FragC acc_s[Out::kSTiles];  // C B^T, this warp's rows
  tile::FragC acc_y[Out::kYTiles];  // Y, this warp's rows

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
    Out::template accumulate<kNB>(acc_s, acc_y, sC, sB, sH, kLdK, m0);
    __syncthreads();
  }
  Out::decay_and_mask(acc_s, acc_y, s_g, s_dt, s_seq, seq_prev, m0, a.resets);
  Out::add_intra(acc_y, acc_s, sX, kLdX, m0);
  Out::store_y(acc_y, a, b, h, t0, rows, [&](int i, int pi) { return sX + i * kLdX + pi; }, m0);
}

}  // namespace mamba2ssd::cuda
