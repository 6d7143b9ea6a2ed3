// Backward kernel 3 on Hopper (sm_90a): chunk_grads_sm80's per-token gradients (the math is in
// its header) with every product on wgmma and every tile brought by TMA. One block per (chunk,
// head, batch row): one warpgroup, warp w owning token rows 16 w .. 16 w + 15 of each product.
// Thread 0 issues all of the chunk's loads at once (C and B of the head's group and the state h
// entering the chunk; x, dout, z; the adjoint dh leaving the chunk), on three barriers, so that each
// product starts as soon as its tiles have landed. The products, as wgmma groups:
//   1. S = C B^T, Y = C h^T; then M = dY X^T     (A and B from shared memory, K-major)
//   2. Y += W (dt X)                              (A = W with dt_j from registers, X read MN-major)
//   3. dxp = B dh^T                               (as 1)
//   4. dxp += W^T dY                              (A = W^T by ldmatrix from shared memory, dY MN-major)
// where W = S decayed and masked goes to shared memory as a swizzled tile between 1 and 4. The
// steps after the products are chunk_grads_sm80's (chunk_grads_steps.cuh). Head dim 64 and states
// of at most 128 (the tiles of one block: 96-104 KiB, two blocks a multiprocessor).
#pragma once

#include "cuda/bwd/args_sm90.cuh"
#include "cuda/bwd/chunk_grads_steps.cuh"
#include "cuda/bwd/grad_steps.cuh"
#include "cuda/tile/tma.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct ChunkGradsSm90Shape {
  static constexpr int kChunk = kBwdChunk, kHeadDim = 64, kWarps = 4, kThreads = 128;
  static constexpr int kMinBlocks = 2;  // by shared memory (three need 234 KiB at N 64)
  using TokTile = tile::wg::SwizzledTile<kChunk, kHeadDim>;  // x, dout, z, dY [token][p]; W [token][token]
  using NTile = tile::wg::SwizzledTile<kChunk, kN>;          // C, B [token][n]; h, dh [p][n]
  static_assert(kHeadDim == kChunk, "W shares the token tiles' layout");
  struct SharedStorage {  // placed at a 1024-byte aligned address; every tile whole swizzle atoms
    T X[TokTile::kElems], dout[TokTile::kElems], Z[TokTile::kElems], dY[TokTile::kElems], W[TokTile::kElems];
    T C[NTile::kElems], B[NTile::kElems], H[NTile::kElems], DH[NTile::kElems];
    GradScratch<kChunk, kHeadDim, kWarps> sc;
    uint64_t full[3];  // tiles landed: [0] C, B, h; [1] x, dout, z; [2] dh
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage) + 1024;  // and the alignment's slack
  static constexpr uint32_t kTokBytes = TokTile::kElems * sizeof(T), kNBytes = NTile::kElems * sizeof(T);
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 228 * 1024, "blocks exceed the multiprocessor's shared memory");
};

