// The adjoint's walk (the mirror of chunk_states_sm80): one block per (batch, head, 32-row P-tile,
// 32-column N-tile) walks the chunks from the last to the first, carrying the adjoint dh of the
// state. For each chunk it stores dh (the adjoint of the state leaving the chunk), then applies
// the reverse jump
//   dh <- exp2(g_last) dh + dY^T (C * w),   w_i = exp2(g_i),   dy = dout silu(z) (or dout)
// (ssd-backward.md, "chunked form": dh_in). Only tokens still in the sequence that entered the
// chunk reach the state before it, and dh is cut when a sequence starts inside the chunk: the
// exact mirror of the forward's masks. It starts from dfinal_states and ends as dinitial_states.
// The adjoint states are stored as T: the products that read them round them to T anyway.
#pragma once

#include "cuda/bwd/args.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/math.cuh"
#include "cuda/fwd/chunk_states_sm80.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

template <typename T>
struct ChunkDstatesShape {
  static constexpr int kChunk = kBwdChunk;
  static constexpr int kWarps = kStateTile / 16;  // one 16-row m-tile of P per warp
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLd = kStateTile + 8;
  struct SharedStorage {
    alignas(16) T dY[2][kChunk][kLd];  // dout of the chunk, columns p0 .. p0 + 31, then dy
    alignas(16) T Z[2][kChunk][kLd];   // z, same columns (only with z)
    alignas(16) T C[2][kChunk][kLd];   // C of the chunk, columns n0 .. n0 + 31
    alignas(16) float g[2][kChunk];
    float dt[2][kChunk];
    int32_t seq[2][kChunk];
    float w[kChunk];
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
};

// The walk of one block (state tile, head, batch row as chunk_states_walk's).
template <typename T>
__device__ __forceinline__ void chunk_dstates_walk(const BwdArgs& a, unsigned tile, unsigned head, unsigned row,
                                                   unsigned char* smem_bytes) {
  using Shape = ChunkDstatesShape<T>;
  constexpr int kChunk = Shape::kChunk, kLd = Shape::kLd;
  const Geometry& geo = a.geo;
  const int64_t n_tiles = (geo.dstate + kStateTile - 1) / kStateTile;
  const int n0 = static_cast<int>(tile % n_tiles) * kStateTile;
  const int p0 = static_cast<int>(tile / n_tiles) * kStateTile;
  const int64_t h = head, b = row;
  const int64_t grp = geo.group_of(h);

  auto& smem = *reinterpret_cast<typename Shape::SharedStorage*>(smem_bytes);

  const BwdTensors& gr = a.grad;
  const T* dout = static_cast<const T*>(gr.dout) + b * gr.dout_stride.s0 + h * gr.dout_stride.s2 + p0;
  const T* z = a.io.z ? static_cast<const T*>(a.io.z) + b * a.io.z_stride.s0 + h * a.io.z_stride.s2 + p0 : nullptr;
  const T* C = static_cast<const T*>(a.io.C) + b * a.io.C_stride.s0 + grp * a.io.C_stride.s2 + n0;
  auto stage_chunk = [&](int64_t c, int buf) {
    const int rows = static_cast<int>(geo.seqlen - c * kChunk < kChunk ? geo.seqlen - c * kChunk : kChunk);
    const int cols = static_cast<int>(geo.headdim) - p0;  // (zeros past the head dim)
    tile::stage<T, kChunk, kStateTile, Shape::kThreads>(
        smem.dY[buf][0], kLd, {dout + c * kChunk * gr.dout_stride.s1, gr.dout_stride.s1, rows, cols, gr.dout_aligned});
    if (z)
      tile::stage<T, kChunk, kStateTile, Shape::kThreads>(
          smem.Z[buf][0], kLd, {z + c * kChunk * a.io.z_stride.s1, a.io.z_stride.s1, rows, cols, gr.z_aligned});
    tile::stage<T, kChunk, kStateTile, Shape::kThreads>(
        smem.C[buf][0], kLd,
        {C + c * kChunk * a.io.C_stride.s1, a.io.C_stride.s1, rows, static_cast<int>(geo.dstate) - n0, a.io.C_aligned});
    stage_chunk_scalars<kChunk, Shape::kThreads>(a, b, h, c, smem.g[buf], smem.dt[buf], smem.seq[buf]);
    tile::cp_async_commit();
  };

  const int m0 = tile::warp_id() * 16;
  tile::FragC acc[kStateTile / 8];
  auto for_each_element = [&](auto&& f) {  // f(fragment, element, p index, n index)
#pragma unroll
    for (int nt = 0; nt < kStateTile / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pi = p0 + m0 + tile::frag_row(e), ni = n0 + nt * 8 + tile::frag_col(e);
        if (pi < geo.headdim && ni < geo.dstate) f(acc[nt], e, pi, ni);
      }
  };
  if (gr.dfinal_states)
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) {
      f.v[e] = gr.dfinal_states[state_offset(gr.dfinal_states_stride, b, h, pi, ni)];
    });

  const int64_t last = a.scan.nchunks - 1;
  stage_chunk(last, last & 1);
  for (int64_t c = last; c >= 0; --c) {
    T* out = static_cast<T*>(a.work.dstates) + chunk_head(a, b, c, h) * geo.headdim * geo.dstate;
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) {  // e, e + 1: adjacent columns
      if (e % 2 == 0) tile::store_pair(out + pi * geo.dstate + ni, true, {f.v[e], f.v[e + 1]});
    });
    const int buf = c & 1;
    if (c > 0) {
      stage_chunk(c - 1, buf ^ 1);
      tile::cp_async_wait<1>();
    } else {
      tile::cp_async_wait<0>();
    }
    __syncthreads();

    if (z) {  // dy = dout silu(z), in place
      T* dy = smem.dY[buf][0];
      const T* zs = smem.Z[buf][0];
      for (int i = threadIdx.x; i < kChunk * kStateTile; i += Shape::kThreads) {
        const int r = i / kStateTile, col = i % kStateTile;
        dy[r * kLd + col] = tile::from_float<T>(tile::to_float(dy[r * kLd + col]) * silu(tile::to_float(zs[r * kLd + col])));
      }
    }
    // The reverse jump's weights: tokens of the sequence that entered the chunk.
    const float* g = smem.g[buf];
    const int32_t* seq = smem.seq[buf];
    const int32_t seq_prev = a.scan.resets && c > 0 ? seq_of(a, b, c * kChunk - 1) : 0;
    for (int i = threadIdx.x; i < kChunk; i += Shape::kThreads) smem.w[i] = seq[i] == seq_prev ? fast_exp2(g[i]) : 0.0f;
    const float decay = seq[kChunk - 1] == seq_prev ? exp2f(g[kChunk - 1]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (auto& f : acc)
      for (float& v : f.v) v = decay == 0.0f ? 0.0f : v * decay;  // a cut drops a NaN or inf too
    add_state_jump<T, kChunk, kStateTile / 8, 4>(acc, smem.dY[buf][0], kLd, smem.C[buf][0], kLd, smem.w, m0, 0);
    __syncthreads();  // buffers and weights are rewritten next iteration
  }

  if (gr.dinitial_states)
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) {
      gr.dinitial_states[state_offset(gr.dinitial_states_stride, b, h, pi, ni)] = f.v[e];
    });
}

