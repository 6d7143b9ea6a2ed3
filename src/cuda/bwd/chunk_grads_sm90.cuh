// Backward kernel 3 on Hopper (sm_90a): chunk_grads_sm80's per-token gradients (the math is in
// its header) with every product on wgmma and every tile brought by TMA. One block per (chunk,
// head, batch row): two warpgroups, each computing half of the columns of every product (warp w
// owning token rows 16 (w % 4) .. of them), so that two blocks of eight warps share a
// multiprocessor and each warp's steps between the products are half as long: the kernel is bound
// by those steps' latency, not by its bytes or its products (ncu: 2 warps a scheduler, 1 issue in
// 7.6 cycles with one warpgroup a block). Thread 0 issues all of the chunk's loads at once (C and B
// of the head's group and the state h entering the chunk; x, dout, z; the adjoint dh leaving the
// chunk), on three barriers, so that each product starts as soon as its tiles have landed. The
// products, as wgmma groups over the warpgroup's columns:
//   1. S = C B^T, Y = C h^T; then M = dY X^T     (A and B from shared memory, K-major)
//   2. Y += (W dt) X                              (A = W with dt_j in its columns, K-major, in the
//                                                  gate's dY tile without z, else over C, dead
//                                                  after 1; X read MN-major)
//   3. dxp = B dh^T                               (as 1)
//   4. dxp += W^T dY                              (A = W^T by ldmatrix from shared memory, dY MN-major)
// where W = S decayed and masked goes to shared memory as a swizzled tile, each warpgroup writing
// its columns, between 1 and 2. The steps after the products are chunk_grads_sm80's
// (chunk_grads_steps.cuh). Head dim 64 (32 in its 64 columns, TMA's zeros past it) and states of
// at most 256. The tiles of one block take 81-113 KB, two blocks a multiprocessor: a state above
// 128 columns comes in two halves of 128 through the same C, B, h and dh tiles (every product over
// the state sums over its columns, so each half adds its part): 1 over the first half, then the
// second; 3 over the second half (h and dh's second halves are still there for <dh, h>), then the
// first, reloaded. (All 256 columns at once, 177 KB of tiles, left one block a multiprocessor:
// 693 us at the N 256 shape of docs/perf-log.md, "Backward b9".)
#pragma once

#include <type_traits>

#include "cuda/bwd/args_sm90.cuh"
#include "cuda/bwd/chunk_grads_steps.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/bwd/grad_steps.cuh"
#include "cuda/tile/tma.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct ChunkGradsSm90Shape {
  static constexpr int kChunk = kBwdChunk, kHeadDim = 64, kSlabs = 4, kParts = 2;
  static constexpr int kThreads = 128 * kParts;
  static constexpr int kCols = kChunk / kParts;  // a warpgroup's columns of every product
  static constexpr int kNTile = kN > 128 ? 128 : kN;  // state columns the tiles hold at once
  static constexpr int kHalves = kN / kNTile;          // 256 comes in two halves
  static constexpr int kMinBlocks = 2;                 // by shared memory
  using TokTile = tile::wg::SwizzledTile<kChunk, kHeadDim>;  // x, dout, z, dY [token][p]; W [token][token]
  using NTile = tile::wg::SwizzledTile<kChunk, kNTile>;      // C, B [token][n]; h, dh [p][n]
  static_assert(kHeadDim == kChunk, "W shares the token tiles' layout");
  static_assert(NTile::kElems >= TokTile::kElems, "W dt takes C's place (with z)");
  using Scratch = GradScratch<kChunk, kHeadDim, kSlabs, kParts>;
  struct SharedStorage {  // placed at a 1024-byte aligned address; every tile whole swizzle atoms
    T X[TokTile::kElems], dout[TokTile::kElems], Z[TokTile::kElems], dY[TokTile::kElems], W[TokTile::kElems];
    T C[NTile::kElems], B[NTile::kElems], H[NTile::kElems], DH[NTile::kElems];
    Scratch sc;
    // Tiles landed: [0] C, B, h; [1] x, dout, z; [2] dh (its second half with two); with two
    // halves, [3] the second halves of C, B, h, [4] the first halves of B, h, dh again.
    uint64_t full[kHalves > 1 ? 5 : 3];
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage) + 1024;  // and the alignment's slack
  static constexpr uint32_t kTokBytes = TokTile::kElems * sizeof(T), kNBytes = NTile::kElems * sizeof(T);
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 228 * 1024, "blocks exceed the multiprocessor's shared memory");
};

