// Backward kernel 2: the per-token gradients of one chunk, one block per (chunk, head, batch row),
// one 16-row m-tile of the chunk's 64 tokens per warp. With h the state entering the chunk, dh the
// adjoint of the state leaving it (chunk_dstates_sm80), dy = dout silu(z), and the causal decayed
// matrices W = (C B^T) exp2(g_i - g_j) and M = (dY X^T) exp2(g_i - g_j) dt_j (one sequence, j <= i):
//   y   = exp2(g_i) C h^T + W (dt X)                    (the forward's y before D and the gate)
//   dxp = exp2(g_last - g_j) B dh^T + W^T dY             (dx before its factor dt_j)
//   dx  = dt dxp + D dy,  dz = dout (y + D x) silu'(z),  ddt from dxp and the decay gradient
// M goes to the workspace for chunk_dbc_sm80 (dB, dC), and into the decay gradient in fp32; dA, dD
// and ddt_bias leave per-chunk parts for head_sums. The decay gradient (ssd-backward.md): with
// a_k = A dt_k and G its within-chunk cumulative sum, dL/da_k is the suffix sum, over the tokens of
// k's sequence, of
//   dL/dG_i = sum_j T_ij - sum_j T_ji + exp2(g_i) dy_i . (C h^T)_i - dt_i x_i . dxp_inter_i
//             (+ <dh, h_out> = decay <dh, h> + sum_j dt_j x_j . dxp_inter_j at the last token),
// T_ij = (C B^T)_ij M_ij, and zero at a sequence's first token (a_k multiplies a cut state). Each
// T_ij enters once with each sign, so the pairs inside a suffix cancel exactly: computed as
// dy . y - dt x . dxp instead, the same sum lost 2% of dA to bf16 rounding in the products.
#pragma once

#include <cstddef>

