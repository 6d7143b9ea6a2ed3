// Warp-level steps shared by the backward's chunk kernels. A warp owns 16 token rows (m0 ..
// m0 + 15) of a 64-token chunk; a FragC holds rows frag_row(e) and columns frag_col(e) of its
// 16 x 8 tile (tile/mma.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/element.cuh"
#include "cuda/common/math.cuh"
#include "cuda/tile/mma.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

// Column tiles of 8 at or left of the diagonal of the warp's rows.
__device__ __forceinline__ int diag_tiles(int m0) { return m0 / 8 + 2; }

// The causal decay of column tile nt of a token-by-token matrix (rows i, columns j of the chunk), in
// the FragC layout: f_ij = exp2(g_i - g_j) where j <= i and tokens i and j are of one sequence, else
// 0 (a select, so an exp2 of a positive gap never reaches the result). Tiles right of the diagonal
// are zeros (the portable kernels never computed them).
__device__ __forceinline__ void causal_factors(float (&f)[4], int nt, const float* s_g, const int32_t* s_seq, int m0) {
  const bool left = nt < diag_tiles(m0);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int i = m0 + tile::frag_row(e), j = nt * 8 + tile::frag_col(e);
    const bool keep = left && j <= i && s_seq[i] == s_seq[j];
    f[e] = keep ? fast_exp2(s_g[i] - s_g[j]) : 0.0f;
  }
}

// acc_ij *= f_ij col_w(j) for column tile nt, and 0 where f_ij is (whatever acc_ij holds).
template <typename ColW>
__device__ __forceinline__ void apply_factors(tile::FragC& acc, const float (&f)[4], int nt, ColW col_w) {
#pragma unroll
  for (int e = 0; e < 4; ++e) acc.v[e] = f[e] != 0.0f ? acc.v[e] * f[e] * col_w(nt * 8 + tile::frag_col(e)) : 0.0f;
}

// The causal, decayed form of column tile nt: acc_ij *= exp2(g_i - g_j) col_w(j) where causal_factors
// keeps (i, j), else 0.
template <typename ColW>
__device__ __forceinline__ void causal_decay_tile(tile::FragC& acc, int nt, const float* s_g, const int32_t* s_seq,
                                                  int m0, ColW col_w) {
  float f[4];
  causal_factors(f, nt, s_g, s_seq, m0);
  apply_factors(acc, f, nt, col_w);
}

// causal_decay_tile over every column tile of the warp's rows.
template <int kTiles, typename ColW>
__device__ __forceinline__ void causal_decay(tile::FragC (&acc)[kTiles], const float* s_g, const int32_t* s_seq,
                                             int m0, ColW col_w) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) causal_decay_tile(acc[nt], nt, s_g, s_seq, m0, col_w);
}

// acc_i *= w(i) for each row i of the warp's tiles.
template <int kTiles, typename RowW>
__device__ __forceinline__ void scale_rows(tile::FragC (&acc)[kTiles], int m0, RowW row_w) {
  const float w0 = row_w(m0 + tile::frag_row(0)), w1 = row_w(m0 + tile::frag_row(2));
#pragma unroll
  for (auto& f : acc) f.v[0] *= w0, f.v[1] *= w0, f.v[2] *= w1, f.v[3] *= w1;
}

// The sum over the 4 lanes that hold one row (a butterfly: every lane gets the same bits).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// The sum over the 8 row groups of lanes (lanes l, l ^ 4, .., l ^ 28): a column of a warp's 16-row
// tile, in each lane of the quad position (a butterfly: every such lane gets the same bits).
__device__ __forceinline__ float column_sum(float v) {
#pragma unroll
  for (int o = 4; o < 32; o *= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum over the warp (a butterfly: every lane gets the same bits, whatever the schedule).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Within-sequence suffix sums of a 64-token chunk, by one warp (lane l holds tokens 2l, 2l + 1):
// s_j = v_j + s_{j+1} unless token j ends its piece of sequence (end_j). A range's summary is
// (S, F): S its first token's sum from inside the range, F whether a piece ends inside it; ranges
// combine as (S_a + (F_a ? 0 : S_b), F_a || F_b), scanned from the right with shuffles.
__device__ __forceinline__ float2 segmented_suffix_sum(float v0, float v1, bool end0, bool end1) {
  const int lane = tile::lane_id();
  float S = v0 + (end0 ? 0.0f : v1);
  bool F = end0 || end1;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const float S_other = __shfl_down_sync(0xffffffffu, S, o);
    const bool F_other = __shfl_down_sync(0xffffffffu, F, o);
    if (lane + o < 32) {
      S += F ? 0.0f : S_other;
      F = F || F_other;
    }
  }
  float next = __shfl_down_sync(0xffffffffu, S, 1);  // the sum entering from lane l + 1's tokens
  if (lane == 31) next = 0.0f;
  const float s1 = v1 + (end1 ? 0.0f : next);
  return {v0 + (end0 ? 0.0f : s1), s1};
}

// Block-level staging helpers (every thread of the block takes part; a barrier must follow).

// tile[r][c] *= w[r] for a kRows x kCols shared tile, a pair of elements at a time.
template <typename T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void scale_tile_rows(T* tile_, int ld, const float* w) {
  for (int k = threadIdx.x; k < kRows * kCols / 2; k += kThreads) {
    const int r = k / (kCols / 2), col = (k % (kCols / 2)) * 2;
    float v[2];
    tile::load_pair(tile_ + r * ld + col, true, v);
    v[0] *= w[r], v[1] *= w[r];
    tile::store_pair(tile_ + r * ld + col, true, v);
  }
}

// dy = dout silu(z) (z null: dout) times w[r] (w null: 1), for a kRows x kCols tile in shared memory;
// kTf32: fp32 dy rounded to TF32, for TF32 wgmma (which would truncate it).
template <typename T, int kRows, int kCols, int kThreads, bool kTf32 = false>
__device__ __forceinline__ void gate_grad_tile(T* dy, int ld, const T* dout, const T* z, const float* w) {
  static_assert(!kTf32 || sizeof(T) == 4, "TF32 rounding is for fp32 tiles");
  for (int k = threadIdx.x; k < kRows * kCols / 2; k += kThreads) {
    const int r = k / (kCols / 2), col = (k % (kCols / 2)) * 2;
    float v[2];
    tile::load_pair(dout + r * ld + col, true, v);
    if (z) {
      float zv[2];
      tile::load_pair(z + r * ld + col, true, zv);
      v[0] *= silu(zv[0]), v[1] *= silu(zv[1]);
    }
    if (w) v[0] *= w[r], v[1] *= w[r];
    if constexpr (kTf32) v[0] = __uint_as_float(tile::to_tf32(v[0])), v[1] = __uint_as_float(tile::to_tf32(v[1]));
    tile::store_pair(dy + r * ld + col, true, v);
  }
}

}  // namespace mamba2ssd::cuda
