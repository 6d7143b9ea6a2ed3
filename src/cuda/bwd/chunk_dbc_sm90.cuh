// Backward kernel 4 on Hopper (sm_90a): chunk_dbc_sm80's dB and dC (the math is in its header)
// with every product on wgmma and every tile brought by TMA. One block per (chunk, group x block
// of kN state columns, batch row) sums the group's heads in head order, as the portable kernel:
//   dC_i += M_i. B + (exp2(g_i) dy_i) h              warpgroup 0
//   dB_j += M_.j^T C + (dt_j exp2(g_last - g_j) x_j) dh   warpgroup 1
// Each warpgroup holds its 64 x kN sum in registers over the heads; a producer warp brings each
// head's tiles (x, dout, z, M, h, dh and the chunk's g and dt) into one of two stages while the
// warpgroups multiply the other, so the block streams its heads' bytes instead of loading, then
// computing (the portable kernel: ncu 44% of the memory's peak). The row factors scale dy and x in
// registers, on their way from shared memory into the products' A fragments; M and M^T come by
// ldmatrix. Head dim 64 (32 in its 64 columns: TMA's zeros past it add nothing).
//
// fp32 inputs run the products on TF32, whose wgmma reads a 32-bit shared-memory operand K-major
// only (and truncates it): each warpgroup turns its group tile (B or C, [token][n]) once and each
// head's state tile (h or dh, [p][n]) into their transposes [n][token], [n][p] in their own places,
// rounded (wg::transpose_tf32_in_place), and gathers its A fragments (the scaled rows, M or M^T)
// in registers, rounded (tf32_rows_a). The tiles take twice the bytes, so a block holds 64 state
// columns (dbc_sm90_cols).
#pragma once

#include "cuda/bwd/args_sm90.cuh"
#include "cuda/bwd/grad_steps.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/tile/tma.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct ChunkDbcSm90Shape {
  static constexpr bool kTf32 = sizeof(T) == 4;  // fp32 inputs: TF32 products
  static constexpr int kChunk = kBwdChunk, kHeadDim = 64, kStages = 2;
  static constexpr int kConsumers = 256, kThreads = kConsumers + 32;  // two warpgroups and a producer warp
  using TokTile = tile::wg::SwizzledTile<kChunk, kHeadDim, sizeof(T)>;  // x, dout, z [token][p]; M [i][j]
  using NTile = tile::wg::SwizzledTile<kChunk, kN, sizeof(T)>;          // C, B [token][n]; h, dh [p][n]
  using NtTile = tile::wg::SwizzledTile<kN, kChunk, sizeof(T)>;  // fp32: their transposes, in their places
  static_assert(kHeadDim == kChunk, "M, h and dh share the token tiles' rows");
  static_assert(!kTf32 || kN == 64, "fp32 blocks hold 64 state columns (dbc_sm90_cols)");
  struct Stage {  // one head's tiles, each whole swizzle atoms
    T X[TokTile::kElems], dout[TokTile::kElems], Z[TokTile::kElems], M[TokTile::kElems];
    T H[NTile::kElems], DH[NTile::kElems];
  };
  struct SharedStorage {  // placed at a 1024-byte aligned address
    Stage stage[kStages];
    T C[NTile::kElems], B[NTile::kElems];
    alignas(16) float g[kStages][kChunk];
    alignas(16) float dt[kStages][kChunk];
    int32_t seq[kChunk];
    uint64_t full[kStages], empty[kStages], cb;  // a stage landed / released; C and B landed
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage) + 1024;  // and the alignment's slack
  static_assert(kSmemBytes <= 227 * 1024, "a block exceeds shared memory");
  static constexpr uint32_t kTokBytes = TokTile::kElems * sizeof(T), kNBytes = NTile::kElems * sizeof(T);
  static constexpr uint32_t kScalarBytes = kChunk * sizeof(float);
};

