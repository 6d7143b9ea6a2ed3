// Backward kernel 3: dB and dC of one chunk, one block per (chunk, group x block of N's columns,
// batch row), summing the group's heads in head order inside the block (deterministic, no atomics,
// and each head's state blocks are read once). One 16-row m-tile of the chunk and one part of the
// block's columns per warp. Per head,
// with M from chunk_grads_sm80 (causal, decayed, dt_j folded in):
//   dC_i += M_i. B + (exp2(g_i) dy_i) h             (rows of the sequence that entered the chunk)
//   dB_j += M_.j^T C + (dt_j exp2(g_last - g_j) x_j) dh   (rows of the chunk's last sequence)
// The row factors are the forward's (the state's decay to token i, the state jump's weights), so
// they scale the staged dY and X rows before the products.
#pragma once

#include <cstddef>

#include "cuda/bwd/args.cuh"
#include "cuda/bwd/grad_steps.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

// kWide (16-bit inputs, state above 64): 128 state columns a block, split between two sets of four
// warps, so that a state of 128 reads each head's x, dout, z and M once per chunk; registers held at
// 128 for two head-dim-64 blocks per multiprocessor. Otherwise one set of four warps over 64
// columns (32 for fp32, which keeps head dim 128 within the H200's shared memory): a narrow state
// would leave half a wide block's warps on zero columns.
template <typename T, int kHeadDim, bool kWide = false>
struct ChunkDbcShape {
  static_assert(!kWide || sizeof(T) == 2, "the wide block is for 16-bit inputs");
  static constexpr int kChunk = kBwdChunk;
  static constexpr int kNBlock = kWide ? 128 : sizeof(T) == 4 ? 32 : 64;
  static constexpr int kColWarps = kWide ? 2 : 1;
  static constexpr int kWarps = kChunk / 16 * kColWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMinBlocks = kHeadDim <= 64 ? 2 : 1;  // the wide block's
  static constexpr int kLdK = kNBlock + tile::kRowPad<T>;
  static constexpr int kLdX = kHeadDim + tile::kRowPad<T>;
  static constexpr int kLdQ = kChunk + tile::kRowPad<T>;
  struct SharedStorage {
    alignas(16) T C[kChunk][kLdK];     // the block's N columns of C and B (the group's)
    alignas(16) T B[kChunk][kLdK];
    alignas(16) T H[kHeadDim][kLdK];   // the head's state entering the chunk, the block's columns
    alignas(16) T DH[kHeadDim][kLdK];  // the adjoint of the state leaving it
    alignas(16) T Xs[kChunk][kLdX];    // x, then scaled by the state jump's weights
    alignas(16) T dYs[kChunk][kLdX];   // dout, then dy scaled by the state's decay to each token
    alignas(16) T Mi[kChunk][kLdQ];    // M
    alignas(16) float g[kChunk];
    float dt[kChunk];
    int32_t seq[kChunk];
    float wx[kChunk], wy[kChunk];      // the row factors of x and dy
    alignas(16) T Z[kChunk][kLdX];     // only with z: last, so that a call without z leaves it out
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static constexpr int smem_bytes(bool z) { return z ? kSmemBytes : int{offsetof(SharedStorage, Z)}; }
};

template <typename T, int kHeadDim, bool kWide>
__device__ __forceinline__ void chunk_dbc_sm80(const BwdArgs& a) {
  using Shape = ChunkDbcShape<T, kHeadDim, kWide>;
  using M = tile::Mma<T>;
  constexpr int kChunk = Shape::kChunk, kNB = Shape::kNBlock, kLdK = Shape::kLdK, kLdX = Shape::kLdX,
                kLdQ = Shape::kLdQ, kThreads = Shape::kThreads;
  constexpr int kNTiles = kNB / Shape::kColWarps / 8;  // a warp's columns
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const BwdTensors& gr = a.grad;
  const int64_t n_blocks = (geo.dstate + kNB - 1) / kNB;
  const int64_t c = blockIdx.x, grp = blockIdx.y / n_blocks, b = blockIdx.z;
  const int nb = static_cast<int>(blockIdx.y % n_blocks) * kNB;
  const int cols = static_cast<int>(geo.dstate - nb < kNB ? geo.dstate - nb : kNB);
  const int64_t t0 = c * kChunk;
  const int rows = static_cast<int>(geo.seqlen - t0 < kChunk ? geo.seqlen - t0 : kChunk);
  const int m0 = tile::warp_id() % (kChunk / 16) * 16, n0 = tile::warp_id() / (kChunk / 16) * kNTiles * 8;
  const int P = static_cast<int>(geo.headdim);  // kHeadDim holds it; the rest of each tile stages as zeros

  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& sm = *reinterpret_cast<typename Shape::SharedStorage*>(smem_bytes);

  const T* gC = static_cast<const T*>(io.C) + b * io.C_stride.s0 + t0 * io.C_stride.s1 + grp * io.C_stride.s2 + nb;
  const T* gB = static_cast<const T*>(io.B) + b * io.B_stride.s0 + t0 * io.B_stride.s1 + grp * io.B_stride.s2 + nb;
  tile::stage<T, kChunk, kNB, kThreads>(sm.C[0], kLdK, {gC, io.C_stride.s1, rows, cols, io.C_aligned});
  tile::stage<T, kChunk, kNB, kThreads>(sm.B[0], kLdK, {gB, io.B_stride.s1, rows, cols, io.B_aligned});
  tile::cp_async_commit();
  const int32_t seq_prev = a.scan.resets && c > 0 ? seq_of(a, b, t0 - 1) : 0;

  tile::FragC acc_dc[kNTiles], acc_db[kNTiles];
  const int64_t heads_per_group = geo.nheads / geo.ngroups;
  for (int64_t h = grp * heads_per_group; h < (grp + 1) * heads_per_group; ++h) {
    const T* gx = static_cast<const T*>(io.x) + b * io.x_stride.s0 + t0 * io.x_stride.s1 + h * io.x_stride.s2;
    const T* gdout = static_cast<const T*>(gr.dout) + b * gr.dout_stride.s0 + t0 * gr.dout_stride.s1 + h * gr.dout_stride.s2;
    const T* gz = io.z ? static_cast<const T*>(io.z) + b * io.z_stride.s0 + t0 * io.z_stride.s1 + h * io.z_stride.s2 : nullptr;
    const T* gM = static_cast<const T*>(a.work.intra) + chunk_head(a, b, c, h) * kChunk * kChunk;
    tile::stage<T, kChunk, kHeadDim, kThreads>(sm.Xs[0], kLdX, {gx, io.x_stride.s1, rows, P, io.x_aligned});
    tile::stage<T, kChunk, kHeadDim, kThreads>(sm.dYs[0], kLdX, {gdout, gr.dout_stride.s1, rows, P, gr.dout_aligned});
    if (gz) tile::stage<T, kChunk, kHeadDim, kThreads>(sm.Z[0], kLdX, {gz, io.z_stride.s1, rows, P, gr.z_aligned});
    tile::stage<T, kChunk, kChunk, kThreads>(sm.Mi[0], kLdQ, {gM, kChunk, kChunk, kChunk, true});
    stage_chunk_scalars<kChunk, kThreads>(a, b, h, c, sm.g, sm.dt, sm.seq);
    const T* gH = reinterpret_cast<const T*>(a.chunk_states) + chunk_head(a, b, c, h) * P * geo.dstate + nb;
    const T* gDH = static_cast<const T*>(a.work.dstates) + chunk_head(a, b, c, h) * P * geo.dstate + nb;
    tile::stage<T, kHeadDim, kNB, kThreads>(sm.H[0], kLdK, {gH, geo.dstate, P, cols, true});
    tile::stage<T, kHeadDim, kNB, kThreads>(sm.DH[0], kLdK, {gDH, geo.dstate, P, cols, true});
    tile::cp_async_commit();
    tile::cp_async_wait<0>();
    __syncthreads();

    // The row factors, then the scaled rows of x and dy.
    const int32_t seq_last = sm.seq[kChunk - 1];
    const float g_last = sm.g[kChunk - 1];
    for (int i = threadIdx.x; i < kChunk; i += kThreads) {
      sm.wx[i] = sm.seq[i] == seq_last ? sm.dt[i] * fast_exp2(g_last - sm.g[i]) : 0.0f;
      sm.wy[i] = sm.seq[i] == seq_prev ? fast_exp2(sm.g[i]) : 0.0f;
    }
    __syncthreads();
    scale_tile_rows<T, kChunk, kHeadDim, kThreads>(sm.Xs[0], kLdX, sm.wx);
    gate_grad_tile<T, kChunk, kHeadDim, kThreads>(sm.dYs[0], kLdX, sm.dYs[0], gz ? sm.Z[0] : nullptr, sm.wy);
    __syncthreads();

#pragma unroll
    for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
      if (k0 <= m0 + 15) {  // dC_i: M_ij for j <= i
        const tile::FragA ma = M::load_a(sm.Mi[0], kLdQ, m0, k0);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) M::mma(acc_dc[nt], ma, M::load_b_trans(sm.B[0], kLdK, n0 + nt * 8, k0));
      }
      if (k0 + M::kK > m0) {  // dB_j: M_ij for i >= j
        const tile::FragA ma = M::load_a_trans(sm.Mi[0], kLdQ, m0, k0);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) M::mma(acc_db[nt], ma, M::load_b_trans(sm.C[0], kLdK, n0 + nt * 8, k0));
      }
    }