template <typename T, int kN>
__global__ void __launch_bounds__(ChunkGradsSm90Shape<T, kN>::kThreads, ChunkGradsSm90Shape<T, kN>::kMinBlocks)
    chunk_grads_sm90_kernel(const __grid_constant__ GradsSm90Args a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  namespace tma = tile::tma;
  using Shape = ChunkGradsSm90Shape<T, kN>;
  using TokTile = typename Shape::TokTile;
  using NTile = typename Shape::NTile;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kThreads = Shape::kThreads;
  constexpr int kTiles = kChunk / 8, kTokSteps = kChunk / 16, kNSteps = kN / 16;
  static_assert(kP / 8 == kTiles, "S, M, Y and dxp are all 64 x 64");
  const Geometry& geo = a.geo;
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, grp = geo.group_of(h);
  const int64_t t0 = c * kChunk;
  const int rows = static_cast<int>(geo.seqlen - t0 < kChunk ? geo.seqlen - t0 : kChunk);
  const int m0 = 16 * tile::warp_id();
  const bool gated = a.io.z != nullptr;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& sm = *tma::align_1024<typename Shape::SharedStorage>(smem_bytes);
  auto& sc = sm.sc;

  if (threadIdx.x == 0) {
    for (uint64_t& bar : sm.full) tma::barrier_init(&bar, 1);
    tma::barrier_init_fence();
    const int tok = static_cast<int>(t0), hi = static_cast<int>(h), bi = static_cast<int>(b), gi = static_cast<int>(grp);
    const int state_row = static_cast<int>(b * a.scan.nchunks + c);  // (b, c) of the [b x nchunks] views
    tma::arrive_expect_bytes(&sm.full[0], 3 * Shape::kNBytes);
    tma::load_swizzled_tile<kChunk, kN>(sm.C, &a.C_map, tok, gi, bi, &sm.full[0]);
    tma::load_swizzled_tile<kChunk, kN>(sm.B, &a.B_map, tok, gi, bi, &sm.full[0]);
    tma::load_swizzled_tile<kP, kN>(sm.H, &a.h_map, 0, hi, state_row, &sm.full[0]);
    tma::arrive_expect_bytes(&sm.full[1], (gated ? 3 : 2) * Shape::kTokBytes);
    tma::load_swizzled_tile<kChunk, kP>(sm.X, &a.x_map, tok, hi, bi, &sm.full[1]);
    tma::load_swizzled_tile<kChunk, kP>(sm.dout, &a.dout_map, tok, hi, bi, &sm.full[1]);
    if (gated) tma::load_swizzled_tile<kChunk, kP>(sm.Z, &a.z_map, tok, hi, bi, &sm.full[1]);
    tma::arrive_expect_bytes(&sm.full[2], Shape::kNBytes);
    tma::load_swizzled_tile<kP, kN>(sm.DH, &a.dh_map, 0, hi, state_row, &sm.full[2]);
  }
  stage_chunk_scalars<kChunk, kThreads>(a, b, h, c, sc.g, sc.dt, sc.seq);
  load_late_inputs<kP>(a, b, h, t0, rows, sc);
  tile::cp_async_commit();
  tile::cp_async_wait<0>();
  __syncthreads();  // the scalars, and the barriers' initialization
  const int32_t seq_prev = a.scan.resets && c > 0 ? seq_of(a, b, t0 - 1) : 0;
  const int32_t seq_last = sc.seq[kChunk - 1];
  const float g_last = sc.g[kChunk - 1];
  const float decay = seq_last == seq_prev ? exp2f(g_last) : 0.0f;  // of the state across the chunk

  auto at = [](const T* t, int i, int p) { return tile::to_float(t[TokTile::offset(i, p)]); };
  auto x_at = [&](int i, int p) { return at(sm.X, i, p); };

  // 1. S = C B^T and Y = C h^T (the first k-step of each starts it afresh), then M = dY X^T.
  tile::FragC acc_y[kTiles];
  tile::FragC acc_s[kTiles];
  const T* dY = sm.dout;  // without z the dout tile is dY
  {
    tile::FragC acc_m[kTiles];
    tma::wait(&sm.full[0], 0);
    wg::fence();
    wg::Mma<T, kChunk>::template ss<0, 0, false>(acc_s, wg::k_major<NTile>(sm.C, 0, 0), wg::k_major<NTile>(sm.B, 0, 0));
    wg::Mma<T, kP>::template ss<0, 0, false>(acc_y, wg::k_major<NTile>(sm.C, 0, 0), wg::k_major<NTile>(sm.H, 0, 0));
#pragma unroll
    for (int ks = 1; ks < kNSteps; ++ks) {
      const uint64_t c_desc = wg::k_major<NTile>(sm.C, 0, ks);
      wg::Mma<T, kChunk>::template ss<0, 0>(acc_s, c_desc, wg::k_major<NTile>(sm.B, 0, ks));
      wg::Mma<T, kP>::template ss<0, 0>(acc_y, c_desc, wg::k_major<NTile>(sm.H, 0, ks));
    }
    wg::commit();
    // dY = dout silu(z) while those run: the same swizzled layout as its sources, so element by element.
    tma::wait(&sm.full[1], 0);
    if (gated) {  // (the tiles as one row of 64 x 64 elements: the same position in each)
      gate_grad_tile<T, 1, TokTile::kElems, kThreads>(sm.dY, TokTile::kElems, sm.dout, sm.Z, nullptr);
      dY = sm.dY;
      wg::proxy_fence();  // dY is read by wgmma (the async proxy)
      __syncthreads();
    }
    wg::fence();
    wg::Mma<T, kChunk>::template ss<0, 0, false>(acc_m, wg::k_major<TokTile>(dY, 0, 0), wg::k_major<TokTile>(sm.X, 0, 0));
#pragma unroll
    for (int ks = 1; ks < kP / 16; ++ks)
      wg::Mma<T, kChunk>::template ss<0, 0>(acc_m, wg::k_major<TokTile>(dY, 0, ks), wg::k_major<TokTile>(sm.X, 0, ks));
    wg::commit();
    wg::wait<0>();
    wg::pin(acc_s), wg::pin(acc_y), wg::pin(acc_m);

    scale_rows(acc_y, m0, [&](int i) { return sc.seq[i] == seq_prev ? fast_exp2(sc.g[i]) : 0.0f; });
    T* m_out = static_cast<T*>(a.work.intra) + chunk_head(a, b, c, h) * kChunk * kChunk;
    float row[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) decay_grad_tile(acc_s[nt], acc_m[nt], nt, m0, sc, m_out, row);
    decay_grad_rows(row, acc_y, m0, sc, [&](int i, int p) { return at(dY, i, p); });
  }

  // W (S masked and decayed) to shared memory for 4, two accumulator tiles per stmatrix.
  causal_decay(acc_s, sc.g, sc.seq, m0, [](int) { return 1.0f; });
#pragma unroll
  for (int j = 0; j < kTiles; j += 2) {
    const tile::FragC &lo = acc_s[j], &hi = acc_s[j + 1];
    const uint32_t r[4] = {tile::pack2<T>(lo.v[0], lo.v[1]), tile::pack2<T>(lo.v[2], lo.v[3]),
                           tile::pack2<T>(hi.v[0], hi.v[1]), tile::pack2<T>(hi.v[2], hi.v[3])};
    wg::store_accum_pair<TokTile>(sm.W, m0, 8 * j, r);
  }

  // 2. Y += W (dt X), dt_j folded into W's columns in registers; 3. dxp = B dh^T.
  tile::FragC acc_dx[kTiles];
  {
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt].v[e] *= sc.dt[nt * 8 + tile::frag_col(e)];
    tile::FragA wa[kTokSteps];
#pragma unroll
    for (int ks = 0; ks < kTokSteps; ++ks) wa[ks] = tile::a_from_accum<T>(acc_s, ks);
    wg::pin(acc_y), wg::pin(wa);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kTokSteps; ++ks)
      wg::Mma<T, kP>::template rs<1>(acc_y, wa[ks], wg::mn_major<TokTile>(sm.X, 0, ks));
    wg::commit();
  }
  tma::wait(&sm.full[2], 0);
  wg::fence();
  wg::Mma<T, kP>::template ss<0, 0, false>(acc_dx, wg::k_major<NTile>(sm.B, 0, 0), wg::k_major<NTile>(sm.DH, 0, 0));