// The A fragments of a 64 x 64 token tile's rows m0 .. m0 + 15 (the warp's), each row i scaled by
// w(i) and, with z, dy = dout silu(z) first: frags[ks] covers columns 16 ks .. 16 ks + 15.
template <typename T, typename Tile, int kSteps, typename RowW>
__device__ __forceinline__ void scaled_row_frags(tile::FragA (&frags)[kSteps], const T* tile_, const T* z, int m0,
                                                 RowW w) {
  const float w_lo = w(m0 + tile::frag_row(0)), w_hi = w(m0 + tile::frag_row(2));
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    uint32_t r[4];
    tile::wg::load_accum_pair<Tile>(tile_, m0, 16 * ks, r);  // r[0], r[2]: row frag_row(0); r[1], r[3]: + 8
    uint32_t zr[4];
    if (z) tile::wg::load_accum_pair<Tile>(z, m0, 16 * ks, zr);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float2 v = tile::unpack2<T>(r[q]);
      if (z) {
        const float2 zv = tile::unpack2<T>(zr[q]);
        v.x *= silu(zv.x), v.y *= silu(zv.y);
      }
      const float f = q & 1 ? w_hi : w_lo;
      frags[ks].r[q] = tile::pack2<T>(v.x * f, v.y * f);
    }
  }
}

// TF32: the A fragment of k-step ks (k = 8 ks ..) for a warp's rows m0 .. m0 + 15 of the 64 x 64
// fp32 tile t, stored [row][k] (kTrans: [k][row]), with z (else null) times silu(z), rows m0 + g
// times f_lo and m0 + g + 8 times f_hi (g = lane / 4), rounded: MmaTf32's register layout.
template <typename Tile, bool kTrans>
__device__ __forceinline__ tile::FragA tf32_rows_a(const float* t, const float* z, int m0, int ks, float f_lo,
                                                   float f_hi) {
  const int r = m0 + (tile::lane_id() >> 2), k = 8 * ks + (tile::lane_id() & 3);
  auto at = [](int row, int col) { return kTrans ? Tile::offset(col, row) : Tile::offset(row, col); };
  const int idx[4] = {at(r, k), at(r + 8, k), at(r, k + 4), at(r + 8, k + 4)};
  tile::FragA a;
#pragma unroll
  for (int q = 0; q < 4; ++q) a.r[q] = tile::to_tf32(t[idx[q]] * (z ? silu(z[idx[q]]) : 1.0f) * (q & 1 ? f_hi : f_lo));
  return a;
}