#pragma unroll
    for (int k0 = 0; k0 < kHeadDim; k0 += M::kK) {
      const tile::FragA ya = M::load_a(sm.dYs[0], kLdX, m0, k0);
      const tile::FragA xa = M::load_a(sm.Xs[0], kLdX, m0, k0);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        M::mma(acc_dc[nt], ya, M::load_b_trans(sm.H[0], kLdK, n0 + nt * 8, k0));
        M::mma(acc_db[nt], xa, M::load_b_trans(sm.DH[0], kLdK, n0 + nt * 8, k0));
      }
    }
    __syncthreads();  // the next head restages every buffer but C and B
  }

  T* dC = static_cast<T*>(gr.dC) + b * gr.dC_stride.s0 + t0 * gr.dC_stride.s1 + grp * gr.dC_stride.s2 + nb;
  T* dB = static_cast<T*>(gr.dB) + b * gr.dB_stride.s0 + t0 * gr.dB_stride.s1 + grp * gr.dB_stride.s2 + nb;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = m0 + tile::frag_row(2 * half);
    if (i >= rows) continue;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int n = n0 + nt * 8 + tile::frag_col(0);
      if (n >= cols) continue;
      const float vc[2] = {acc_dc[nt].v[2 * half], acc_dc[nt].v[2 * half + 1]};
      const float vb[2] = {acc_db[nt].v[2 * half], acc_db[nt].v[2 * half + 1]};
      tile::store_pair(dC + i * gr.dC_stride.s1 + n, gr.dC_pairs, vc);
      tile::store_pair(dB + i * gr.dB_stride.s1 + n, gr.dB_pairs, vb);
    }
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(ChunkDbcShape<T, kHeadDim>::kThreads) chunk_dbc_sm80_kernel(BwdArgs a) {
  wait_previous_kernel();  // chunk_grads' M and the walks' states (a no-op unless launched behind them)
  chunk_dbc_sm80<T, kHeadDim, false>(a);
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(ChunkDbcShape<T, kHeadDim, true>::kThreads, ChunkDbcShape<T, kHeadDim, true>::kMinBlocks)
    chunk_dbc_wide_sm80_kernel(BwdArgs a) {
  wait_previous_kernel();
  chunk_dbc_sm80<T, kHeadDim, true>(a);
}

}  // namespace mamba2ssd::cuda
