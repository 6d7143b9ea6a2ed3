// Three-kernel path, kernel 3 (the seed's compute_out): one block per (chunk, head, batch row), one
// 16-row m-tile of the chunk's tokens per warp. With h the state entering the chunk:
//   Y = exp2(g) * (C h^T) + ((C B^T) * exp2(g_i - g_j) * dt_j * [j <= i]) X + D X,  then * silu(z)
// C B^T and C h^T accumulate together over 64-wide blocks of N; the decayed, masked C B^T stays in
// registers and is the A operand of the product with X. The causal mask comes from indices: each
// warp skips the column tiles right of its diagonal. Tokens of different sequences do not mix.
#pragma once

#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/output_steps.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kChunk, int kHeadDim>
struct ChunkOutputsShape {
  static constexpr int kWarps = kChunk / 16;
  static constexpr int kThreads = kWarps * 32;
  // Blocks that must fit a multiprocessor (0: ptxas chooses; an explicit 1 lets it take more
  // registers). 16-bit head dim 32 at chunk 128 fits 128 registers, two blocks: left to itself,
  // ptxas took 138 after the restructuring, and one block ran 27% slower on the H200 (perf-log v10).
  static constexpr int kMinBlocksPerSm = sizeof(T) == 2 && kHeadDim == 32 && kChunk == 128 ? 2 : 0;
  static constexpr int kNBlock = 64;  // N columns staged at a time
  // Padding keeps fragment loads free of bank conflicts: 16 bytes for 16-bit rows; for fp32,
  // 4 elements where fragments read along rows and 8 where they read down columns.
  static constexpr int kLdK = kNBlock + (sizeof(T) == 4 ? 4 : 8);  // C, B, h tiles ([row][n])
  static constexpr int kLdX = kHeadDim + 8;                          // X tile ([token][p])
  struct SharedStorage {
    alignas(16) T C[kChunk][kLdK];  // one N block of C
    alignas(16) T B[kChunk][kLdK];  // one N block of B
    alignas(16) T H[kHeadDim][kLdK];  // one N block of the state entering the chunk
    alignas(16) T X[kChunk][kLdX];
    alignas(16) float g[kChunk];
    float dt[kChunk];
    int32_t seq[kChunk];
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
};

// k3xTf32: fp32 products as 3xTF32 (ForwardParams::fp32_math).
template <typename T, int kChunk, int kHeadDim, bool k3xTf32 = false>
__global__ void __launch_bounds__(ChunkOutputsShape<T, kChunk, kHeadDim>::kThreads,
                                  ChunkOutputsShape<T, kChunk, kHeadDim>::kMinBlocksPerSm)
    chunk_outputs_sm80_kernel(FwdArgs a) {
  using Shape = ChunkOutputsShape<T, kChunk, kHeadDim>;
  constexpr int kNB = Shape::kNBlock, kLdK = Shape::kLdK, kLdX = Shape::kLdX;
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t grp = geo.group_of(h);
  const ChunkTokens tokens = chunk_tokens<kChunk>(a, c);  // (the packed prefill's chunks start elsewhere)
  const int64_t t0 = tokens.t0;
  const int rows = tokens.rows;
  if (rows == 0) return;  // a padded chunk past the prefill's last request (the forward's hold a token)

  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Shape::SharedStorage*>(smem_bytes);
  T *sC = smem.C[0], *sB = smem.B[0], *sH = smem.H[0], *sX = smem.X[0];
  const int P = static_cast<int>(geo.headdim);  // kHeadDim or less: the rows and columns past it are zeros

  tile::stage<T, kChunk, kHeadDim, Shape::kThreads>(
      sX, kLdX,
      {static_cast<const T*>(io.x) + b * io.x_stride.s0 + t0 * io.x_stride.s1 + h * io.x_stride.s2,
       io.x_stride.s1, rows, P, io.x_aligned});
  stage_chunk_scalars<kChunk, Shape::kThreads>(a, b, h, c, smem.g, smem.dt, smem.seq);
  tile::cp_async_commit();
  const int32_t seq_prev = a.scan.resets && c > 0 ? seq_of(a, b, c * kChunk - 1) : 0;  // (padded coordinates)

  using Out = OutputSteps<T, kChunk, kHeadDim, k3xTf32>;
  const int m0 = tile::warp_id() * 16;
  tile::FragC acc_s[Out::kSTiles];  // C B^T, this warp's rows
  tile::FragC acc_y[Out::kYTiles];  // Y, this warp's rows

  const T* gC = static_cast<const T*>(io.C) + b * io.C_stride.s0 + t0 * io.C_stride.s1 + grp * io.C_stride.s2;
  const T* gB = static_cast<const T*>(io.B) + b * io.B_stride.s0 + t0 * io.B_stride.s1 + grp * io.B_stride.s2;
  const float* gH = a.chunk_states + chunk_state_index(a, b, c, h);
  for (int nb = 0; nb < geo.dstate; nb += kNB) {
    const int cols = static_cast<int>(geo.dstate - nb < kNB ? geo.dstate - nb : kNB);
    tile::stage<T, kChunk, kNB, Shape::kThreads>(sC, kLdK, {gC + nb, io.C_stride.s1, rows, cols, io.C_aligned});
    tile::stage<T, kChunk, kNB, Shape::kThreads>(sB, kLdK, {gB + nb, io.B_stride.s1, rows, cols, io.B_aligned});
    tile::cp_async_commit();
    for (int i = threadIdx.x; i < kHeadDim * kNB; i += Shape::kThreads) {  // fp32 state -> T
      const int r = i / kNB, n = i % kNB;
      sH[r * kLdK + n] = tile::from_float<T>(r < P && n < cols ? gH[r * geo.dstate + nb + n] : 0.0f);
    }
    tile::cp_async_wait<0>();
    __syncthreads();
    Out::template accumulate<kNB>(acc_s, acc_y, sC, sB, sH, kLdK, m0);
    __syncthreads();
  }
  Out::decay_and_mask(acc_s, acc_y, smem.g, smem.dt, smem.seq, seq_prev, m0, a.scan.resets);
  Out::add_intra(acc_y, acc_s, sX, kLdX, m0);
  Out::store_y(acc_y, io, b, h, t0, rows, [&](int i, int pi) { return sX + i * kLdX + pi; }, m0, P);
}

// Every chunk's outputs, in stream order after the chunk states.
template <typename T, int kChunk, bool k3xTf32>
void launch_chunk_outputs(const FwdArgs& a, cudaStream_t stream) {
  dispatch_headdim(a.geo.headdim, [&](auto head_dim) {
    constexpr int kHeadDim = decltype(head_dim)::value;
    using Shape = ChunkOutputsShape<T, kChunk, kHeadDim>;
    auto kernel = chunk_outputs_sm80_kernel<T, kChunk, kHeadDim, k3xTf32>;
    allow_smem(kernel, Shape::kSmemBytes);
    launch(kernel, "chunk_outputs_sm80_kernel",
           dim3(static_cast<unsigned>(a.scan.nchunks), static_cast<unsigned>(a.geo.nheads),
                static_cast<unsigned>(a.geo.batch)),
           Shape::kThreads, Shape::kSmemBytes, stream, a);
  });
}

}  // namespace mamba2ssd::cuda
