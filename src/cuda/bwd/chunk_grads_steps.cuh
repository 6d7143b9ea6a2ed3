// The steps both chunk_grads kernels take once their products are in registers: the portable one
// (mma.sync, chunk_grads_sm80.cuh) and the Hopper one (wgmma, chunk_grads_sm90.cuh). The math is in
// chunk_grads_sm80.cuh's header. A block works on one 64-token chunk of one head. Its warps are
// kSlabs row slabs times kParts column parts: warp w owns token rows m0 = 16 (w % kSlabs) .. m0 + 15
// and the w / kSlabs-th part of the columns of every product (the portable kernel: four warps, one
// part; the Hopper kernel: two warpgroups, each half of the columns), in the FragC layout whichever
// instruction made it. A row's sums over the columns are left per part and added in chunk_sums. The
// kernels hand their tiles in as accessors at(Slot) (16-bit values as float), so the steps do not
// depend on where a kernel keeps them: the portable kernel reads shared memory at (i, p), the
// Hopper one registers at (pt, half, k).
#pragma once

#include "common/dt.h"
#include "cuda/bwd/args.cuh"
#include "cuda/bwd/grad_steps.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/copy.cuh"

namespace mamba2ssd::cuda {

// An element the steps read from a token tile: row i and column p of the chunk, which is element k
// of pair `half` of column tile pt (of the warp's columns) in the FragC layout.
struct Slot {
  int i, p, half, pt, k;
};

// The chunk's scalars and the sums the warps hand each other, in shared memory.
template <int kChunk_, int kHeadDim, int kSlabs_, int kParts_ = 1>
struct GradScratch {
  static constexpr int kChunk = kChunk_, kSlabs = kSlabs_, kParts = kParts_, kWarps = kSlabs * kParts;
  alignas(16) float g[kChunk];
  alignas(16) float dt[kChunk];
  alignas(16) int32_t seq[kChunk];
  float dxp_dot[kParts][kChunk];    // x_i . dxp_i, each part's columns
  float inter_dot[kParts][kChunk];  // x_j . dxp_inter_j (dt_j applied later)
  float y_dot[kParts][kChunk];      // exp2(g_i) dy_i . (C h^T)_i
  float t_rows[kParts][kChunk];     // sum_j T_ij
  float t_cols[kSlabs][kChunk];     // each row slab's sum_i T_ij
  float dD[kSlabs][kHeadDim];       // each row slab's column sums of dy x
  float hdot[kWarps];               // each warp's share of <dh, h>
  float dt_raw[kChunk];             // the caller's dt (inside the sequence), for d(dt)/d(raw dt)
  float D[kHeadDim];                // D per column (zero without D)
  // The calling warp's row slab and column part.
  static __device__ __forceinline__ int slab() { return tile::warp_id() % kSlabs; }
  static __device__ __forceinline__ int part() { return tile::warp_id() / kSlabs; }
};

// The first column of the calling warp's part, for kTiles column tiles a warp.
template <int kTiles, typename Scratch>
__device__ __forceinline__ int part_col0() { return Scratch::part() * kTiles * 8; }

// What only the last steps read (the caller's dt, for chunk_sums; D, for row_grads): value k of the
// kChunk + kHeadDim values goes to thread k % kThreads; D past the call's head dim (the Hopper
// kernel's 64 columns at head dim 32: TMA's zeros) is zero. Loaded into registers at the kernel's
// start (load) and put into the scratch later (store, a barrier must follow), so that the loads'
// latency hides behind the tiles' loads and the products instead of holding the block.
template <int kHeadDim, int kThreads, typename Scratch>
struct LateInputs {
  static constexpr int kChunk = Scratch::kChunk, kValues = kChunk + kHeadDim;
  static constexpr int kPer = (kValues + kThreads - 1) / kThreads;
  float v[kPer];
  __device__ __forceinline__ void load(const BwdArgs& a, int64_t b, int64_t h, int64_t t0, int rows) {
    const FwdTensors& io = a.io;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int k = static_cast<int>(threadIdx.x) + j * kThreads;
      if (k < kChunk) {
        const int64_t at = b * a.dt_in.dt_stride.s0 + (t0 + k) * a.dt_in.dt_stride.s1 + h * a.dt_in.dt_stride.s2;
        v[j] = k < rows ? load_float(a.dt_in.dt, at, a.dt_in.dt_dtype) : 0.0f;
      } else if (k < kValues) {
        const int p = k - kChunk, P = static_cast<int>(a.geo.headdim);
        v[j] = p >= P                              ? 0.0f
               : io.D_layout == DLayout::kPerHeadDim ? io.D[h * P + p]
               : io.D_layout == DLayout::kPerHead  ? io.D[h]
                                                   : 0.0f;
      }
    }
  }
  __device__ __forceinline__ void store(Scratch& sc) const {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int k = static_cast<int>(threadIdx.x) + j * kThreads;
      if (k < kChunk) sc.dt_raw[k] = v[j];
      else if (k < kValues) sc.D[k - kChunk] = v[j];
    }
  }
};