// The thread's elements of a 64 x 64 token tile (its warp's rows, its warpgroup's columns) as 16-bit
// pairs in registers, by one ldmatrix per two column tiles: what the steps read of x, dy, dout and z,
// instead of a shared load and a swizzled address an element.
template <typename T, typename Tile, int kTiles>
struct TilePairs {
  uint32_t r[kTiles][2];  // [pt][half]
  __device__ __forceinline__ void load(const T* tile_, int m0, int col0) {
#pragma unroll
    for (int j = 0; j < kTiles; j += 2) {
      uint32_t q[4];  // q[2 t + half]: column tile j + t
      tile::wg::load_accum_pair<Tile>(tile_, m0, col0 + 8 * j, q);
      r[j][0] = q[0], r[j][1] = q[1], r[j + 1][0] = q[2], r[j + 1][1] = q[3];
    }
  }
  __device__ __forceinline__ float operator()(const Slot& e) const {
    const float2 v = tile::unpack2<T>(r[e.pt][e.half]);
    return e.k ? v.y : v.x;
  }
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
  using Scratch = typename Shape::Scratch;
  using Mma = wg::Mma<T, Shape::kCols>;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kThreads = Shape::kThreads;
  constexpr int kTiles = Shape::kCols / 8, kTokSteps = kChunk / 16, kNSteps = Shape::kNTile / 16;
  constexpr int kNTile = Shape::kNTile, kLastHalf = (Shape::kHalves - 1) * kNTile;  // (its first column)
  static_assert(kP == kChunk, "S, M, Y and dxp are all 64 x 64, split alike between the warpgroups");
  const Geometry& geo = a.geo;
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, grp = geo.group_of(h);
  const int64_t t0 = c * kChunk;
  const int rows = static_cast<int>(geo.seqlen - t0 < kChunk ? geo.seqlen - t0 : kChunk);
  const int m0 = 16 * Scratch::slab(), col0 = tile::warp_uniform(part_col0<kTiles, Scratch>());  // (descriptors)
  const bool gated = a.io.z != nullptr;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& sm = *tma::align_1024<typename Shape::SharedStorage>(smem_bytes);
  auto& sc = sm.sc;

  wait_previous_kernel();  // the walks' states
  start_next_kernel();
  // Thread 0's loads of C, B, h and dh (each named tile, its columns col_first on) on barrier bar.
  auto load_state_tiles = [&](int col_first, uint64_t* bar, bool with_c, bool with_b, bool with_h, bool with_dh) {
    const int tok = static_cast<int>(t0), hi = static_cast<int>(h), bi = static_cast<int>(b), gi = static_cast<int>(grp);
    const int state_row = static_cast<int>(b * a.scan.nchunks + c);  // (b, c) of the [b x nchunks] views
    tma::arrive_expect_bytes(bar, (with_c + with_b + with_h + with_dh) * Shape::kNBytes);
    if (with_c) tma::load_swizzled_tile<kChunk, kNTile>(sm.C, &a.C_map, tok, gi, bi, bar, col_first);
    if (with_b) tma::load_swizzled_tile<kChunk, kNTile>(sm.B, &a.B_map, tok, gi, bi, bar, col_first);
    if (with_h) tma::load_swizzled_tile<kP, kNTile>(sm.H, &a.h_map, 0, hi, state_row, bar, col_first);
    if (with_dh) tma::load_swizzled_tile<kP, kNTile>(sm.DH, &a.dh_map, 0, hi, state_row, bar, col_first);
  };
  if (threadIdx.x == 0) {
    for (uint64_t& bar : sm.full) tma::barrier_init(&bar, 1);
    tma::barrier_init_fence();
    load_state_tiles(0, &sm.full[0], /*C*/ true, /*B*/ true, /*h*/ true, /*dh*/ false);
    const int tok = static_cast<int>(t0), hi = static_cast<int>(h), bi = static_cast<int>(b);
    tma::arrive_expect_bytes(&sm.full[1], (gated ? 3 : 2) * Shape::kTokBytes);
    tma::load_swizzled_tile<kChunk, kP>(sm.X, &a.x_map, tok, hi, bi, &sm.full[1]);
    tma::load_swizzled_tile<kChunk, kP>(sm.dout, &a.dout_map, tok, hi, bi, &sm.full[1]);
    if (gated) tma::load_swizzled_tile<kChunk, kP>(sm.Z, &a.z_map, tok, hi, bi, &sm.full[1]);
    load_state_tiles(kLastHalf, &sm.full[2], /*C*/ false, /*B*/ false, /*h*/ false, /*dh*/ true);
  }
  // With two halves, thread 0 brings other halves of the tiles once both warpgroups are done with
  // the tiles there (the caller has waited for its own products).
  [[maybe_unused]] auto reload = [&](int col_first, uint64_t* bar, bool with_c, bool with_b, bool with_h, bool with_dh) {
    __syncthreads();
    if (threadIdx.x == 0) load_state_tiles(col_first, bar, with_c, with_b, with_h, with_dh);
  };
  // The chunk's scalars, the late inputs and the previous token's sequence id: issued now, awaited
  // only where the steps first read them (after the first products are issued), so that the
  // block's start waits for the barriers' initialization alone, not for a memory latency.
  stage_chunk_scalars<kChunk, kThreads>(a, b, h, c, sc.g, sc.dt, sc.seq);
  tile::cp_async_commit();
  LateInputs<kP, kThreads, Scratch> late;
  late.load(a, b, h, t0, rows);
  const int32_t seq_prev = a.scan.resets && c > 0 ? seq_of(a, b, t0 - 1) : 0;
  __syncthreads();  // the barriers' initialization

