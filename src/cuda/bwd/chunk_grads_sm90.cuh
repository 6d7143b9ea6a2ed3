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
// fp32 inputs run the same kernel on TF32 wgmma (the portable kernel's products are TF32 too),
// which reads 32-bit operands K-major only: 2 and 4 read X^T and dY^T, which the threads make while
// M runs, and 4's W^T is gathered from W (GradsProducts); the tiles TMA brings are rounded to TF32
// in place before the products read them (round_tf32). Its tiles take twice the bytes: states of
// at most 128, in two halves of 64 above 64, and one block a multiprocessor (182 KB), which runs 3
// beside 1 over each half, so that no half comes twice (kStateOnce).
#pragma once

#include <type_traits>

#include "cuda/bwd/args_sm90.cuh"
#include "cuda/bwd/chunk_grads_steps.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/bwd/grad_steps.cuh"
#include "cuda/tile/tma.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

// X^T and dY^T [p][token], which the TF32 products read (fp32 inputs); none with 16-bit inputs (an
// empty struct: their SharedStorage grows by 16 bytes, the scratch's alignment).
template <typename T, int kElems, bool kTf32 = sizeof(T) == 4>
struct TransposedTiles {
  T XT[kElems], dYT[kElems];
};
template <typename T, int kElems>
struct TransposedTiles<T, kElems, false> {};

