// Kernel 2, fwd_pass_state: one block per (batch, head, 32-row P-tile, 32-column N-tile) walks
// the chunks in order. For each chunk it stores the state entering it, then applies the jump
//   h <- exp2(g_last) h + X^T (B * w),   w_j = dt_j exp2(g_last - g_j)
// as a tensor-core product (K = chunk). Tokens of an earlier sequence than the chunk's last token
// are masked out of w, and the carried state is dropped when a sequence starts inside the chunk.
// The next chunk's X and B tiles load (cp.async) while this one multiplies.
#pragma once

#include "cuda/kernel_args.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

constexpr int kStateTile = 32;  // P and N extent of one block's state tile

template <typename T, int kChunk>
struct PassStateShape {
  static constexpr int kWarps = kStateTile / 16;  // one 16-row m-tile of P per warp
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLd = kStateTile + 8;      // padded rows: conflict-free fragment loads
  static constexpr int kTileElems = kChunk * kLd;
  static constexpr int kSmemBytes = 2 * 2 * kTileElems * sizeof(T) + 2 * kChunk * sizeof(float);
};

template <typename T, int kChunk>
__global__ void __launch_bounds__(PassStateShape<T, kChunk>::kThreads)
fwd_pass_state_kernel(Args a) {
  using Shape = PassStateShape<T, kChunk>;
  using M = tile::Mma<T>;
  constexpr int kLd = Shape::kLd;
  const ForwardParams& p = a.p;
  const int64_t n_tiles = (p.dstate + kStateTile - 1) / kStateTile;
  const int n0 = static_cast<int>(blockIdx.x % n_tiles) * kStateTile;
  const int p0 = static_cast<int>(blockIdx.x / n_tiles) * kStateTile;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t grp = h / (p.nheads / p.ngroups);

  extern __shared__ __align__(16) unsigned char smem[];
  T* sX = reinterpret_cast<T*>(smem);        // [2][chunk][kLd]: x of the chunk, columns p0..p0+31
  T* sB = sX + 2 * Shape::kTileElems;        // [2][chunk][kLd]: B of the chunk, columns n0..n0+31
  float* s_w = reinterpret_cast<float*>(sB + 2 * Shape::kTileElems);  // [chunk] token weights
  float* s_decay = s_w + kChunk;             // [1] chunk decay

  const T* x = static_cast<const T*>(p.x) + b * p.x_stride.s0 + h * p.x_stride.s2 + p0;
  const T* B = static_cast<const T*>(p.B) + b * p.B_stride.s0 + grp * p.B_stride.s2 + n0;
  auto stage_chunk = [&](int64_t c, int buf) {
    const int rows = static_cast<int>(p.seqlen - c * kChunk < kChunk ? p.seqlen - c * kChunk : kChunk);
    tile::stage<T, kChunk, kStateTile, Shape::kThreads>(
        sX + buf * Shape::kTileElems, kLd,
        {x + c * kChunk * p.x_stride.s1, p.x_stride.s1, rows, kStateTile, a.x_aligned});
    tile::stage<T, kChunk, kStateTile, Shape::kThreads>(
        sB + buf * Shape::kTileElems, kLd,
        {B + c * kChunk * p.B_stride.s1, p.B_stride.s1, rows, static_cast<int>(p.dstate) - n0, a.B_aligned});
    tile::cp_async_commit();
  };

  // This warp's 16 x 32 piece of the state: rows p0 + m0 .., columns n0 + 8 * nt ..
  const int m0 = tile::warp_id() * 16;
  tile::FragC acc[kStateTile / 8];
  auto for_each_element = [&](auto&& f) {  // f(fragment, element, p index, n index)
#pragma unroll
    for (int nt = 0; nt < kStateTile / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pi = p0 + m0 + tile::frag_row(e), ni = n0 + nt * 8 + tile::frag_col(e);
        if (ni < p.dstate) f(acc[nt], e, pi, ni);
      }
  };
  if (p.initial_states) {
    const Strides4& s = p.initial_states_stride;
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) {
      f.v[e] = p.initial_states[b * s.s0 + h * s.s1 + pi * s.s2 + ni];
    });
  }

  stage_chunk(0, 0);
  for (int64_t c = 0; c < a.nchunks; ++c) {
    // The state entering chunk c, for compute_out.
    float* out = a.ws.states + state_index(a, b, c, h);
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) { out[pi * p.dstate + ni] = f.v[e]; });

    if (c + 1 < a.nchunks) {
      stage_chunk(c + 1, (c + 1) & 1);
      tile::cp_async_wait<1>();
    } else {
      tile::cp_async_wait<0>();
    }
    // Token weights and the chunk's decay; a sequence boundary cuts what crosses it.
    const int64_t t0 = c * kChunk, last = t0 + kChunk - 1;
    const float* g = a.ws.g + token_index(a, b, h, t0);
    const float* dt = a.ws.dt + token_index(a, b, h, t0);
    const int32_t seq_last = a.resets ? seq_of(a, b, last) : 0;
    for (int j = threadIdx.x; j < kChunk; j += Shape::kThreads) {
      const bool same = !a.resets || seq_of(a, b, t0 + j) == seq_last;
      s_w[j] = same ? dt[j] * exp2f(g[kChunk - 1] - g[j]) : 0.0f;
    }
    if (threadIdx.x == 0) {
      const int32_t seq_prev = a.resets && c > 0 ? seq_of(a, b, t0 - 1) : 0;
      s_decay[0] = seq_last == seq_prev ? exp2f(g[kChunk - 1]) : 0.0f;
    }
    __syncthreads();

    const T* cx = sX + (c & 1) * Shape::kTileElems;
    const T* cB = sB + (c & 1) * Shape::kTileElems;
    const float decay = s_decay[0];
    for (auto& f : acc)
      for (float& v : f.v) v *= decay;
#pragma unroll 4
    for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
      const tile::FragA xa = M::load_a_trans(cx, kLd, m0, k0);  // X^T: [p][token]
      for (int nt = 0; nt < kStateTile / 8; ++nt) {
        tile::FragB bw = M::load_b_trans(cB, kLd, nt * 8, k0);  // B: [token][n]
        M::scale_b_rows(bw, s_w + k0);
        M::mma(acc[nt], xa, bw);
      }
    }
    __syncthreads();  // buffers and weights are rewritten next iteration
  }

  if (p.final_states) {
    const Strides4& s = p.final_states_stride;
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) {
      p.final_states[b * s.s0 + h * s.s1 + pi * s.s2 + ni] = f.v[e];
    });
  }
}

}  // namespace mamba2ssd::cuda