#include "common/dt.h"
#include "cuda/bwd/args.cuh"
#include "cuda/bwd/chunk_grads_steps.cuh"
#include "cuda/bwd/grad_steps.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kHeadDim>
struct ChunkGradsShape {
  static constexpr int kChunk = kBwdChunk;
  static constexpr int kWarps = kChunk / 16;
  static constexpr int kThreads = kWarps * 32;
  // N columns staged at a time: 32 keeps three 16-bit head-dim-64 blocks per multiprocessor (64
  // columns: two, by shared memory) and fp32 head dim 128 within the H200's shared memory.
  static constexpr int kNBlock = 32;
  static constexpr int kLdK = kNBlock + tile::kRowPad<T>;
  static constexpr int kLdX = kHeadDim + tile::kRowPad<T>;
  static constexpr int kLdQ = kChunk + tile::kRowPad<T>;
  struct SharedStorage {
    alignas(16) T C[kChunk][kLdK];      // one N block of C
    alignas(16) T B[kChunk][kLdK];      // one N block of B
    alignas(16) T H[kHeadDim][kLdK];    // one N block of h (the loop over C h^T), then of dh
    alignas(16) T H2[kHeadDim][kLdK];   // the loop over dh: h again, for <dh, h>
    alignas(16) T X[kChunk][kLdX];
    alignas(16) T dout[kChunk][kLdX];
    alignas(16) T dY[kChunk][kLdX];
    alignas(16) T W[kChunk][kLdQ];      // W, for its transposed product with dY
    GradScratch<kChunk, kHeadDim, kWarps> sc;
    alignas(16) T Z[kChunk][kLdX];      // only with z: last, so that a call without z leaves it out
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static constexpr int smem_bytes(bool z) { return z ? kSmemBytes : int{offsetof(SharedStorage, Z)}; }
};
// fp32 training's common call (head dim 64, no z): two blocks a Hopper multiprocessor (228 KB, 1 KB
// reserved a block), as many as its registers allow (176 a thread: ptxas, sm_90a, nvcc 13.0).
static_assert(2 * (ChunkGradsShape<float, 64>::smem_bytes(false) + 1024) <= 228 * 1024,
              "fp32 chunk_grads blocks without z no longer fit two a multiprocessor");

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(ChunkGradsShape<T, kHeadDim>::kThreads) chunk_grads_sm80_kernel(BwdArgs a) {
  wait_previous_kernel();  // the walks' states (a no-op unless launched behind them)
  using Shape = ChunkGradsShape<T, kHeadDim>;
  using M = tile::Mma<T>;
  constexpr int kChunk = Shape::kChunk, kNB = Shape::kNBlock, kLdK = Shape::kLdK, kLdX = Shape::kLdX,
                kLdQ = Shape::kLdQ, kThreads = Shape::kThreads;
  constexpr int kQTiles = kChunk / 8, kPTiles = kHeadDim / 8;
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const BwdTensors& gr = a.grad;
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t grp = geo.group_of(h);
  const int64_t t0 = c * kChunk;
  const int rows = static_cast<int>(geo.seqlen - t0 < kChunk ? geo.seqlen - t0 : kChunk);
  const int m0 = tile::warp_id() * 16;

  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& sm = *reinterpret_cast<typename Shape::SharedStorage*>(smem_bytes);

  // Stage x, dout, z and the chunk scalars (rows past the end and columns past the head dim, which
  // kHeadDim holds: zeros, which add nothing to any product or sum); dy = dout silu(z).
  const int P = static_cast<int>(geo.headdim);
  const T* gx = static_cast<const T*>(io.x) + b * io.x_stride.s0 + t0 * io.x_stride.s1 + h * io.x_stride.s2;
  const T* gdout = static_cast<const T*>(gr.dout) + b * gr.dout_stride.s0 + t0 * gr.dout_stride.s1 + h * gr.dout_stride.s2;
  const T* gz = io.z ? static_cast<const T*>(io.z) + b * io.z_stride.s0 + t0 * io.z_stride.s1 + h * io.z_stride.s2 : nullptr;
  tile::stage<T, kChunk, kHeadDim, kThreads>(sm.X[0], kLdX, {gx, io.x_stride.s1, rows, P, io.x_aligned});
  tile::stage<T, kChunk, kHeadDim, kThreads>(sm.dout[0], kLdX, {gdout, gr.dout_stride.s1, rows, P, gr.dout_aligned});
  if (gz) tile::stage<T, kChunk, kHeadDim, kThreads>(sm.Z[0], kLdX, {gz, io.z_stride.s1, rows, P, gr.z_aligned});
  stage_chunk_scalars<kChunk, kThreads>(a, b, h, c, sm.sc.g, sm.sc.dt, sm.sc.seq);
  load_late_inputs<kHeadDim, kThreads>(a, b, h, t0, rows, sm.sc);
  tile::cp_async_commit();
  tile::cp_async_wait<0>();
  __syncthreads();
  gate_grad_tile<T, kChunk, kHeadDim, kThreads>(sm.dY[0], kLdX, sm.dout[0], gz ? sm.Z[0] : nullptr, nullptr);
  const int32_t seq_prev = a.scan.resets && c > 0 ? seq_of(a, b, t0 - 1) : 0;
  const int32_t seq_last = sm.sc.seq[kChunk - 1];
  const float g_last = sm.sc.g[kChunk - 1];
  const float decay = seq_last == seq_prev ? exp2f(g_last) : 0.0f;  // of the state across the chunk
  __syncthreads();

  // y: C B^T and C h^T over N, then W (registers -> shared memory) and y += W (dt X).
  const T* gC = static_cast<const T*>(io.C) + b * io.C_stride.s0 + t0 * io.C_stride.s1 + grp * io.C_stride.s2;
  const T* gB = static_cast<const T*>(io.B) + b * io.B_stride.s0 + t0 * io.B_stride.s1 + grp * io.B_stride.s2;
  const T* gH = reinterpret_cast<const T*>(a.chunk_states) + chunk_head(a, b, c, h) * P * geo.dstate;
  const T* gDH = static_cast<const T*>(a.work.dstates) + chunk_head(a, b, c, h) * P * geo.dstate;
  tile::FragC acc_y[kPTiles];
  {
    tile::FragC acc_s[kQTiles];
    const int diag = diag_tiles(m0);
    for (int nb = 0; nb < geo.dstate; nb += kNB) {
      const int cols = static_cast<int>(geo.dstate - nb < kNB ? geo.dstate - nb : kNB);
      tile::stage<T, kChunk, kNB, kThreads>(sm.C[0], kLdK, {gC + nb, io.C_stride.s1, rows, cols, io.C_aligned});
      tile::stage<T, kChunk, kNB, kThreads>(sm.B[0], kLdK, {gB + nb, io.B_stride.s1, rows, cols, io.B_aligned});
      tile::stage<T, kHeadDim, kNB, kThreads>(sm.H[0], kLdK, {gH + nb, geo.dstate, P, cols, true});
      tile::cp_async_commit();
      tile::cp_async_wait<0>();
      __syncthreads();
#pragma unroll
      for (int k0 = 0; k0 < kNB; k0 += M::kK) {
        const tile::FragA ca = M::load_a(sm.C[0], kLdK, m0, k0);
#pragma unroll
        for (int nt = 0; nt < kQTiles; ++nt)
          if (nt < diag) M::mma(acc_s[nt], ca, M::load_b(sm.B[0], kLdK, nt * 8, k0));
#pragma unroll
        for (int pt = 0; pt < kPTiles; ++pt) M::mma(acc_y[pt], ca, M::load_b(sm.H[0], kLdK, pt * 8, k0));
      }
      __syncthreads();
    }
    scale_rows(acc_y, m0, [&](int i) { return sm.sc.seq[i] == seq_prev ? fast_exp2(sm.sc.g[i]) : 0.0f; });
    // The decay gradient's intra-chunk part: row and column sums of T = (C B^T) * M, and dy . y_inter.
    // M = (dY X^T) exp2(g_i - g_j) dt_j is made here one column tile at a time, so that T takes it
    // in fp32: taken back from 16-bit storage, M's rounding was most of dA's error (bench.py's 4K
    // row: 9.5e-4, now 5.1e-4). M also goes to the workspace for chunk_dbc_sm80 (every element:
    // zeros included).
    {
      T* m_out = static_cast<T*>(a.work.intra) + chunk_head(a, b, c, h) * kChunk * kChunk;
      float row[2] = {0.0f, 0.0f};
#pragma unroll
      for (int nt = 0; nt < kQTiles; ++nt) {
        tile::FragC m;
        if (nt < diag) {
#pragma unroll
          for (int k0 = 0; k0 < kHeadDim; k0 += M::kK)
            M::mma(m, M::load_a(sm.dY[0], kLdX, m0, k0), M::load_b(sm.X[0], kLdX, nt * 8, k0));
        }
        float f[4];
        causal_factors(f, nt, sm.sc.g, sm.sc.seq, m0);
        decay_grad_tile(acc_s[nt], m, f, nt, m0, sm.sc, m_out, row);
      }
      decay_grad_rows(row, acc_y, m0, sm.sc, [&](const Slot& e) { return tile::to_float(sm.dY[e.i][e.p]); });
    }
    causal_decay(acc_s, sm.sc.g, sm.sc.seq, m0, [](int) { return 1.0f; });
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float v[2] = {acc_s[nt].v[2 * half], acc_s[nt].v[2 * half + 1]};
        tile::store_pair(&sm.W[m0 + tile::frag_row(2 * half)][nt * 8 + tile::frag_col(0)], true, v);
      }
    // y += W (dt X): dt_j folded into W's columns, in registers (shared memory keeps W without it).
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt].v[e] *= sm.sc.dt[nt * 8 + tile::frag_col(e)];
#pragma unroll
    for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
      if (k0 > m0 + 15) continue;
      const tile::FragA wa = tile::a_from_accum<T>(acc_s, k0 / M::kK);
#pragma unroll
      for (int pt = 0; pt < kPTiles; ++pt) M::mma(acc_y[pt], wa, M::load_b_trans(sm.X[0], kLdX, pt * 8, k0));
    }
  }

  // dxp: B dh^T over N (and <dh, h> on the side), masked and decayed to the chunk's end, then W^T dY.
  auto x_at = [&](const Slot& e) { return tile::to_float(sm.X[e.i][e.p]); };
  tile::FragC acc_dx[kPTiles];
  float hdot = 0.0f;
  for (int nb = 0; nb < geo.dstate; nb += kNB) {
    const int cols = static_cast<int>(geo.dstate - nb < kNB ? geo.dstate - nb : kNB);
    tile::stage<T, kChunk, kNB, kThreads>(sm.B[0], kLdK, {gB + nb, io.B_stride.s1, rows, cols, io.B_aligned});
    tile::stage<T, kHeadDim, kNB, kThreads>(sm.H[0], kLdK, {gDH + nb, geo.dstate, P, cols, true});
    tile::stage<T, kHeadDim, kNB, kThreads>(sm.H2[0], kLdK, {gH + nb, geo.dstate, P, cols, true});
    tile::cp_async_commit();
    tile::cp_async_wait<0>();
    __syncthreads();
    for (int k = threadIdx.x; k < kHeadDim * kNB / 2; k += kThreads) {  // <dh, h>, a pair at a time
      const int r = k / (kNB / 2), n = (k % (kNB / 2)) * 2;
      float dh[2], hv[2];
      tile::load_pair(&sm.H[r][n], true, dh);
      tile::load_pair(&sm.H2[r][n], true, hv);
      hdot += dh[0] * hv[0] + dh[1] * hv[1];
    }
#pragma unroll
    for (int k0 = 0; k0 < kNB; k0 += M::kK) {
      const tile::FragA ba = M::load_a(sm.B[0], kLdK, m0, k0);
#pragma unroll
      for (int pt = 0; pt < kPTiles; ++pt) M::mma(acc_dx[pt], ba, M::load_b(sm.H[0], kLdK, pt * 8, k0));
    }
    __syncthreads();
  }
  scale_rows(acc_dx, m0, [&](int j) { return sm.sc.seq[j] == seq_last ? fast_exp2(g_last - sm.sc.g[j]) : 0.0f; });
  inter_dots(acc_dx, m0, sm.sc, x_at);
#pragma unroll
  for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
    if (k0 + M::kK <= m0) continue;  // W_ij is zero for i < j
    const tile::FragA wa = M::load_a_trans(sm.W[0], kLdQ, m0, k0);
#pragma unroll
    for (int pt = 0; pt < kPTiles; ++pt) M::mma(acc_dx[pt], wa, M::load_b_trans(sm.dY[0], kLdX, pt * 8, k0));
  }
  hdot = warp_sum(hdot);
  if (tile::lane_id() == 0) sm.sc.hdot[tile::warp_id()] = hdot;

  row_grads<T, kHeadDim>(a, b, h, t0, rows, m0, acc_y, acc_dx, sm.sc, x_at,
                         [&](const Slot& e) { return tile::to_float(sm.dout[e.i][e.p]); },
                         [&](const Slot& e) { return tile::to_float(sm.Z[e.i][e.p]); });
  __syncthreads();
  chunk_sums<kHeadDim, kThreads>(a, b, h, c, rows, seq_prev, decay, sm.sc);
}

}  // namespace mamba2ssd::cuda