template <typename T, int kN>
__global__ void __launch_bounds__(ChunkDbcSm90Shape<T, kN>::kThreads, 1)
    chunk_dbc_sm90_kernel(const __grid_constant__ DbcSm90Args a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  namespace tma = tile::tma;
  using Shape = ChunkDbcSm90Shape<T, kN>;
  using TokTile = typename Shape::TokTile;
  using NTile = typename Shape::NTile;
  using NtTile = typename Shape::NtTile;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kStages = Shape::kStages;
  constexpr int kTokSteps = kChunk / (Shape::kTf32 ? 8 : 16), kNTiles = kN / 8;  // k steps of a product
  const Geometry& geo = a.geo;
  const int64_t n_blocks = (geo.dstate + kN - 1) / kN;
  const int64_t c = blockIdx.x, grp = blockIdx.y / n_blocks, b = blockIdx.z;
  const int nb = static_cast<int>(blockIdx.y % n_blocks) * kN;
  const int64_t t0 = c * kChunk, heads = geo.nheads / geo.ngroups, h0 = grp * heads;
  const bool gated = a.io.z != nullptr;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& sm = *tma::align_1024<typename Shape::SharedStorage>(smem_bytes);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) tma::barrier_init(&sm.full[s], 1), tma::barrier_init(&sm.empty[s], Shape::kConsumers);
    tma::barrier_init(&sm.cb, 1);
    tma::barrier_init_fence();
  }
  wait_previous_kernel();  // chunk_grads' M and the walks' states
  start_next_kernel();
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) sm.seq[i] = a.scan.resets ? a.scan.seq[b * a.scan.lpad + t0 + i] : 0;
  __syncthreads();

  if (threadIdx.x >= Shape::kConsumers) {  // the producer warp: one thread issues every copy
    if (threadIdx.x != Shape::kConsumers) return;
    const int tok = static_cast<int>(t0), bi = static_cast<int>(b), gi = static_cast<int>(grp);
    const int state_row = static_cast<int>(b * a.scan.nchunks + c);  // (b, c) of the [b x nchunks] views
    tma::arrive_expect_bytes(&sm.cb, 2 * Shape::kNBytes);
    constexpr int kE = sizeof(T);
    tma::load_swizzled_tile<kChunk, kN, kE>(sm.C, &a.C_map, tok, gi, bi, &sm.cb, nb);
    tma::load_swizzled_tile<kChunk, kN, kE>(sm.B, &a.B_map, tok, gi, bi, &sm.cb, nb);
    for (int64_t k = 0; k < heads; ++k) {
      const int s = static_cast<int>(k % kStages);
      if (k >= kStages) tma::wait(&sm.empty[s], static_cast<uint32_t>((k / kStages - 1) & 1));
      const int hi = static_cast<int>(h0 + k);
      typename Shape::Stage& st = sm.stage[s];
      tma::arrive_expect_bytes(&sm.full[s],
                               (gated ? 4 : 3) * Shape::kTokBytes + 2 * Shape::kNBytes + 2 * Shape::kScalarBytes);
      tma::load_swizzled_tile<kChunk, kP, kE>(st.X, &a.x_map, tok, hi, bi, &sm.full[s]);
      tma::load_swizzled_tile<kChunk, kP, kE>(st.dout, &a.dout_map, tok, hi, bi, &sm.full[s]);
      if (gated) tma::load_swizzled_tile<kChunk, kP, kE>(st.Z, &a.z_map, tok, hi, bi, &sm.full[s]);
      tma::load_swizzled_tile<kChunk, kChunk, kE>(st.M, &a.m_map, 0, hi, state_row, &sm.full[s]);
      tma::load_swizzled_tile<kP, kN, kE>(st.H, &a.h_map, 0, hi, state_row, &sm.full[s], nb);
      tma::load_swizzled_tile<kP, kN, kE>(st.DH, &a.dh_map, 0, hi, state_row, &sm.full[s], nb);
      tma::load_bytes(sm.g[s], a.scan.g + token_index(a, b, hi, t0), Shape::kScalarBytes, &sm.full[s]);
      tma::load_bytes(sm.dt[s], a.scan.dt + token_index(a, b, hi, t0), Shape::kScalarBytes, &sm.full[s]);
    }
    return;
  }

  // The consumers: warpgroup 0 sums dC, warpgroup 1 dB; warp w owns rows 16 (w % 4) .. of the sum.
  const bool dc = tile::warp_uniform(threadIdx.x < 128) != 0;  // (it picks descriptors)
  const int m0 = 16 * (tile::warp_id() % 4);
  const int wg_thread = threadIdx.x % 128, wg_barrier = dc ? 1 : 2;  // (fp32: the transposes)
  const int32_t seq_prev = a.scan.resets && c > 0 ? seq_of(a, b, t0 - 1) : 0;
  const int32_t seq_last = sm.seq[kChunk - 1];
  T* other = dc ? sm.B : sm.C;  // the group's tile M (dC) or M^T (dB) multiplies
  tile::FragC acc[kNTiles];