template <typename T, int kN>
struct ChunkGradsSm90Shape {
  static constexpr bool kTf32 = sizeof(T) == 4;  // fp32 inputs: TF32 products
  static constexpr int kChunk = kBwdChunk, kHeadDim = 64, kSlabs = 4, kParts = 2;
  static constexpr int kThreads = 128 * kParts;
  static constexpr int kCols = kChunk / kParts;  // a warpgroup's columns of every product
  static constexpr int kK = kTf32 ? 8 : 16;      // the sum's length a wgmma takes
  // State columns the tiles hold at once: 16-bit 256 comes in two halves of 128, fp32 128 in two of
  // 64 (its tiles take twice the bytes, and X^T and dY^T 32 KB more).
  static constexpr int kNTile = kTf32 ? 64 : kN > 128 ? 128 : kN;
  static constexpr int kHalves = kN / kNTile;
  static constexpr int kMaxState = 2 * (kTf32 ? 64 : 128);  // at most two halves (the host's refusal)
  static_assert(kN <= kMaxState, "the state comes in at most two halves");
  static constexpr int kMinBlocks = kTf32 ? 1 : 2;  // by shared memory
  // fp32 in two halves: 3 runs beside 1, so that each half of C, B, h and dh comes once (the 16-bit
  // order brings B, h and dh's first halves twice, a third of the block's bytes at fp32 N 128). Its
  // block, alone on its multiprocessor, has the registers to hold dxp's accumulators from 1 on; two
  // 16-bit blocks (at most 128 registers a thread) have not.
  static constexpr bool kStateOnce = kTf32 && kHalves > 1;
  using TokTile = tile::wg::SwizzledTile<kChunk, kHeadDim, sizeof(T)>;  // x, dout, z, dY [token][p]; W [token][token]
  using NTile = tile::wg::SwizzledTile<kChunk, kNTile, sizeof(T)>;      // C, B [token][n]; h, dh [p][n]
  static_assert(kHeadDim == kChunk, "W, X^T and dY^T share the token tiles' layout");
  static_assert(NTile::kElems >= TokTile::kElems, "W dt takes C's place (with z)");
  using Scratch = GradScratch<kChunk, kHeadDim, kSlabs, kParts>;
  struct SharedStorage {  // placed at a 1024-byte aligned address; every tile whole swizzle atoms
    T X[TokTile::kElems], dout[TokTile::kElems], Z[TokTile::kElems], dY[TokTile::kElems], W[TokTile::kElems];
    T C[NTile::kElems], B[NTile::kElems], H[NTile::kElems], DH[NTile::kElems];
    TransposedTiles<T, TokTile::kElems> tr;
    Scratch sc;
    // Tiles landed: [0] C, B, h (and dh: kStateOnce); [1] x, dout, z; [2] dh (its second half with
    // two; unused with kStateOnce); with two halves, [3] the second halves of C, B, h (and dh), [4]
    // the first halves of B, h, dh again (not with kStateOnce).
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

// The same for fp32 tiles: a float pair a column tile and half, by 8-byte loads.
template <typename Tile, int kTiles>
struct TilePairs<float, Tile, kTiles> {
  float2 r[kTiles][2];  // [pt][half]
  __device__ __forceinline__ void load(const float* tile_, int m0, int col0) {
#pragma unroll
    for (int pt = 0; pt < kTiles; ++pt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        r[pt][half] = *reinterpret_cast<const float2*>(
            tile_ + Tile::offset(m0 + tile::frag_row(2 * half), col0 + 8 * pt + tile::frag_col(0)));
  }
  __device__ __forceinline__ float operator()(const Slot& e) const { return e.k ? r[e.pt][e.half].y : r[e.pt][e.half].x; }
};

// The kernel's wgmma forms. kk: D (+)= A B^T, both operands K-major in shared memory, as every
// product over the state or the head dim reads them. The products over tokens read X or dY as the
// B operand, whose tiles hold tokens strided: 16-bit inputs as they are (MN-major, tokens_b), fp32
// inputs (TF32 reads 32-bit operands K-major only) as X^T and dY^T, which the threads copy from
// the rounded tiles (transpose). W^T, the A operand of dxp += W^T dY, comes from registers: by ldmatrix.trans, or
// gathered for TF32 (w_trans).
template <typename T, typename Shape>
struct GradsProducts {
  using TokTile = typename Shape::TokTile;
  static constexpr int kCols = Shape::kCols;
  template <bool kAdd = true>
  static __device__ __forceinline__ void kk(tile::FragC* d, uint64_t a, uint64_t b) {
    if constexpr (Shape::kTf32) tile::wg::MmaTf32<kCols>::template ss<kAdd>(d, a, b);
    else tile::wg::Mma<T, kCols>::template ss<0, 0, kAdd>(d, a, b);
  }
  // B operand of k-step ks of a sum over tokens, columns col0 on of [token][p] tile t (tt: its transpose).
  static __device__ __forceinline__ uint64_t tokens_b(const T* t, const T* tt, int col0, int ks) {
    if constexpr (Shape::kTf32) return tile::wg::k_major<TokTile>(tt, col0, ks);
    else return tile::wg::mn_major<TokTile>(t, col0, ks);
  }
  static __device__ __forceinline__ void ss_tokens(tile::FragC* d, uint64_t a, uint64_t b) {
    if constexpr (Shape::kTf32) tile::wg::MmaTf32<kCols>::ss(d, a, b);
    else tile::wg::Mma<T, kCols>::template ss<0, 1>(d, a, b);
  }
  static __device__ __forceinline__ void rs_tokens(tile::FragC* d, const tile::FragA& a, uint64_t b) {
    if constexpr (Shape::kTf32) tile::wg::MmaTf32<kCols>::rs(d, a, b);
    else tile::wg::Mma<T, kCols>::template rs<1>(d, a, b);
  }
  // W^T's A operand for k-step ks: rows j = m0 .. m0 + 15 (the warp's), tokens i = kK ks .. . In the
  // TF32 layout (MmaTf32), with g = lane / 4, q = lane % 4: (j = m0 + g, i = 8 ks + q), (j + 8, i),
  // (j, i + 4), (j + 8, i + 4), read from W [i][j], which holds TF32 values already (store_w).
  static __device__ __forceinline__ tile::FragA w_trans(const T* W, int m0, int ks) {
    if constexpr (Shape::kTf32) {
      const int j = m0 + (tile::lane_id() >> 2), i = 8 * ks + (tile::lane_id() & 3);
      auto at = [&](int r, int c) { return __float_as_uint(W[TokTile::offset(r, c)]); };
      return {{at(i, j), at(i, j + 8), at(i + 4, j), at(i + 4, j + 8)}};
    } else {
      return tile::wg::load_a_trans<TokTile>(W, m0, 16 * ks);
    }
  }
  // Tile t of kElems elements rounded to TF32 in place (fp32 only; nothing for 16-bit), a 16-byte
  // piece a thread at a time: TF32 wgmma reads a 32-bit operand truncated, a bias of about 2^-11 a
  // factor that the sums over cancelling terms (dA, ddt) gather (H100: dA's error 1.1e-3 to 2.7e-3
  // with the tiles as TMA brought them, the portable kernel's, which rounds, 2.5e-4 to 9.2e-4).
  // The caller then fences the async proxy and syncs the block before wgmma reads the tile.
  template <int kElems, int kThreads>
  static __device__ __forceinline__ void round_tf32(T* t) {
    if constexpr (Shape::kTf32) {
      static_assert(kElems % (4 * kThreads) == 0, "whole 16-byte pieces a thread");
      constexpr int kPieces = kElems / (4 * kThreads);
      uint4* at = reinterpret_cast<uint4*>(t) + threadIdx.x;
      uint4 v[kPieces];  // all loads first, so that they are in flight together
#pragma unroll
      for (int k = 0; k < kPieces; ++k) v[k] = at[k * kThreads];
#pragma unroll
      for (int k = 0; k < kPieces; ++k)
        at[k * kThreads] = {tile::to_tf32(__uint_as_float(v[k].x)), tile::to_tf32(__uint_as_float(v[k].y)),
                            tile::to_tf32(__uint_as_float(v[k].z)), tile::to_tf32(__uint_as_float(v[k].w))};
    }
  }
  // t^T into tt (fp32 only; t holds TF32 values already: round_tf32 or the gate), by kThreads
  // threads: thread (p, part) writes 16-byte pieces of row p, four tokens each (a warp reads 32
  // consecutive columns of a token row, and its stores of 8 rows land in 8 distinct swizzle
  // positions: no bank conflict either way).
  template <int kThreads>
  static __device__ __forceinline__ void transpose(T* tt, const T* t) {
    static_assert(Shape::kTf32 && kThreads % 64 == 0, "threads cover the 64 columns");
    constexpr int kPieces = 16 / (kThreads / 64);
    const int p = threadIdx.x % 64, part = threadIdx.x / 64;
#pragma unroll
    for (int k = 0; k < kPieces; ++k) {
      const int i = 4 * (kPieces * part + k);
      *reinterpret_cast<float4*>(tt + TokTile::offset(p, i)) = {t[TokTile::offset(i, p)], t[TokTile::offset(i + 1, p)],
                                                                t[TokTile::offset(i + 2, p)], t[TokTile::offset(i + 3, p)]};
    }
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
  using Mma = GradsProducts<T, Shape>;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kThreads = Shape::kThreads, kK = Shape::kK;
  constexpr int kTiles = Shape::kCols / 8, kTokSteps = kChunk / kK, kNSteps = Shape::kNTile / kK;
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
  T *xt = nullptr, *dyt = nullptr;  // X^T and dY^T (TF32)
  if constexpr (Shape::kTf32) xt = sm.tr.XT, dyt = sm.tr.dYT;

  wait_previous_kernel();  // the walks' states
  start_next_kernel();
  // Thread 0's loads of C, B, h and dh (each named tile, its columns col_first on) on barrier bar.
  auto load_state_tiles = [&](int col_first, uint64_t* bar, bool with_c, bool with_b, bool with_h, bool with_dh) {
    const int tok = static_cast<int>(t0), hi = static_cast<int>(h), bi = static_cast<int>(b), gi = static_cast<int>(grp);
    const int state_row = static_cast<int>(b * a.scan.nchunks + c);  // (b, c) of the [b x nchunks] views
    constexpr int e = sizeof(T);
    tma::arrive_expect_bytes(bar, (with_c + with_b + with_h + with_dh) * Shape::kNBytes);
    if (with_c) tma::load_swizzled_tile<kChunk, kNTile, e>(sm.C, &a.C_map, tok, gi, bi, bar, col_first);
    if (with_b) tma::load_swizzled_tile<kChunk, kNTile, e>(sm.B, &a.B_map, tok, gi, bi, bar, col_first);
    if (with_h) tma::load_swizzled_tile<kP, kNTile, e>(sm.H, &a.h_map, 0, hi, state_row, bar, col_first);
    if (with_dh) tma::load_swizzled_tile<kP, kNTile, e>(sm.DH, &a.dh_map, 0, hi, state_row, bar, col_first);
  };
  // Waits for the tiles of C, B, h and dh on barrier bar; fp32 rounds the named ones to TF32 in
  // place (round_tf32) and makes them visible to wgmma.
  auto state_tiles_landed = [&](uint64_t* bar, bool with_c, bool with_b, bool with_h, bool with_dh) {
    tma::wait(bar, 0);
    if constexpr (Shape::kTf32) {
      if (with_c) Mma::template round_tf32<NTile::kElems, kThreads>(sm.C);
      if (with_b) Mma::template round_tf32<NTile::kElems, kThreads>(sm.B);
      if (with_h) Mma::template round_tf32<NTile::kElems, kThreads>(sm.H);
      if (with_dh) Mma::template round_tf32<NTile::kElems, kThreads>(sm.DH);
      wg::proxy_fence();
      __syncthreads();
    }
  };
  if (threadIdx.x == 0) {
    for (uint64_t& bar : sm.full) tma::barrier_init(&bar, 1);
    tma::barrier_init_fence();
    load_state_tiles(0, &sm.full[0], /*C*/ true, /*B*/ true, /*h*/ true, /*dh*/ Shape::kStateOnce);
    const int tok = static_cast<int>(t0), hi = static_cast<int>(h), bi = static_cast<int>(b);
    tma::arrive_expect_bytes(&sm.full[1], (gated ? 3 : 2) * Shape::kTokBytes);
    tma::load_swizzled_tile<kChunk, kP, sizeof(T)>(sm.X, &a.x_map, tok, hi, bi, &sm.full[1]);
    tma::load_swizzled_tile<kChunk, kP, sizeof(T)>(sm.dout, &a.dout_map, tok, hi, bi, &sm.full[1]);
    if (gated) tma::load_swizzled_tile<kChunk, kP, sizeof(T)>(sm.Z, &a.z_map, tok, hi, bi, &sm.full[1]);
    if constexpr (!Shape::kStateOnce) load_state_tiles(kLastHalf, &sm.full[2], /*C*/ false, /*B*/ false, /*h*/ false, /*dh*/ true);
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
  tile::FragC acc_dx[kTiles];  // dxp (3 and 4)
  // <dh, h> while the products run: both tiles in one layout, so element by element.
  float hdot = 0.0f;
  auto add_hdot = [&] {
    for (int k = threadIdx.x; k < NTile::kElems * static_cast<int>(sizeof(T)) / 16; k += kThreads) {
      const uint4 d = reinterpret_cast<const uint4*>(sm.DH)[k], v = reinterpret_cast<const uint4*>(sm.H)[k];
      const uint32_t* dv = reinterpret_cast<const uint32_t*>(&d);
      const uint32_t* hv = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (Shape::kTf32) {
          hdot += __uint_as_float(dv[j]) * __uint_as_float(hv[j]);
        } else {
          const float2 x = tile::unpack2<T>(dv[j]), y = tile::unpack2<T>(hv[j]);
          hdot += x.x * y.x + x.y * y.y;
        }
      }
    }
  };

  // 1. S = C B^T and Y = C h^T (the first k-step of each starts it afresh), then M = dY X^T; the
  // warpgroup's columns of each (B's, h's and x's rows from col0).
  tile::FragC acc_y[kTiles];
  tile::FragC acc_s[kTiles];
  float decay_f[kTiles][4];
  const T* dY = sm.dout;  // without z the dout tile is dY
  {
    tile::FragC acc_m[kTiles];
    // The products over the state columns in the tiles: S += C B^T and Y += C h^T (kAdd false: the
    // first k-step starts them afresh); with kStateOnce also dxp += B dh^T and <dh, h>.
    auto state_products = [&](auto add) {
      constexpr bool kAdd = decltype(add)::value;
      Mma::template kk<kAdd>(acc_s, wg::k_major<NTile>(sm.C, 0, 0), wg::k_major<NTile>(sm.B, col0, 0));
      Mma::template kk<kAdd>(acc_y, wg::k_major<NTile>(sm.C, 0, 0), wg::k_major<NTile>(sm.H, col0, 0));
#pragma unroll
      for (int ks = 1; ks < kNSteps; ++ks) {
        const uint64_t c_desc = wg::k_major<NTile>(sm.C, 0, ks);
        Mma::kk(acc_s, c_desc, wg::k_major<NTile>(sm.B, col0, ks));
        Mma::kk(acc_y, c_desc, wg::k_major<NTile>(sm.H, col0, ks));
      }
      if constexpr (Shape::kStateOnce) {  // 3. dxp += B dh^T over the same columns
        Mma::template kk<kAdd>(acc_dx, wg::k_major<NTile>(sm.B, 0, 0), wg::k_major<NTile>(sm.DH, col0, 0));
#pragma unroll
        for (int ks = 1; ks < kNSteps; ++ks) Mma::kk(acc_dx, wg::k_major<NTile>(sm.B, 0, ks), wg::k_major<NTile>(sm.DH, col0, ks));
      }
      wg::commit();
      if constexpr (Shape::kStateOnce) add_hdot();  // (before the next half takes the tiles' place)
    };
    state_tiles_landed(&sm.full[0], /*C*/ true, /*B*/ true, /*h*/ true, /*dh*/ Shape::kStateOnce);
    wg::fence();
    state_products(std::false_type{});
    // dY = dout silu(z) while those run: the same swizzled layout as its sources, so element by element.
    // (With fp32, dY and X rounded to TF32: round_tf32.)
    tma::wait(&sm.full[1], 0);
    if (gated) {  // (the tiles as one row of 64 x 64 elements: the same position in each)
      gate_grad_tile<T, 1, TokTile::kElems, kThreads, Shape::kTf32>(sm.dY, TokTile::kElems, sm.dout, sm.Z, nullptr);
      dY = sm.dY;
    } else {
      Mma::template round_tf32<TokTile::kElems, kThreads>(sm.dout);
    }
    Mma::template round_tf32<TokTile::kElems, kThreads>(sm.X);
    if (gated || Shape::kTf32) {
      wg::proxy_fence();  // dY (and the rounded tiles) are read by wgmma (the async proxy)
      __syncthreads();
    }
    wg::fence();
    Mma::template kk<false>(acc_m, wg::k_major<TokTile>(dY, 0, 0), wg::k_major<TokTile>(sm.X, col0, 0));
#pragma unroll
    for (int ks = 1; ks < kP / kK; ++ks) Mma::kk(acc_m, wg::k_major<TokTile>(dY, 0, ks), wg::k_major<TokTile>(sm.X, col0, ks));
    wg::commit();
    if constexpr (Shape::kTf32) {  // X^T and dY^T for 2 and 4 (visible to wgmma after the barrier before 2)
      Mma::template transpose<kThreads>(xt, sm.X);
      Mma::template transpose<kThreads>(dyt, dY);
    }
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
      if constexpr (Shape::kStateOnce) wg::pin(acc_dx);
      reload(kNTile, &sm.full[3], /*C*/ true, /*B*/ true, /*h*/ true, /*dh*/ Shape::kStateOnce);
      state_tiles_landed(&sm.full[3], /*C*/ true, /*B*/ true, /*h*/ true, /*dh*/ Shape::kStateOnce);
      wg::fence();
      state_products(std::true_type{});
    }
    wg::wait<0>();
    wg::pin(acc_s), wg::pin(acc_y), wg::pin(acc_m);
    if constexpr (Shape::kStateOnce) wg::pin(acc_dx);

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

  // W (S masked and decayed) and W dt to shared memory, for 2 and 4.
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) apply_factors(acc_s[nt], decay_f[nt], col0 / 8 + nt, [](int) { return 1.0f; });
  auto store_w = [&](T* tile) {
    if constexpr (Shape::kTf32) {  // TF32 values, a pair an accumulator row
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          *reinterpret_cast<uint2*>(tile + TokTile::offset(m0 + tile::frag_row(2 * half), col0 + 8 * j + tile::frag_col(0))) =
              {tile::to_tf32(acc_s[j].v[2 * half]), tile::to_tf32(acc_s[j].v[2 * half + 1])};
    } else {  // two accumulator tiles per stmatrix
#pragma unroll
      for (int j = 0; j < kTiles; j += 2) {
        const tile::FragC &lo = acc_s[j], &hi = acc_s[j + 1];
        const uint32_t r[4] = {tile::pack2<T>(lo.v[0], lo.v[1]), tile::pack2<T>(lo.v[2], lo.v[3]),
                               tile::pack2<T>(hi.v[0], hi.v[1]), tile::pack2<T>(hi.v[2], hi.v[3])};
        wg::store_accum_pair<TokTile>(tile, m0, col0 + 8 * j, r);
      }
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

  // 2. Y += (W dt) X; 3. dxp = B dh^T (with two halves: the second, whose B, h and dh are in place;
  // with kStateOnce, 3 ran beside 1).
  wg::pin(acc_y);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < kTokSteps; ++ks)
    Mma::ss_tokens(acc_y, wg::k_major<TokTile>(w_dt, 0, ks), Mma::tokens_b(sm.X, xt, col0, ks));
  wg::commit();
  if constexpr (!Shape::kStateOnce) {
    state_tiles_landed(&sm.full[2], /*C*/ false, /*B*/ false, /*h*/ false, /*dh*/ true);
    wg::fence();
    Mma::template kk<false>(acc_dx, wg::k_major<NTile>(sm.B, 0, 0), wg::k_major<NTile>(sm.DH, col0, 0));
#pragma unroll
    for (int ks = 1; ks < kNSteps; ++ks) Mma::kk(acc_dx, wg::k_major<NTile>(sm.B, 0, ks), wg::k_major<NTile>(sm.DH, col0, ks));
    wg::commit();
    add_hdot();
    if constexpr (Shape::kHalves > 1) {  // 3 and <dh, h> over the first half, its B, h and dh brought again
      wg::wait<0>();
      wg::pin(acc_y), wg::pin(acc_dx);
      reload(0, &sm.full[4], /*C*/ false, /*B*/ true, /*h*/ true, /*dh*/ true);
      state_tiles_landed(&sm.full[4], /*C*/ false, /*B*/ true, /*h*/ true, /*dh*/ true);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kNSteps; ++ks)
        Mma::kk(acc_dx, wg::k_major<NTile>(sm.B, 0, ks), wg::k_major<NTile>(sm.DH, col0, ks));
      wg::commit();
      add_hdot();
    }
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
    for (int ks = 0; ks < kTokSteps; ++ks) wt[ks] = Mma::w_trans(sm.W, m0, ks);
    wg::pin(acc_dx), wg::pin(wt);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kTokSteps; ++ks) Mma::rs_tokens(acc_dx, wt[ks], Mma::tokens_b(dY, dyt, col0, ks));
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