  using Pairs = TilePairs<T, TokTile, kTiles>;

  // 1. S = C B^T and Y = C h^T (the first k-step of each starts it afresh), then M = dY X^T; the
  // warpgroup's columns of each (B's, h's and x's rows from col0).
  tile::FragC acc_y[kTiles];
  tile::FragC acc_s[kTiles];
  float decay_f[kTiles][4];
  const T* dY = sm.dout;  // without z the dout tile is dY
  {
    tile::FragC acc_m[kTiles];
    // S += C B^T and Y += C h^T over the columns in the tiles (kAdd false: the first k-step starts
    // both afresh).
    auto s_and_y = [&](auto add) {
      constexpr bool kAdd = decltype(add)::value;
      Mma::template ss<0, 0, kAdd>(acc_s, wg::k_major<NTile>(sm.C, 0, 0), wg::k_major<NTile>(sm.B, col0, 0));
      Mma::template ss<0, 0, kAdd>(acc_y, wg::k_major<NTile>(sm.C, 0, 0), wg::k_major<NTile>(sm.H, col0, 0));
#pragma unroll
      for (int ks = 1; ks < kNSteps; ++ks) {
        const uint64_t c_desc = wg::k_major<NTile>(sm.C, 0, ks);
        Mma::template ss<0, 0>(acc_s, c_desc, wg::k_major<NTile>(sm.B, col0, ks));
        Mma::template ss<0, 0>(acc_y, c_desc, wg::k_major<NTile>(sm.H, col0, ks));
      }
      wg::commit();
    };
    tma::wait(&sm.full[0], 0);
    wg::fence();
    s_and_y(std::false_type{});
    // dY = dout silu(z) while those run: the same swizzled layout as its sources, so element by element.
    tma::wait(&sm.full[1], 0);
    if (gated) {  // (the tiles as one row of 64 x 64 elements: the same position in each)
      gate_grad_tile<T, 1, TokTile::kElems, kThreads>(sm.dY, TokTile::kElems, sm.dout, sm.Z, nullptr);
      dY = sm.dY;
      wg::proxy_fence();  // dY is read by wgmma (the async proxy)
      __syncthreads();
    }
    wg::fence();
    Mma::template ss<0, 0, false>(acc_m, wg::k_major<TokTile>(dY, 0, 0), wg::k_major<TokTile>(sm.X, col0, 0));
#pragma unroll
    for (int ks = 1; ks < kP / 16; ++ks)
      Mma::template ss<0, 0>(acc_m, wg::k_major<TokTile>(dY, 0, ks), wg::k_major<TokTile>(sm.X, col0, ks));
    wg::commit();
    // The scalars (every thread's copies in place), then the causal decay of the warp's tiles of S
    // and M (both take it) while the products run.
    tile::cp_async_wait<0>();
    late.store(sc);  // read after later barriers
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) causal_factors(decay_f[nt], col0 / 8 + nt, sc.g, sc.seq, m0);
    if constexpr (Shape::kHalves > 1) {  // S and Y over the second half of the state's columns
      wg::wait<0>();
      wg::pin(acc_s), wg::pin(acc_y), wg::pin(acc_m);
      reload(kNTile, &sm.full[3], /*C*/ true, /*B*/ true, /*h*/ true, /*dh*/ false);
      tma::wait(&sm.full[3], 0);
      wg::fence();
      s_and_y(std::true_type{});
    }
    wg::wait<0>();
    wg::pin(acc_s), wg::pin(acc_y), wg::pin(acc_m);

