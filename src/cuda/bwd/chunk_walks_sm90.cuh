// The backward's two walks on Hopper (sm_90a), the twins of chunk_states_walk and
// chunk_dstates_walk (sm80) on TMA and wgmma. Both are one linear walk over the 64-token chunks,
// in opposite directions:
//   forward:  h  <- d_c h  + X_c^T  (w B_c),  w_j = dt_j exp2(g_last - g_j)  [j in the chunk's last sequence]
//   adjoint:  dh <- d_c dh + dY_c^T (w C_c),  w_i = exp2(g_i)                [i in the sequence entering the chunk]
// with d_c = exp2(g_last), or 0 when a sequence starts inside the chunk, and dY = dout silu(z)
// (ssd-backward.md, "chunked form"). The forward stores the state entering each chunk, the adjoint
// the adjoint of the state leaving it, both as T (the products that read them round them to T), by
// TMA: once a step's A fragments are in registers, its x (or dout) and z tiles are free, the state
// goes there by stmatrix and one thread stores it as whole tiles (the states' [b x nchunks, P, H,
// N] maps, as chunk_grads reads them), so that no warp waits on its own stores.
//
// The chunks of each direction are cut into segments (in walk order: the adjoint's first segment
// holds the last chunks) so that the walks fill the GPU, as the forward's fused walks do: the first
// pass (kEnds) walks every segment but the last from zero and leaves its end state and decay;
// segment_entries chains them into each segment's entry; the second pass walks every segment from
// its entry and stores. One block per (segment, 64 head-dim columns, 128 state columns, head, batch
// row and direction): a producer warp issues the TMA loads kStages - 1 chunks ahead and computes each
// chunk's token weights and decay; a consumer warpgroup holds the state (64 x 128 fp32 in registers),
// decays it and adds the chunk's product by wgmma (A = the x or dY tile transposed and scaled by w
// in registers, B = the B or C tile read MN-major), as segment_ends_sm90's consumer does.
//
// fp32 inputs run the products on TF32, whose wgmma reads a 32-bit shared-memory operand K-major
// only (and truncates it): B's tile [token][n] becomes B^T [n][token] in its own place, rounded to
// TF32 by the consumers (wg::transpose_tf32_in_place), and A, (w X)^T, is gathered from X's tile in
// registers and rounded (tf32_walk_a). Their tiles take twice the bytes, so a block holds 64 state
// columns in two stages (two blocks a multiprocessor still), and stores its state from registers.
#pragma once

#include "cuda/bwd/args_sm90.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/math.cuh"
#include "cuda/fwd/plan.h"
#include "cuda/fwd/sm90_loads.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/tma.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct ChunkWalksSm90Shape {
  static constexpr bool kTf32 = sizeof(T) == 4;  // fp32 inputs: TF32 products
  static constexpr int kTokens = kBwdChunk;  // a step is one chunk
  static constexpr int kP = kWalkPCols;      // head-dim columns of a block
  static constexpr int kCols = kTf32 ? 64 : kN < 128 ? kN : 128;  // state columns of a block
  static constexpr int kParts = kN / kCols;                        // blocks per (segment, head-dim tile)
  // With z's tile, the most that leaves room for two blocks a multiprocessor.
  static constexpr int kStages = kTf32 ? 2 : 3;
  static constexpr int kConsumers = 128, kThreads = kConsumers + 32;  // and the producer warp
  using ATile = tile::wg::SwizzledTile<kTokens, kP, sizeof(T)>;      // x or dout [token][p], by TMA
  using BTile = tile::wg::SwizzledTile<kTokens, kCols, sizeof(T)>;   // B or C [token][n], by TMA
  using BtTile = tile::wg::SwizzledTile<kCols, kTokens, sizeof(T)>;  // fp32: B^T [n][token], in B's place
  struct Tiles {  // one stage: whole swizzle atoms, so every tile stays 1024-byte aligned
    T A[ATile::kElems];
    T Z[ATile::kElems];  // z (the adjoint with a gate)
    T B[BTile::kElems];
  };
  struct Scalars {
    float g[kTokens], dt[kTokens];
    int32_t seq[kTokens];  // zeros, written once, when the call has no resets
  };
  struct SharedStorage {  // placed at a 1024-byte aligned address
    Tiles tiles[kStages];
    Scalars scalars[kStages];
    float w[kStages][kTokens];  // the token weights
    float decay[kStages];
    uint64_t full[kStages];   // tiles landed
    uint64_t ready[kStages];  // weights written
    uint64_t free[kStages];   // consumers done
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage) + 1024;  // and the alignment's slack
  static_assert(sizeof(Tiles) % 1024 == 0, "tiles stay 1024-byte aligned");
  static_assert(kSm90BlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "walk blocks exceed shared memory");
};