// Both at once (the portable kernel: its loads then hide behind the tiles' loads only).
template <int kHeadDim, int kThreads, typename Scratch>
__device__ __forceinline__ void load_late_inputs(const BwdArgs& a, int64_t b, int64_t h, int64_t t0, int rows,
                                                 Scratch& sc) {
  LateInputs<kHeadDim, kThreads, Scratch> late;
  late.load(a, b, h, t0, rows);
  late.store(sc);
}

// Column tile nt (of the whole chunk) of the warp's rows of S = C B^T and of M's product dY X^T (not
// yet decayed), with the tile's causal_factors f: M masked and decayed (times dt_j) to the workspace
// for chunk_dbc (every element, zeros included), and T = S * M in fp32 summed into the rows (row)
// and, per row slab, the columns (sc.t_cols).
template <typename T, typename Scratch>
__device__ __forceinline__ void decay_grad_tile(const tile::FragC& s, tile::FragC& m, const float (&f)[4], int nt,
                                                int m0, Scratch& sc, T* m_out, float (&row)[2]) {
  apply_factors(m, f, nt, [&](int j) { return sc.dt[j]; });
  float col[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float v[2] = {m.v[2 * half], m.v[2 * half + 1]};
    tile::store_pair(m_out + (m0 + tile::frag_row(2 * half)) * Scratch::kChunk + nt * 8 + tile::frag_col(0), true, v);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float t = s.v[2 * half + k] * v[k];
      row[half] += t;
      col[k] = half ? col[k] + t : t;
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float v = column_sum(col[k]);
    if (tile::lane_id() < 4) sc.t_cols[Scratch::slab()][nt * 8 + tile::frag_col(0) + k] = v;
  }
}

// Row i of the warp (half 0: frag_row(0), half 1: frag_row(2)): sum over the warp's columns p
// (from col0) of at(i, p) acc_ip, the quad's lanes summed (every lane of the quad gets it).
template <int kTiles, typename At>
__device__ __forceinline__ float row_dot(const tile::FragC (&acc)[kTiles], int i, int half, int col0, At at) {
  float s = 0.0f;
#pragma unroll
  for (int pt = 0; pt < kTiles; ++pt)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const Slot e{i, col0 + pt * 8 + tile::frag_col(0) + k, half, pt, k};
      s += at(e) * acc[pt].v[2 * half + k];
    }
  return quad_sum(s);
}

// The rows of the decay gradient's intra-chunk part: sum_j T_ij (the warp's row partials) and
// dy_i . y_inter_i (acc_y: C h^T, already scaled by exp2(g_i)).
template <int kTiles, typename Scratch, typename DyAt>
__device__ __forceinline__ void decay_grad_rows(const float (&row)[2], const tile::FragC (&acc_y)[kTiles], int m0,
                                                Scratch& sc, DyAt dy_at) {
  const int part = Scratch::part(), col0 = part_col0<kTiles, Scratch>();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = m0 + tile::frag_row(2 * half);
    const float r = quad_sum(row[half]), yd = row_dot(acc_y, i, half, col0, dy_at);
    if ((tile::lane_id() & 3) == 0) sc.t_rows[part][i] = r, sc.y_dot[part][i] = yd;
  }
}