#pragma unroll
  for (int ks = 1; ks < kNSteps; ++ks)
    wg::Mma<T, kP>::template ss<0, 0>(acc_dx, wg::k_major<NTile>(sm.B, 0, ks), wg::k_major<NTile>(sm.DH, 0, ks));
  wg::commit();
  // <dh, h> while the products run: both tiles in one layout, so element by element.
  float hdot = 0.0f;
  for (int k = threadIdx.x; k < NTile::kElems / 8; k += kThreads) {
    const uint4 d = reinterpret_cast<const uint4*>(sm.DH)[k], v = reinterpret_cast<const uint4*>(sm.H)[k];
    const uint32_t* dv = reinterpret_cast<const uint32_t*>(&d);
    const uint32_t* hv = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 x = tile::unpack2<T>(dv[j]), y = tile::unpack2<T>(hv[j]);
      hdot += x.x * y.x + x.y * y.y;
    }
  }
  hdot = warp_sum(hdot);
  if (tile::lane_id() == 0) sc.hdot[tile::warp_id()] = hdot;
  wg::wait<0>();
  wg::pin(acc_y), wg::pin(acc_dx);
  __syncthreads();  // every warp's rows of W are in shared memory

  scale_rows(acc_dx, m0, [&](int j) { return sc.seq[j] == seq_last ? fast_exp2(g_last - sc.g[j]) : 0.0f; });
  inter_dots(acc_dx, m0, sc, x_at);

  // 4. dxp += W^T dY.
  {
    tile::FragA wt[kTokSteps];
#pragma unroll
    for (int ks = 0; ks < kTokSteps; ++ks) wt[ks] = wg::load_a_trans<TokTile>(sm.W, m0, 16 * ks);
    wg::pin(acc_dx), wg::pin(wt);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kTokSteps; ++ks) wg::Mma<T, kP>::template rs<1>(acc_dx, wt[ks], wg::mn_major<TokTile>(dY, 0, ks));
    wg::commit();
    wg::wait<0>();
    wg::pin(acc_dx);
  }

  row_grads<T, kP>(a, b, h, t0, rows, m0, acc_y, acc_dx, sc, x_at, [&](int i, int p) { return at(sm.dout, i, p); },
                   [&](int i, int p) { return at(sm.Z, i, p); });
  __syncthreads();
  chunk_sums<kP, kThreads>(a, b, h, c, rows, seq_prev, decay, sc);
#else
  __trap();  // built without sm_90a code: the host never selects this kernel
#endif
}

}  // namespace mamba2ssd::cuda