// A of the adjoint with a gate: dout silu(z) w per token (columns 2q, 2q + 1, 2q + 8, 2q + 9 of the
// m16n8k16 A fragment), rounded to T once.
template <typename T>
__device__ __forceinline__ void gate_and_scale(tile::FragA& a, const tile::FragA& z, const float* w) {
  const int q = tile::lane_id() & 3;
  const float w0 = w[2 * q], w1 = w[2 * q + 1], w8 = w[2 * q + 8], w9 = w[2 * q + 9];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 d = tile::unpack2<T>(a.r[i]), g = tile::unpack2<T>(z.r[i]);
    a.r[i] = tile::pack2<T>(d.x * silu(g.x) * (i < 2 ? w0 : w8), d.y * silu(g.y) * (i < 2 ? w1 : w9));
  }
}

// TF32: the A operand (w X)^T of k-step ks for a warp whose rows start at head-dim column p0, read
// from X's tile [token][p] (dout silu(z) with a gate: z's tile, else null) and rounded. Rows g and
// g + 8 (g = lane / 4) are columns p0 + 2 g and p0 + 2 g + 1, so that a thread's two rows are one
// 8-byte load (the state's rows take the same order: walk_row_of); slots q and q + 4 (q = lane %
// 4) are tokens 8 ks + q and 8 ks + q + 4, as B^T holds them.
template <typename ATile>
__device__ __forceinline__ tile::FragA tf32_walk_a(const float* x, const float* z, const float* w, int p0, int ks) {
  const int p = p0 + 2 * (tile::lane_id() >> 2), j = 8 * ks + (tile::lane_id() & 3);
  float2 lo = *reinterpret_cast<const float2*>(x + ATile::offset(j, p));
  float2 hi = *reinterpret_cast<const float2*>(x + ATile::offset(j + 4, p));
  if (z) {
    const float2 zl = *reinterpret_cast<const float2*>(z + ATile::offset(j, p));
    const float2 zh = *reinterpret_cast<const float2*>(z + ATile::offset(j + 4, p));
    lo.x *= silu(zl.x), lo.y *= silu(zl.y), hi.x *= silu(zh.x), hi.y *= silu(zh.y);
  }
  const float wl = w[j], wh = w[j + 4];
  return {{tile::to_tf32(lo.x * wl), tile::to_tf32(lo.y * wl), tile::to_tf32(hi.x * wh), tile::to_tf32(hi.y * wh)}};
}

// The head-dim row (of the warp's 16) of accumulator element e: the TF32 order above, else the
// fragment's.
template <bool kTf32>
__device__ __forceinline__ int walk_row_of(int e) {
  return kTf32 ? 2 * (tile::lane_id() >> 2) + (e >> 1) : tile::frag_row(e);
}

// The consumer warpgroup's 64 x kCols piece of the state (acc; warp w's rows p0 = 16 w ..) as T
// into 64 x 64 swizzled tiles, columns 64 k .. 64 k + 63 into tiles[k], two accumulator tiles a
// stmatrix (a proxy fence and a barrier must follow before the TMA store reads them).
template <typename T, int kTiles>
__device__ __forceinline__ void stage_state(T* const (&tiles)[2], const tile::FragC (&acc)[kTiles], int p0) {
  using Tile = tile::wg::SwizzledTile<64, 64>;
  static_assert(kTiles % 2 == 0 && kTiles <= 16, "whole pairs of tiles, at most 128 columns");
#pragma unroll
  for (int j = 0; j < kTiles; j += 2) {
    const tile::FragC &lo = acc[j], &hi = acc[j + 1];
    const uint32_t r[4] = {tile::pack2<T>(lo.v[0], lo.v[1]), tile::pack2<T>(lo.v[2], lo.v[3]),
                           tile::pack2<T>(hi.v[0], hi.v[1]), tile::pack2<T>(hi.v[2], hi.v[3])};
    tile::wg::store_accum_pair<Tile>(tiles[j / 8], p0, 8 * (j % 8), r);
  }
}