// x_j . dxp_inter_j per row (acc_dx: B dh^T decayed to the chunk's end), for <dh, h_out>.
template <int kTiles, typename Scratch, typename XAt>
__device__ __forceinline__ void inter_dots(const tile::FragC (&acc_dx)[kTiles], int m0, Scratch& sc, XAt x_at) {
  const int part = Scratch::part(), col0 = part_col0<kTiles, Scratch>();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = m0 + tile::frag_row(2 * half);
    const float s = row_dot(acc_dx, i, half, col0, x_at);
    if ((tile::lane_id() & 3) == 0) sc.inter_dot[part][i] = s;
  }
}

// Per row of the warp: dz, dx (to memory), x . dxp (sc.dxp_dot), and the warp's column sums of
// dy x (sc.dD). acc_y: y before D and the gate; acc_dx: dxp. sc.D from load_late_inputs. Columns
// past the call's head dim (head dim 32 in the Hopper kernel's 64: x, dout and z zero there, so
// every sum is untouched) are not stored.
template <typename T, int kHeadDim, int kTiles, typename Scratch, typename XAt, typename DoutAt, typename ZAt>
__device__ __forceinline__ void row_grads(const BwdArgs& a, int64_t b, int64_t h, int64_t t0, int rows, int m0,
                                          const tile::FragC (&acc_y)[kTiles], const tile::FragC (&acc_dx)[kTiles],
                                          Scratch& sc, XAt x_at, DoutAt dout_at, ZAt z_at) {
  const FwdTensors& io = a.io;
  const BwdTensors& gr = a.grad;
  const bool gated = io.z != nullptr;
  const int part = Scratch::part(), col0 = part_col0<kTiles, Scratch>(), P = static_cast<int>(a.geo.headdim);
  float d_col[kTiles][2];
#pragma unroll
  for (int pt = 0; pt < kTiles; ++pt)
#pragma unroll
    for (int k = 0; k < 2; ++k) d_col[pt][k] = sc.D[col0 + pt * 8 + tile::frag_col(0) + k];
  float dD_col[kTiles][2] = {};  // this thread's sums of dy x over its rows
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = m0 + tile::frag_row(2 * half);
    float xdot = 0.0f;
    if (i < rows) {
      const float dt_i = sc.dt[i];
      T* dx_row = static_cast<T*>(gr.dx) + b * gr.dx_stride.s0 + (t0 + i) * gr.dx_stride.s1 + h * gr.dx_stride.s2;
      T* dz_row = gr.dz ? static_cast<T*>(gr.dz) + b * gr.dz_stride.s0 + (t0 + i) * gr.dz_stride.s1 + h * gr.dz_stride.s2
                        : nullptr;
#pragma unroll
      for (int pt = 0; pt < kTiles; ++pt) {
        float dx[2], dz[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int pi = col0 + pt * 8 + tile::frag_col(0) + k;
          const Slot at{i, pi, half, pt, k};
          const float x = x_at(at), y = acc_y[pt].v[2 * half + k];
          const float dout = dout_at(at);
          float dy = dout;
          if (gated) {  // out = (y + D x) silu(z): dz = dout (y + D x) silu'(z)
            const float zv = z_at(at);
            const float sg = 1.0f / (1.0f + __expf(-zv));
            dy = dout * zv * sg;
            dz[k] = dout * (y + d_col[pt][k] * x) * sg * (1.0f + zv * (1.0f - sg));
          }
          const float dxp = acc_dx[pt].v[2 * half + k];
          dx[k] = dt_i * dxp + d_col[pt][k] * dy;
          xdot += x * dxp;
          dD_col[pt][k] += dy * x;
        }
        const int p = col0 + pt * 8 + tile::frag_col(0);  // (the pair's first; head dims are multiples of 8)
        if (kHeadDim == P || p < P) {
          tile::store_pair(dx_row + p, gr.dx_pairs, dx);
          if (dz_row) tile::store_pair(dz_row + p, gr.dz_pairs, dz);
        }
      }
    }
    xdot = quad_sum(xdot);
    if ((tile::lane_id() & 3) == 0) sc.dxp_dot[part][i] = xdot;
  }
