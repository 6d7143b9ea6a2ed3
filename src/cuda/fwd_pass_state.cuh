// Kernel 2, fwd_pass_state: one block per (batch, head, 32-row P-tile, 32-column N-tile) walks
// the chunks in order. For each chunk it stores the state entering it, then applies the jump
//   h <- exp2(g_last) h + X^T (B * w),   w_j = dt_j exp2(g_last - g_j)
// as a tensor-core product (K = chunk). Tokens of an earlier sequence than the chunk's last token
// are masked out of w, and the carried state is dropped when a sequence starts inside the chunk.
// The next chunk's X, B, dt and g load (cp.async) while this one multiplies.
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
  static constexpr int kSmemBytes = 2 * 2 * kTileElems * sizeof(T) + (2 * 3 + 1) * kChunk * sizeof(float);
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
  float* s_g = reinterpret_cast<float*>(sB + 2 * Shape::kTileElems);  // [2][chunk] g of the chunk
  float* s_dt = s_g + 2 * kChunk;                                      // [2][chunk] dt of the chunk
  int32_t* s_seq = reinterpret_cast<int32_t*>(s_dt + 2 * kChunk);      // [2][chunk] sequence ids
  float* s_w = reinterpret_cast<float*>(s_seq + 2 * kChunk);           // [chunk] token weights

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
    stage_chunk_scalars<kChunk, Shape::kThreads>(a, b, h, c, s_g + buf * kChunk, s_dt + buf * kChunk,
                                                 s_seq + buf * kChunk);
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
  int32_t seq_prev = 0;
  for (int64_t c = 0; c < a.nchunks; ++c) {
    // The state entering chunk c, for compute_out.
    float* out = a.ws.states + state_index(a, b, c, h);
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) { out[pi * p.dstate + ni] = f.v[e]; });
    const int buf = c & 1;
    if (c + 1 < a.nchunks) {
      stage_chunk(c + 1, buf ^ 1);
      tile::cp_async_wait<1>();
    } else {
      tile::cp_async_wait<0>();
    }
    __syncthreads();

    // The chunk's decay and token weights; a sequence boundary cuts what crosses it.
    const float* g = s_g + buf * kChunk;
    const float* dt = s_dt + buf * kChunk;
    const int32_t* seq = s_seq + buf * kChunk;
    const ChunkJump jump(g, seq, kChunk, seq_prev);
    jump.weights<kChunk, Shape::kThreads>(g, dt, seq, s_w);
    seq_prev = seq[kChunk - 1];
    __syncthreads();
    const T* cx = sX + buf * Shape::kTileElems;
    const T* cB = sB + buf * Shape::kTileElems;
#pragma unroll
    for (auto& f : acc)
      for (float& v : f.v) v *= jump.decay;
#pragma unroll 4
    for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
      tile::FragA xw = M::load_a_trans(cx, kLd, m0, k0);  // X^T: [p][token], times w per token
      M::scale_a_cols(xw, [&](int k) { return s_w[k0 + k]; });
#pragma unroll
      for (int nt = 0; nt < kStateTile / 8; ++nt)
        M::mma(acc[nt], xw, M::load_b_trans(cB, kLd, nt * 8, k0));  // B: [token][n]
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