// Backward kernels 0 and 1 in one launch: the forward's walk (the state entering each chunk,
// recomputed) and the adjoint's walk are independent, and each alone leaves most of the GPU idle
// (a few warps per multiprocessor, waiting on loads). Batch rows [0, b) of the grid walk forward,
// [b, 2b) backward.
template <typename T>
struct ChunkWalksShape {
  static constexpr int kThreads = ChunkDstatesShape<T>::kThreads;
  static_assert(ChunkStatesShape<T, kBwdChunk>::kThreads == kThreads, "one block size for both walks");
  static constexpr int kSmemBytes = ChunkDstatesShape<T>::kSmemBytes > ChunkStatesShape<T, kBwdChunk>::kSmemBytes
                                        ? ChunkDstatesShape<T>::kSmemBytes
                                        : ChunkStatesShape<T, kBwdChunk>::kSmemBytes;
};

template <typename T>
__global__ void __launch_bounds__(ChunkWalksShape<T>::kThreads) chunk_walks_sm80_kernel(BwdArgs a) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  wait_previous_kernel();  // chunk_cumsum's g and dt (a no-op unless launched behind it)
  const WalkRow row = walk_row(a, blockIdx.z);
  if (!row.adjoint) chunk_states_walk<T, kBwdChunk, T>(a, blockIdx.x, blockIdx.y, row.b, smem_bytes);
  else chunk_dstates_walk<T>(a, blockIdx.x, blockIdx.y, row.b, smem_bytes);
}

}  // namespace mamba2ssd::cuda
