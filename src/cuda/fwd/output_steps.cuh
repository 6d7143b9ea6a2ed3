// The output of one chunk, as warp-level steps shared by chunk_outputs_sm80 (three-kernel path)
// and the fused walks (segment_scan_sm80, segment_scan_sm90). A warp owns 16 token rows (m0 .. m0 + 15) of the chunk; its accumulators:
//   acc_s[kChunk / 8]    C B^T for its rows (tiles right of the diagonal are never touched)
//   acc_y[kHeadDim / 8]  C h^T, then Y
// The steps, in order: accumulate (C B^T, C h^T) over N; decay_and_mask; add_intra (P X); store_y.
// The kHeadDim columns are those of the head from p_base (the fused walks cut a head dim into
// tiles, kWalkPCols); columns past the head dim (head dim 32 in a 64-column tile) are not stored.
// k3xTf32: fp32 products as 3xTF32 (tile::Mma3xTf32; ForwardParams::fp32_math).
#pragma once

#include <type_traits>

#include "cuda/common/math.cuh"
#include "cuda/fwd/args.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kChunk, int kHeadDim, bool k3xTf32 = false>
struct OutputSteps {
  using M = tile::MmaFor<T, k3xTf32>;
  static constexpr int kSTiles = kChunk / 8, kYTiles = kHeadDim / 8;

  // Column tiles of 8 at or left of the diagonal of the warp's rows.
  static __device__ int diag_tiles(int m0) { return m0 / 8 + 2; }

  // acc_s += C B^T, acc_y += C h^T over k in [0, kK * kSteps): C [token][n], B [token][n], h [p][n].
  template <int kKLen>
  static __device__ void accumulate(tile::FragC (&acc_s)[kSTiles], tile::FragC (&acc_y)[kYTiles], const T* sC,
                                    const T* sB, const T* sH, int ld, int m0) {
    const int diag = diag_tiles(m0);
#pragma unroll
    for (int k0 = 0; k0 < kKLen; k0 += M::kK) {
      const tile::FragA ca = M::load_a(sC, ld, m0, k0);
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
        if (nt < diag) M::mma(acc_s[nt], ca, M::load_b(sB, ld, nt * 8, k0));
#pragma unroll
      for (int pt = 0; pt < kYTiles; ++pt) M::mma(acc_y[pt], ca, M::load_b(sH, ld, pt * 8, k0));
    }
  }