    scale_rows(acc_y, m0, [&](int i) { return sc.seq[i] == seq_prev ? fast_exp2(sc.g[i]) : 0.0f; });
    T* m_out = static_cast<T*>(a.work.intra) + chunk_head(a, b, c, h) * kChunk * kChunk;
    float row[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) decay_grad_tile(acc_s[nt], acc_m[nt], decay_f[nt], col0 / 8 + nt, m0, sc, m_out, row);
    Pairs dy;
    dy.load(dY, m0, col0);
    decay_grad_rows(row, acc_y, m0, sc, dy);
  }
  // W dt goes over C, once no product of either warpgroup reads C, or without z into the gate's
  // free dY tile, with no wait for the other warpgroup.
  T* const w_dt = gated ? sm.C : sm.dY;
  if (gated) __syncthreads();
  const int32_t seq_last = sc.seq[kChunk - 1];
  const float g_last = sc.g[kChunk - 1];
  const float decay = seq_last == seq_prev ? exp2f(g_last) : 0.0f;  // of the state across the chunk

  // W (S masked and decayed) and W dt to shared memory, two accumulator tiles per stmatrix, for 2
  // and 4.
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) apply_factors(acc_s[nt], decay_f[nt], col0 / 8 + nt, [](int) { return 1.0f; });
  auto store_w = [&](T* tile) {
#pragma unroll
    for (int j = 0; j < kTiles; j += 2) {
      const tile::FragC &lo = acc_s[j], &hi = acc_s[j + 1];
      const uint32_t r[4] = {tile::pack2<T>(lo.v[0], lo.v[1]), tile::pack2<T>(lo.v[2], lo.v[3]),
                             tile::pack2<T>(hi.v[0], hi.v[1]), tile::pack2<T>(hi.v[2], hi.v[3])};
      wg::store_accum_pair<TokTile>(tile, m0, col0 + 8 * j, r);
    }
  };
  store_w(sm.W);
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_s[nt].v[e] *= sc.dt[col0 + nt * 8 + tile::frag_col(e)];
  store_w(w_dt);
  wg::proxy_fence();  // W and W dt are read by wgmma
  __syncthreads();    // every warpgroup's columns of them are in place

  // 2. Y += (W dt) X; 3. dxp = B dh^T (with two halves: the second, whose B, h and dh are in place).
  tile::FragC acc_dx[kTiles];
  wg::pin(acc_y);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < kTokSteps; ++ks)
    Mma::template ss<0, 1>(acc_y, wg::k_major<TokTile>(w_dt, 0, ks), wg::mn_major<TokTile>(sm.X, col0, ks));
  wg::commit();
  tma::wait(&sm.full[2], 0);
  wg::fence();
  Mma::template ss<0, 0, false>(acc_dx, wg::k_major<NTile>(sm.B, 0, 0), wg::k_major<NTile>(sm.DH, col0, 0));
#pragma unroll
  for (int ks = 1; ks < kNSteps; ++ks)
    Mma::template ss<0, 0>(acc_dx, wg::k_major<NTile>(sm.B, 0, ks), wg::k_major<NTile>(sm.DH, col0, ks));
  wg::commit();
  // <dh, h> while the products run: both tiles in one layout, so element by element.
  float hdot = 0.0f;
  auto add_hdot = [&] {
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
  };
  add_hdot();
  if constexpr (Shape::kHalves > 1) {  // 3 and <dh, h> over the first half, its B, h and dh brought again
    wg::wait<0>();
    wg::pin(acc_y), wg::pin(acc_dx);
    reload(0, &sm.full[4], /*C*/ false, /*B*/ true, /*h*/ true, /*dh*/ true);
    tma::wait(&sm.full[4], 0);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kNSteps; ++ks)
      Mma::template ss<0, 0>(acc_dx, wg::k_major<NTile>(sm.B, 0, ks), wg::k_major<NTile>(sm.DH, col0, ks));
    wg::commit();
    add_hdot();
  }
  hdot = warp_sum(hdot);
  if (tile::lane_id() == 0) sc.hdot[tile::warp_id()] = hdot;
  wg::wait<0>();
  wg::pin(acc_y), wg::pin(acc_dx);

  scale_rows(acc_dx, m0, [&](int j) { return sc.seq[j] == seq_last ? fast_exp2(g_last - sc.g[j]) : 0.0f; });
  Pairs x;
  x.load(sm.X, m0, col0);
  inter_dots(acc_dx, m0, sc, x);

  // 4. dxp += W^T dY.
  {
    tile::FragA wt[kTokSteps];
#pragma unroll
    for (int ks = 0; ks < kTokSteps; ++ks) wt[ks] = wg::load_a_trans<TokTile>(sm.W, m0, 16 * ks);
    wg::pin(acc_dx), wg::pin(wt);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kTokSteps; ++ks) Mma::template rs<1>(acc_dx, wt[ks], wg::mn_major<TokTile>(dY, col0, ks));
    wg::commit();
    wg::wait<0>();
    wg::pin(acc_dx);
  }

  Pairs dout, z;
  dout.load(sm.dout, m0, col0);
  if (gated) z.load(sm.Z, m0, col0);
  row_grads<T, kP>(a, b, h, t0, rows, m0, acc_y, acc_dx, sc, x, dout, z);
  __syncthreads();
  chunk_sums<kP, kThreads>(a, b, h, c, rows, seq_prev, decay, sc);
#else
  __trap();  // built without sm_90a code: the host never selects this kernel
#endif
}

}  // namespace mamba2ssd::cuda