#pragma unroll
  for (int pt = 0; pt < kTiles; ++pt)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float v = column_sum(dD_col[pt][k]);
      if (tile::lane_id() < 4) sc.dD[Scratch::slab()][col0 + pt * 8 + tile::frag_col(0) + k] = v;
    }
}

// The chunk's sums in a fixed order, after a barrier that follows row_grads: dD per column by every
// thread; the decay gradient (dA, ddt, ddt_bias) by warp 0. decay: of the state across the chunk;
// sc.dt_raw from load_late_inputs.
template <int kHeadDim, int kThreads, typename Scratch>
__device__ __forceinline__ void chunk_sums(const BwdArgs& a, int64_t b, int64_t h, int64_t c, int rows,
                                           int32_t seq_prev, float decay, const Scratch& sc) {
  constexpr int kChunk = Scratch::kChunk;
  static_assert(kChunk == 64, "warp 0 holds two tokens a lane");
  const BwdTensors& gr = a.grad;
  const int64_t t0 = c * kChunk;
  const int P = static_cast<int>(a.geo.headdim);  // (kHeadDim, or 32 in the Hopper kernel's 64)
  float* dD_part = a.work.dD + chunk_head(a, b, c, h) * P;
  for (int pi = threadIdx.x; pi < P; pi += kThreads) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < Scratch::kSlabs; ++w) s += sc.dD[w][pi];
    dD_part[pi] = s;
  }
  if (tile::warp_id() != 0) return;
  const int lane = tile::lane_id(), j0 = 2 * lane;
  float hsum = 0.0f;
#pragma unroll
  for (int w = 0; w < Scratch::kWarps; ++w) hsum += sc.hdot[w];
  // The row sums of the column parts.
  auto parts = [&](const float (&v)[Scratch::kParts][kChunk], int j) {
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < Scratch::kParts; ++q) s += v[q][j];
    return s;
  };
  const float inter[2] = {parts(sc.inter_dot, j0), parts(sc.inter_dot, j0 + 1)};
  // <dh, h_out> joins dL/dG at the chunk's last token.
  const float e_c = warp_sum(sc.dt[j0] * inter[0] + sc.dt[j0 + 1] * inter[1]) + decay * hsum;
  float v[2];
  bool end[2], start[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int j = j0 + k;
    float t_col = 0.0f;
#pragma unroll
    for (int w = 0; w < Scratch::kSlabs; ++w) t_col += sc.t_cols[w][j];
    v[k] = parts(sc.t_rows, j) - t_col + parts(sc.y_dot, j) - sc.dt[j] * inter[k] + (j == kChunk - 1 ? e_c : 0.0f);
    end[k] = j == kChunk - 1 || sc.seq[j + 1] != sc.seq[j];
    start[k] = sc.seq[j] != (j == 0 ? seq_prev : sc.seq[j - 1]);
  }
  const float2 da = segmented_suffix_sum(v[0], v[1], end[0], end[1]);
  const float A = a.dt_in.A[h], bias = a.dt_in.dt_bias ? a.dt_in.dt_bias[h] : 0.0f;
  float dA = 0.0f, dbias = 0.0f;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int j = j0 + k;
    if (j >= rows) continue;
    const float da_j = start[k] ? 0.0f : (k ? da.y : da.x);
    const DtStep step = preprocess_dt_step(sc.dt_raw[j], bias, a.dt_in.dt_softplus, a.dt_in.dt_min, a.dt_in.dt_max);
    const float ddt = (parts(sc.dxp_dot, j) + A * da_j) * step.dd_ddt;
    store_float(gr.ddt, b * gr.ddt_stride.s0 + (t0 + j) * gr.ddt_stride.s1 + h * gr.ddt_stride.s2, a.dt_in.dt_dtype, ddt);
    dA += sc.dt[j] * da_j;
    dbias += ddt;
  }
  dA = warp_sum(dA);
  dbias = warp_sum(dbias);
  if (lane == 0) {
    a.work.dA[chunk_head(a, b, c, h)] = dA;
    a.work.ddt_bias[chunk_head(a, b, c, h)] = dbias;
  }
}

}  // namespace mamba2ssd::cuda