  // Inter-chunk term exp2(g_i) (C h^T)_i, for rows still in the sequence the state belongs to; and
  // the intra-chunk weights (C B^T)_ij exp2(g_i - g_j) dt_j, causal and within one sequence (masked
  // entries are selected away, so an exp2 of a positive gap never reaches the result). g_base: g
  // before the chunk's first token (the state's decay to row i is exp2(g_i - g_base)). A thread
  // holds rows i and i + 8 and column pairs (j, j + 1): g, dt and seq of a pair load as one 8-byte
  // access, and without resets (seq all 0) the sequence test is compiled out.
  static __device__ void decay_and_mask(tile::FragC (&acc_s)[kSTiles], tile::FragC (&acc_y)[kYTiles],
                                        const float* s_g, const float* s_dt, const int32_t* s_seq,
                                        int32_t seq_prev, int m0, bool resets, float g_base = 0.0f) {
    int row[2];
    float g_row[2], row_decay[2];
    int32_t seq_row[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows g and g + 8 of the warp's tile
      row[half] = m0 + tile::frag_row(2 * half);
      g_row[half] = s_g[row[half]];
      seq_row[half] = s_seq[row[half]];
      row_decay[half] = seq_row[half] == seq_prev ? fast_exp2(g_row[half] - g_base) : 0.0f;
    }
#pragma unroll
    for (auto& f : acc_y)
#pragma unroll
      for (int e = 0; e < 4; ++e) f.v[e] *= row_decay[e >> 1];

    const int diag = diag_tiles(m0);
    auto mask = [&](auto with_resets) {
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt) {
        if (nt >= diag) {  // right of the diagonal: never computed by mma.sync, but by a whole-row wgmma
          acc_s[nt] = tile::FragC{};
          continue;
        }
        const int j0 = nt * 8 + tile::frag_col(0);
        const float2 g = *reinterpret_cast<const float2*>(s_g + j0);
        const float2 dt = *reinterpret_cast<const float2*>(s_dt + j0);
        int2 seq = {0, 0};
        if constexpr (decltype(with_resets)::value) seq = *reinterpret_cast<const int2*>(s_seq + j0);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e >> 1, k = e & 1;
          bool keep = j0 + k <= row[half];
          if constexpr (decltype(with_resets)::value) keep = keep && seq_row[half] == (k ? seq.y : seq.x);
          const float w = fast_exp2(g_row[half] - (k ? g.y : g.x)) * (k ? dt.y : dt.x);
          acc_s[nt].v[e] = keep ? acc_s[nt].v[e] * w : 0.0f;
        }
      }
    };
    if (resets) mask(std::true_type{});  // two copies of the unrolled loop, on purpose: without
    else mask(std::false_type{});        // resets the sequence loads and tests vanish
  }

  // decay_and_mask for a chunk without resets, with the intra-chunk weights as two factors:
  // exp2(g_i - g_j) dt_j = exp2(g_i - g_last) w_j, where w_j = dt_j exp2(g_last - g_j) are the state
  // jump's token weights (s_w): a multiply per element instead of an exp2. The caller checks that
  // every |g_j - g_last| of the chunk is below kFactoredRange, so that neither factor leaves fp32's
  // normal range. (A separate loop: sharing one with decay_and_mask changed the portable kernels'
  // code and made chunk_outputs_sm80 (then compute_out) 30% slower on the H200.)
  static constexpr float kFactoredRange = 60.0f;
  static __device__ void decay_and_mask_factored(tile::FragC (&acc_s)[kSTiles], tile::FragC (&acc_y)[kYTiles],
                                                 const float* s_g, const float* s_w, int m0, float g_last,
                                                 float g_base) {
    int row[2];
    float to_last[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row[half] = m0 + tile::frag_row(2 * half);
      const float g_row = s_g[row[half]];
      to_last[half] = fast_exp2(g_row - g_last);
      const float row_decay = fast_exp2(g_row - g_base);
#pragma unroll
      for (auto& f : acc_y) f.v[2 * half] *= row_decay, f.v[2 * half + 1] *= row_decay;
    }
    const int diag = diag_tiles(m0);
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
      if (nt >= diag) {
        acc_s[nt] = tile::FragC{};
        continue;
      }
      const int j0 = nt * 8 + tile::frag_col(0);
      const float2 w = *reinterpret_cast<const float2*>(s_w + j0);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e >> 1, k = e & 1;
        acc_s[nt].v[e] = j0 + k <= row[half] ? acc_s[nt].v[e] * to_last[half] * (k ? w.y : w.x) : 0.0f;
      }
    }
  }

  // acc_y += P X with P = the masked acc_s (registers, as the A operand) and X [token][p].
  static __device__ void add_intra(tile::FragC (&acc_y)[kYTiles], const tile::FragC (&acc_s)[kSTiles],
                                   const T* sX, int ldx, int m0) {
#pragma unroll
    for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
      if (k0 > m0 + 15) continue;
      const tile::FragA pa = tile::a_from_accum<T, k3xTf32>(acc_s, k0 / M::kK);
#pragma unroll
      for (int pt = 0; pt < kYTiles; ++pt) M::mma(acc_y[pt], pa, M::load_b_trans(sX, ldx, pt * 8, k0));
    }
  }

  // D of the thread's output columns (pairs 2q, 2q + 1 of each 8-column tile, from p_base): the
  // same for every chunk of a head, so a walk over chunks reads it once.
  using DFactors = float[kYTiles][2];
  static __device__ void load_d(const FwdTensors& io, int64_t h, int64_t headdim, int p_base, DFactors& d) {
#pragma unroll
    for (int pt = 0; pt < kYTiles; ++pt)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int pi = p_base + pt * 8 + tile::frag_col(0) + k;
        d[pt][k] = pi >= headdim                          ? 0.0f
                   : io.D_layout == DLayout::kPerHeadDim ? io.D[h * headdim + pi]
                   : io.D_layout == DLayout::kPerHead    ? io.D[h]
                                                         : 0.0f;
      }
  }

  // y = (acc_y + D x) * silu(z) for the warp's rows below `rows`; tokens start at t0; x_at(i, p)
  // points at x[i][p] of the chunk in shared memory, with x[i][p + 1] next to it. A thread holds
  // column pairs (2q, 2q + 1): stored as one access when y (and z) allow it.
  template <typename XAt>
  static __device__ void store_y(const tile::FragC (&acc_y)[kYTiles], const FwdTensors& io, int64_t b, int64_t h,
                                 int64_t t0, int rows, XAt x_at, int m0, int64_t headdim, int p_base = 0) {
    T* y = static_cast<T*>(io.y) + b * io.y_stride.s0 + t0 * io.y_stride.s1 + h * io.y_stride.s2 + p_base;
    DFactors d;
    load_d(io, h, headdim, p_base, d);
    finish_y(acc_y, io, b, h, t0, rows, x_at, m0, d, static_cast<int>(headdim - p_base),
             [&](int i, int pi, const float(&v)[2]) { tile::store_pair(y + i * io.y_stride.s1 + pi, io.y_pairs, v); },
             p_base);
  }

  // The gate of one row of the warp's tile: v(pt, k) *= silu(z[pt * 8 + frag_col(0) + k]), z_row
  // pointing at the row's z (from p_base), for the tiles below `cols`; a column pair is read as one
  // access when paired.
  template <typename At>
  static __device__ __forceinline__ void gate_row(const T* z_row, bool paired, int cols, At v) {
#pragma unroll
    for (int pt = 0; pt < kYTiles; ++pt) {
      if (pt * 8 >= cols) break;
      float zv[2];
      tile::load_pair(z_row + pt * 8 + tile::frag_col(0), paired, zv);
      v(pt, 0) *= silu(zv[0]);
      v(pt, 1) *= silu(zv[1]);
    }
  }

  // The same values handed to put(i, p, v) for the pair (y[i][p], y[i][p + 1]) of the tile's
  // columns below `cols` instead of stored; d from load_d. Branches once per row, not per element
  // (the loops stay straight-line code).
  template <typename XAt, typename Put>
  static __device__ void finish_y(const tile::FragC (&acc_y)[kYTiles], const FwdTensors& io, int64_t b, int64_t h,
                                  int64_t t0, int rows, XAt x_at, int m0, const DFactors& d, int cols, Put put,
                                  int p_base = 0) {
    const T* z = io.z ? static_cast<const T*>(io.z) + b * io.z_stride.s0 + t0 * io.z_stride.s1 + h * io.z_stride.s2 + p_base
                      : nullptr;
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows g and g + 8
      const int i = m0 + tile::frag_row(2 * half);
      if (i >= rows) continue;
      float v[kYTiles][2];
#pragma unroll
      for (int pt = 0; pt < kYTiles; ++pt) {
        float xv[2];
        tile::load_pair(x_at(i, pt * 8 + tile::frag_col(0)), true, xv);
#pragma unroll
        for (int k = 0; k < 2; ++k) v[pt][k] = acc_y[pt].v[2 * half + k] + d[pt][k] * xv[k];
      }
      if (z) gate_row(z + i * io.z_stride.s1, io.z_pairs, cols, [&](int pt, int k) -> float& { return v[pt][k]; });
#pragma unroll
      for (int pt = 0; pt < kYTiles; ++pt)
        if (pt * 8 < cols) put(i, pt * 8 + tile::frag_col(0), v[pt]);
    }
  }
};

}  // namespace mamba2ssd::cuda