// The state times the chunk's decay d, or zero where a sequence starts in the chunk (d == 0: a cut
// drops a NaN or inf too).
template <int kTiles>
__device__ __forceinline__ void decay_state(tile::FragC (&acc)[kTiles], float d) {
#pragma unroll
  for (auto& f : acc)
    for (float& v : f.v) v = d == 0.0f ? 0.0f : v * d;
}

template <typename T, int kN, bool kEnds>
__global__ void __launch_bounds__(ChunkWalksSm90Shape<T, kN>::kThreads, kSm90BlocksPerSm)
    chunk_walks_sm90_kernel(const __grid_constant__ GradsSm90Args a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  namespace tma = tile::tma;
  using Shape = ChunkWalksSm90Shape<T, kN>;
  using ATile = typename Shape::ATile;
  using BTile = typename Shape::BTile;
  constexpr int kTokens = Shape::kTokens, kStages = Shape::kStages, kCols = Shape::kCols;
  constexpr int kKSteps = kTokens / (Shape::kTf32 ? 8 : 16);  // wgmma k steps (tokens) per chunk
  const Geometry& geo = a.geo;
  const WalkRow row = walk_row(a, blockIdx.z);
  const bool adjoint = row.adjoint;
  const int64_t b = row.b, h = blockIdx.y, grp = geo.group_of(h);
  const Segments& segs = adjoint ? a.adj : a.seg;
  // x: (segment, head-dim tile, part of the state columns); the segment's chunks in walk order.
  const unsigned per_seg = static_cast<unsigned>(segs.ptiles) * Shape::kParts;
  const int64_t seg = blockIdx.x / per_seg;
  const int p_base = static_cast<int>(blockIdx.x % per_seg / Shape::kParts) * kWalkPCols;
  const int n0 = static_cast<int>(blockIdx.x % Shape::kParts) * kCols;
  const int64_t nc = a.scan.nchunks, first = seg * segs.chunks;
  const int nsteps = static_cast<int>(nc - first < segs.chunks ? nc - first : segs.chunks);
  auto chunk_of = [&](int i) { return adjoint ? nc - 1 - (first + i) : first + i; };
  const bool gated = adjoint && a.io.z != nullptr;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *tma::align_1024<typename Shape::SharedStorage>(smem_bytes);
  auto parity = [](int i) { return static_cast<uint32_t>(i / kStages) & 1; };

  if (threadIdx.x == 0)
    for (int k = 0; k < kStages; ++k) {
      tma::barrier_init(&smem.ready[k], 32);                // the producer warp's lanes
      tma::barrier_init(&smem.free[k], Shape::kConsumers);  // every consumer thread
    }
  wait_previous_kernel();  // chunk_cumsum's g and dt (the second pass: the segment entries)
  start_next_kernel();
  prepare_stages<kStages, Shape::kThreads>(a, smem.full, [&](int k) { return smem.scalars[k].seq; });  // (a barrier)

  if (threadIdx.x >= Shape::kConsumers) {
    // The producer warp. Step i of the walk is chunk chunk_of(i), in buffer i % kStages.
    const int lane = tile::lane_id();
    auto stage_step = [&](int i) {
      const int buf = i % kStages;
      const int64_t t0 = chunk_of(i) * kTokens;
      typename Shape::Tiles& t = smem.tiles[buf];
      typename Shape::Scalars& sc = smem.scalars[buf];
      uint64_t* full = &smem.full[buf];
      constexpr uint32_t kScalarBytes = kTokens * 4;
      const uint32_t tiles = kTokens * ((gated ? 2 : 1) * kWalkPCols + kCols) * sizeof(T);
      tma::arrive_expect_bytes(full, tiles + (a.scan.resets ? 3 : 2) * kScalarBytes);
      const int tok = static_cast<int>(t0), hi = static_cast<int>(h), bi = static_cast<int>(b);
      constexpr int kE = sizeof(T);
      tma::load_swizzled_tile<kTokens, kWalkPCols, kE>(t.A, adjoint ? &a.dout_map : &a.x_map, tok, hi, bi, full, p_base);
      if (gated) tma::load_swizzled_tile<kTokens, kWalkPCols, kE>(t.Z, &a.z_map, tok, hi, bi, full, p_base);
      tma::load_swizzled_tile<kTokens, kCols, kE>(t.B, adjoint ? &a.C_map : &a.B_map, tok, static_cast<int>(grp), bi, full, n0);
      tma::load_bytes(sc.g, a.scan.g + token_index(a, b, h, t0), kScalarBytes, full);
      tma::load_bytes(sc.dt, a.scan.dt + token_index(a, b, h, t0), kScalarBytes, full);
      if (a.scan.resets) tma::load_bytes(sc.seq, a.scan.seq + b * a.scan.lpad + t0, kScalarBytes, full);
    };
    int issued = 0;  // steps whose loads went out
    for (; issued < kStages - 1 && issued < nsteps; ++issued)
      if (lane == 0) stage_step(issued);
    float log_decay = 0.0f;  // the segment's decay, for kEnds
    bool cut = false;
    for (int i = 0; i < nsteps; ++i) {
      const int buf = i % kStages;
      const int64_t c = chunk_of(i);
      tma::wait(&smem.full[buf], parity(i));
      const typename Shape::Scalars& sc = smem.scalars[buf];
      const int32_t seq_prev = a.scan.resets && c > 0 ? seq_of(a, b, c * kTokens - 1) : 0;
      const float g_last = sc.g[kTokens - 1];
      const int32_t seq_last = sc.seq[kTokens - 1];
      for (int j = lane; j < kTokens; j += 32)
        smem.w[buf][j] = adjoint ? (sc.seq[j] == seq_prev ? fast_exp2(sc.g[j]) : 0.0f)
                                 : (sc.seq[j] == seq_last ? sc.dt[j] * fast_exp2(g_last - sc.g[j]) : 0.0f);
      if (lane == 0) smem.decay[buf] = seq_last == seq_prev ? exp2f(g_last) : 0.0f;
      cut = cut || seq_last != seq_prev;
      log_decay += g_last;
      __syncwarp();
      tma::arrive(&smem.ready[buf]);  // every lane, each releasing its own weights
      // Step i + kStages - 1 goes into step i - 1's buffer once the consumers are done with it
      // (every lane waits: each writes that buffer's weights later).
      if (issued < nsteps) {
        if (i > 0) tma::wait(&smem.free[(i - 1) % kStages], parity(i - 1));
        if (lane == 0) stage_step(issued);
        ++issued;
      }
    }
    if (kEnds && lane == 0 && p_base == 0 && n0 == 0)
      segs.decay[(b * segs.count + seg) * geo.nheads + h] = cut ? kSegmentCut : exp2f(log_decay);
    return;
  }

  // The consumer warpgroup: warp w holds rows 16 w .. of the block's 64 x kCols piece of the state.
  const int p0 = 16 * tile::warp_id();
  tile::FragC acc[kCols / 8];
  auto for_each_state = [&](auto&& f) {  // f(value, p index, n index), rows inside the head dim
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pi = p_base + p0 + walk_row_of<Shape::kTf32>(e), ni = n0 + 8 * j + tile::frag_col(e);
        if (pi < geo.headdim) f(acc[j].v[e], pi, ni);
      }
  };
  if (!kEnds) {  // the entry: the segment's (several segments), else the walk's first state or zero
    const float* init = adjoint ? a.grad.dfinal_states : a.io.initial_states;
    const Strides4& stride = adjoint ? a.grad.dfinal_states_stride : a.io.initial_states_stride;
    if (segs.count > 1) {
      const float* entry = seg_state<kN>(segs.entries, a, b, seg, h);
      for_each_state([&](float& v, int pi, int ni) { v = entry[pi * kN + ni]; });
    } else if (init) {
      for_each_state([&](float& v, int pi, int ni) {
        if (ni < geo.dstate) v = init[state_offset(stride, b, h, pi, ni)];
      });
    }
  }
  // Each chunk's product is waited for before the next chunk decays the state (the other block on
  // the multiprocessor fills the wait).
  for (int i = 0; i < nsteps; ++i) {
    const int buf = i % kStages;
    tma::wait(&smem.ready[buf], parity(i));
    tma::wait(&smem.full[buf], parity(i));  // (complete already: the producer waited for it)
    typename Shape::Tiles& t = smem.tiles[buf];
    const float* w = smem.w[buf];
    const int64_t c = chunk_of(i);
    if constexpr (Shape::kTf32) {
      wg::transpose_tf32_in_place<BTile, typename Shape::BtTile>(t.B, threadIdx.x, 1);
      tile::FragA aw[kKSteps];
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) aw[ks] = tf32_walk_a<ATile>(t.A, gated ? t.Z : nullptr, w, p0, ks);
      if constexpr (!kEnds) {  // the state at the chunk's edge, a thread's (p, n), (p, n + 1) pairs
        float* out = static_cast<float*>(adjoint ? a.work.dstates : a.chunk_states) +
                     chunk_head(a, b, c, h) * geo.headdim * geo.dstate;
#pragma unroll
        for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int pi = p_base + p0 + walk_row_of<true>(e), ni = n0 + 8 * j + tile::frag_col(e);
            if (pi < geo.headdim && ni < geo.dstate)
              *reinterpret_cast<float2*>(out + pi * geo.dstate + ni) = {acc[j].v[e], acc[j].v[e + 1]};
          }
      }
      wg::proxy_fence();  // B^T, written by the threads, is read by wgmma after the barrier
      wg::warpgroup_sync(1);
      decay_state(acc, smem.decay[buf]);
      wg::pin(acc), wg::pin(aw);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        wg::MmaTf32<kCols>::rs(acc, aw[ks], wg::k_major<typename Shape::BtTile>(t.B, 0, ks));
    } else {
      tile::FragA aw[kKSteps];
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        aw[ks] = wg::load_a_trans<ATile>(t.A, p0, 16 * ks);
        if (gated) gate_and_scale<T>(aw[ks], wg::load_a_trans<ATile>(t.Z, p0, 16 * ks), w + 16 * ks);
        else tile::Mma<T>::scale_a_cols(aw[ks], [&](int k) { return w[16 * ks + k]; });
      }
      if constexpr (!kEnds) {  // the state at the chunk's edge, through the A and Z tiles
        static_assert(ATile::kElems == 64 * 64 && kCols <= 128, "A and Z hold 64 state columns each");
        T* const staging[2] = {t.A, t.Z};
        wg::warpgroup_sync(1);  // every warp's fragments are out of A and Z
        stage_state<T>(staging, acc, p0);
        wg::proxy_fence();
        wg::warpgroup_sync(1);
        if (threadIdx.x == 0) {
          const CUtensorMap* state_map = adjoint ? &a.dh_map : &a.h_map;
          const int row = static_cast<int>(b * a.scan.nchunks + c);  // (b, c) of the [b x nchunks] view
#pragma unroll
          for (int k = 0; k < kCols / 64; ++k)
            tma::store_4d(state_map, n0 + 64 * k, static_cast<int>(h), p_base, row, staging[k]);
        }
      }
      decay_state(acc, smem.decay[buf]);
      wg::pin(acc), wg::pin(aw);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        wg::Mma<T, kCols>::template rs<1>(acc, aw[ks], wg::mn_major<BTile>(t.B, 0, ks));
    }
    wg::commit();
    wg::wait<0>();
    wg::pin(acc);
    if (!kEnds && !Shape::kTf32 && threadIdx.x == 0) tma::wait_stores_read();  // the state's tiles are read: A and Z are free
    tma::arrive(&smem.free[buf]);  // every thread, after its own reads of the buffer
  }
  if (!kEnds && !Shape::kTf32 && threadIdx.x == 0) tma::wait_stores();

  if (kEnds) {  // all kCols columns (B's and C's padding columns are zero), as segment_entries reads them
    float* out = seg_state<kN>(segs.ends, a, b, seg, h);
    for_each_state([&](float& v, int pi, int ni) { out[pi * kN + ni] = v; });
  } else if (adjoint && seg + 1 == segs.count && a.grad.dinitial_states) {
    for_each_state([&](float& v, int pi, int ni) {
      if (ni < geo.dstate) a.grad.dinitial_states[state_offset(a.grad.dinitial_states_stride, b, h, pi, ni)] = v;
    });
  }
#else
  __trap();  // built without sm_90a code: the host never selects this kernel
#endif
}

}  // namespace mamba2ssd::cuda