#pragma unroll
  for (auto& f : acc) f.v[0] = f.v[1] = f.v[2] = f.v[3] = 0.0f;
  tma::wait(&sm.cb, 0);
  if constexpr (Shape::kTf32) wg::transpose_tf32_in_place<NTile, NtTile>(other, wg_thread, wg_barrier);  // once
  for (int64_t k = 0; k < heads; ++k) {
    const int s = static_cast<int>(k % kStages);
    tma::wait(&sm.full[s], static_cast<uint32_t>((k / kStages) & 1));
    typename Shape::Stage& st = sm.stage[s];
    const float* g = sm.g[s];
    const float* dt = sm.dt[s];
    const float g_last = g[kChunk - 1];
    // The row factors: dC's exp2(g_i) (rows of the sequence that entered the chunk), dB's dt_j
    // exp2(g_last - g_j) (rows of the chunk's last sequence).
    auto row_w = [&](int r) {
      return dc ? (sm.seq[r] == seq_prev ? fast_exp2(g[r]) : 0.0f)
                : (sm.seq[r] == seq_last ? dt[r] * fast_exp2(g_last - g[r]) : 0.0f);
    };
    tile::FragA rows[kTokSteps], mm[kTokSteps];  // the scaled dy or x rows; M or M^T
    if constexpr (Shape::kTf32) {  // the B operands transposed: the state's here, the group tile's above
      T* state = dc ? st.H : st.DH;
      wg::transpose_tf32_in_place<NTile, NtTile>(state, wg_thread, wg_barrier);
      const int r = m0 + (tile::lane_id() >> 2);
      const float w_lo = row_w(r), w_hi = row_w(r + 8);
#pragma unroll
      for (int ks = 0; ks < kTokSteps; ++ks) {
        rows[ks] = dc ? tf32_rows_a<TokTile, false>(st.dout, gated ? st.Z : nullptr, m0, ks, w_lo, w_hi)
                      : tf32_rows_a<TokTile, false>(st.X, nullptr, m0, ks, w_lo, w_hi);
        mm[ks] = dc ? tf32_rows_a<TokTile, false>(st.M, nullptr, m0, ks, 1.0f, 1.0f)
                    : tf32_rows_a<TokTile, true>(st.M, nullptr, m0, ks, 1.0f, 1.0f);
      }
      wg::proxy_fence();  // the transposes, written by the threads, are read by wgmma after the barrier
      wg::warpgroup_sync(wg_barrier);
      wg::pin(acc), wg::pin(rows), wg::pin(mm);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kTokSteps; ++ks) wg::MmaTf32<kN>::rs(acc, rows[ks], wg::k_major<NtTile>(state, 0, ks));
#pragma unroll
      for (int ks = 0; ks < kTokSteps; ++ks) wg::MmaTf32<kN>::rs(acc, mm[ks], wg::k_major<NtTile>(other, 0, ks));
    } else {  // h and dh, B and C as the B operands (MN-major)
      if (dc) scaled_row_frags<T, TokTile>(rows, st.dout, gated ? st.Z : nullptr, m0, row_w);
      else scaled_row_frags<T, TokTile>(rows, st.X, static_cast<const T*>(nullptr), m0, row_w);
#pragma unroll
      for (int ks = 0; ks < kTokSteps; ++ks) {
        if (dc) wg::load_accum_pair<TokTile>(st.M, m0, 16 * ks, mm[ks].r);  // M_i. (k = j)
        else mm[ks] = wg::load_a_trans<TokTile>(st.M, m0, 16 * ks);          // M_.j (k = i)
      }
      const T* state = dc ? st.H : st.DH;
      wg::pin(acc), wg::pin(rows), wg::pin(mm);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kTokSteps; ++ks) wg::Mma<T, kN>::template rs<1>(acc, rows[ks], wg::mn_major<NTile>(state, 0, ks));
#pragma unroll
      for (int ks = 0; ks < kTokSteps; ++ks) wg::Mma<T, kN>::template rs<1>(acc, mm[ks], wg::mn_major<NTile>(other, 0, ks));
    }
    wg::commit();
    wg::wait<0>();
    wg::pin(acc);
    tma::arrive(&sm.empty[s]);  // this thread is done with the stage
  }

  const BwdTensors& gr = a.grad;
  const int rows_in = static_cast<int>(geo.seqlen - t0 < kChunk ? geo.seqlen - t0 : kChunk);
  const int cols = static_cast<int>(geo.dstate - nb < kN ? geo.dstate - nb : kN);
  T* out = dc ? static_cast<T*>(gr.dC) + b * gr.dC_stride.s0 + t0 * gr.dC_stride.s1 + grp * gr.dC_stride.s2 + nb
              : static_cast<T*>(gr.dB) + b * gr.dB_stride.s0 + t0 * gr.dB_stride.s1 + grp * gr.dB_stride.s2 + nb;
  const int64_t row_stride = dc ? gr.dC_stride.s1 : gr.dB_stride.s1;
  const bool pairs = dc ? gr.dC_pairs : gr.dB_pairs;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = m0 + tile::frag_row(2 * half);
    if (i >= rows_in) continue;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int n = nt * 8 + tile::frag_col(0);
      if (n >= cols) continue;
      const float v[2] = {acc[nt].v[2 * half], acc[nt].v[2 * half + 1]};
      tile::store_pair(out + i * row_stride + n, pairs, v);
    }
  }
#else
  __trap();  // built without sm_90a code: the host never selects this kernel
#endif
}

}  // namespace mamba2ssd::cuda
