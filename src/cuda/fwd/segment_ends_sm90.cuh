// The hopper path's first pass (the twin of segment_ends_sm80): each segment's end state from a zero state, as one
// reduction over the segment's tokens instead of a walk that decays the state chunk by chunk:
//
//   end = sum_c (prod_{c' > c} D_c') X_c^T (w_c B_c) = sum_j x_j^T B_j w'_j,
//   w'_j = dt_j exp2(g_last(c) - g_j + S_c),  S_c = sum of g_last(c') over the later chunks c'
//
// (D_c' = exp2(g_last(c')) the chunk decays; zero weight for tokens of another sequence than their
// chunk's last, and for every token before a chunk boundary that starts a sequence). With the
// decays folded into the token weights, consecutive chunks' products only accumulate: no step
// waits for the state of the one before. The walk goes backwards, so S_c is
// a running sum, and it ends early at a sequence start (nothing before it reaches the end). The
// kernel does this per 64-token step rather than per chunk: a step's decay is g_last - g_base
// (g_base = g before the step, nonzero in a chunk's second half), and S sums those. It leaves
// segment_entries the segment's decay, exp2(S) over the whole segment (kSegmentCut if a sequence
// starts in it).
//
// One block per (segment but the last, 64 head-dim columns, head, batch row), two blocks per
// multiprocessor (fp32: one); the walk
// goes in steps of 64 tokens (half a chunk of the plan: a step in a chunk's second half measures its
// decays from g before it). A producer warp issues the loads (TMA, kStages - 1 steps ahead) and
// computes each step's token weights w'; a consumer warpgroup accumulates X^T (w' B) by wgmma, A =
// X^T scaled by w' in registers, B = B read MN-major. They meet only on mbarriers (loaded, weights
// ready, buffer free), so the consumers never wait for a block-wide barrier. Every head dim (a
// block per 64 columns of it: walk_block); 16-bit inputs with state size up to kN (64, 128 or
// 256; with 256, two blocks per segment and column tile, each with 128 of the state columns,
// kCols), fp32 up to 128: TF32, the sum transposed as in segment_scan_tf32_sm90.cuh (h^T +=
// (w' B)^T X, X^T made by the consumers into the stage's own buffer).
#pragma once

#include <type_traits>

#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/math.cuh"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/segment_scan_tf32_sm90.cuh"
#include "cuda/fwd/sm90_loads.cuh"
#include "cuda/prefill/request_edges.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct SegmentEndsSm90Shape : Sm90Step {
  static constexpr bool kTf32 = sizeof(T) == 4;
  static_assert(!kTf32 || kN <= 128, "fp32 walks take state sizes up to 128");
  static constexpr int kCols = kN < 128 ? kN : 128;  // state columns of a block
  static constexpr int kParts = kN / kCols;          // blocks per segment
  static constexpr int kStages = kTf32 ? 3 : 4;
  static constexpr int kBlocksPerSm = kTf32 ? 1 : kSm90BlocksPerSm;
  static constexpr int kConsumers = Sm90Step::kThreads, kThreads = kConsumers + 32;  // and the producer warp
  using XTile = tile::wg::SwizzledTile<kTokens, kHeadDim, sizeof(T)>;  // [token][p], by TMA
  using BTile = tile::wg::SwizzledTile<kTokens, kCols, sizeof(T)>;     // [token][n], by TMA
  using XtTile = tile::wg::SwizzledTile<kHeadDim, kTokens, 4>;         // fp32: X^T, by the consumers
  struct Tiles16 {  // one stage: whole swizzle atoms, so every tile stays 1024-byte aligned
    T X[XTile::kElems];
    T B[BTile::kElems];
  };
  struct TilesTf32 {
    T X[XTile::kElems];
    T B[BTile::kElems];
    float Xt[XtTile::kElems];
  };
  using Tiles = std::conditional_t<kTf32, TilesTf32, Tiles16>;
  struct SharedStorage {  // placed at a 1024-byte aligned address
    Tiles tiles[kStages];
    Scalars scalars[kStages];
    float w[kStages][kTokens];  // the token weights
    int32_t stop[kStages][4];   // [stage][0]: the walk ends at this stage
    float entry_decay;          // the packed prefill: the decay from the segment's request's start to the
    int64_t entry_slot;         // segment's end, and the slot holding its state (-1: none to add)
    uint64_t full[kStages];     // tiles landed
    uint64_t ready[kStages];    // weights written
    uint64_t free[kStages];     // consumers done
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage) + 1024;  // and the alignment's slack
  static_assert(sizeof(Tiles) % 1024 == 0, "tiles stay 1024-byte aligned");
  static_assert(kBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "segment-end blocks exceed shared memory");
};

// kPrefill: the packed prefill's padded layout (request_edges.cuh): the steps' tokens where the chunk
// map says; the walk ends after a request's first step, whose entering state (its slot's) reaches
// the segment's end decayed, and that request's start cuts the segment's decay.
template <typename T, int kN, bool kPrefill = false>
__global__ void __launch_bounds__(SegmentEndsSm90Shape<T, kN>::kThreads, SegmentEndsSm90Shape<T, kN>::kBlocksPerSm)
    segment_ends_sm90_kernel(const __grid_constant__ Sm90FwdArgs a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  namespace tma = tile::tma;
  using Shape = SegmentEndsSm90Shape<T, kN>;
  static_assert(!Shape::kTf32 || !kPrefill, "the prefill's hopper kernels take 16-bit inputs");
  using XTile = typename Shape::XTile;
  using BTile = typename Shape::BTile;
  constexpr int kTokens = Shape::kTokens, kP = Shape::kHeadDim, kStages = Shape::kStages;
  constexpr int kStepsPerChunk = Shape::kStepsPerChunk, kCols = Shape::kCols;
  constexpr int kKSteps = kTokens / 16;  // wgmma k steps (tokens) per step
  // x: (segment, column tile) as in the main walk (walk_block), then the part of the state columns.
  const WalkBlock block = walk_block(a, blockIdx.x / Shape::kParts);
  const int64_t seg = block.seg, h = blockIdx.y, b = blockIdx.z;
  const int p_base = block.p_base;
  const int n0 = static_cast<int>(blockIdx.x % Shape::kParts) * kCols;  // the block's state columns
  const int64_t grp = a.geo.group_of(h);
  const int nsteps = static_cast<int>(a.seg.chunks) * kStepsPerChunk;  // never the last segment: all tokens real
  const int64_t step_last = (seg + 1) * nsteps - 1;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *tile::tma::align_1024<typename Shape::SharedStorage>(smem_bytes);
  auto parity = [](int i) { return static_cast<uint32_t>(i / kStages) & 1; };

  if (threadIdx.x == 0) smem.entry_slot = -1;
  if (threadIdx.x == 0)
    for (int k = 0; k < kStages; ++k) {
      tma::barrier_init(&smem.ready[k], 32);                // the producer warp's lanes
      tma::barrier_init(&smem.free[k], Shape::kConsumers);  // every consumer thread
    }
  prepare_stages<kStages, Shape::kThreads>(a, smem.full, [&](int k) { return smem.scalars[k].seq; });  // (a barrier)

  // Step i of the walk is step_last - i, in buffer i % kStages; its loads are issued by the producer
  // warp's lane 0, the tiles and the scalars apart or together.
  auto stage_step = [&](int i, bool tiles, bool scalars) {
    const int buf = i % kStages;
    const int64_t s = step_last - i;
    typename Shape::Scalars& sc = smem.scalars[buf];
    const StepStage<T> st{smem.tiles[buf].X, smem.tiles[buf].B, nullptr, sc.g(), sc.dt, sc.seq, &smem.full[buf]};
    const bool lead = s % kStepsPerChunk != 0;
    int64_t tile_t0 = -1;
    if constexpr (kPrefill) tile_t0 = prefill_step<kTokens, kStepsPerChunk>(a, s).t0;
    if (tiles) issue_step_tiles<T, kTokens, kP, kCols, false>(a, b, h, grp, s * kTokens, p_base, st, lead, n0, tile_t0);
    if (scalars) issue_step_scalars<T, kTokens>(a, b, h, s * kTokens, st, lead);
  };
  // The first steps' tiles fly while chunk_cumsum finishes (sm90_loads.cuh: x and B are the
  // caller's); not in the prefill, whose tiles' rows come from the chunk map, an earlier kernel's.
  constexpr bool kEarlyTiles = !kPrefill;
  const int first_steps = kStages - 1 < nsteps ? kStages - 1 : nsteps;
  if (kEarlyTiles && threadIdx.x == Shape::kConsumers)
    for (int i = 0; i < first_steps; ++i) stage_step(i, true, false);
  wait_previous_kernel();  // chunk_cumsum's g and dt
  start_next_kernel();

  if (threadIdx.x >= Shape::kConsumers) {
    // The producer warp.
    const int lane = tile::lane_id();
    int issued = 0;  // steps whose loads went out
    for (; issued < first_steps; ++issued)
      if (lane == 0) stage_step(issued, !kEarlyTiles, true);
    float suffix = 0.0f;    // log2 decay from the end of step i to the end of the segment
    int32_t seq_after = 0;  // last sequence id of step i - 1 (the step after step i)
    bool start_after = false;  // the prefill: step i - 1 is a request's first
    int i = 0;
    for (; i < nsteps; ++i) {
      const int buf = i % kStages;
      tma::wait(&smem.full[buf], parity(i));
      const float *g = smem.scalars[buf].g(), *dt = smem.scalars[buf].dt;
      const int32_t* seq = smem.scalars[buf].seq;
      const float g_last = g[kTokens - 1], g_base = (step_last - i) % kStepsPerChunk ? g[-1] : 0.0f;
      const int32_t seq_last = seq[kTokens - 1];
      // A sequence that starts in the step after this one cuts this step and all earlier ones off.
      const bool stop = i > 0 && (kPrefill ? start_after : seq_after != seq_last);
      for (int j = lane; j < kTokens && !stop; j += 32)
        smem.w[buf][j] = seq[j] == seq_last ? dt[j] * fast_exp2(g_last - g[j] + suffix) : 0.0f;
      if (lane == 0) smem.stop[buf][0] = stop;
      if constexpr (kPrefill) {  // a request's first step: its slot's state, decayed to the end, joins the sum
        const int64_t s = step_last - i;
        const PaddedChunk pc = a.scan.padded[s / kStepsPerChunk];
        start_after = !stop && s % kStepsPerChunk == 0 && starts_request(a, pc);
        if (start_after && lane == 0) {
          const int64_t slot = a.prefill.index(a.prefill.slots[pc.req]);
          smem.entry_slot = slot >= 0 && a.prefill.reads(pc.req) ? slot : -1;
          smem.entry_decay = exp2f(suffix + g_last - g_base);
        }
        // A step with fewer than 64 of its request's tokens: the boxes' other rows are the next
        // request's, zeroed before the consumers read them (as in segment_scan_sm90), so that a
        // non-finite token of one request never meets another's zero weights.
        const int rows = prefill_step<kTokens, kStepsPerChunk>(a, s).rows;
        if (!stop && 0 < rows && rows < kTokens) {  // (a step with none is zeros already: TMA's fill)
          XTile::zero_rows_from(smem.tiles[buf].X, rows, lane, 32);
          BTile::zero_rows_from(smem.tiles[buf].B, rows, lane, 32);
          wg::proxy_fence();  // (the consumers' wgmma reads them after the release below)
        }
      }
      __syncwarp();
      tma::arrive(&smem.ready[buf]);  // every lane, each releasing its own weights
      if (stop) break;
      suffix += g_last - g_base;
      seq_after = seq_last;
      // Step i + kStages - 1 goes into step i - 1's buffer once the consumers are done with it
      // (every lane waits: each writes that buffer's weights later).
      if (issued < nsteps) {
        if (i > 0) tma::wait(&smem.free[(i - 1) % kStages], parity(i - 1));
        if (lane == 0) stage_step(issued, true, true);
        ++issued;
      }
    }
    if (lane == 0) {
      // The segment's decay: none if a sequence starts in it (the walk stopped early, or the token
      // before the segment belongs to another sequence than its first step's last token).
      if (n0 == 0 && p_base == 0) {
        const int64_t t_first = (step_last - nsteps + 1) * kTokens;
        const bool cut = i < nsteps || (kPrefill ? start_after
                                                 : a.scan.resets && seq_after != (t_first > 0 ? seq_of(a, b, t_first - 1) : 0));
        seg_decay(a, b, seg, h) = cut ? kSegmentCut : exp2f(suffix);
      }
      // After an early end, no copy may land once the block is gone.
      for (int k = i + 1; k < issued; ++k) tma::wait(&smem.full[k % kStages], parity(k));
    }
    return;
  }

  if constexpr (Shape::kTf32) {
    // The consumer warpgroup, fp32: warp w holds rows 16 w .. of each 64-row block of the
    // transposed state (state columns as in segment_scan_tf32_sm90: state_col).
    constexpr int kBlocks = kCols / 64;
    using XtTile = typename Shape::XtTile;
    const int m0 = 16 * tile::warp_id();
    tile::FragC acc[kBlocks][kP / 8];
#pragma unroll
    for (auto& block_h : acc) wg::pin(block_h);  // zeroed before the first wgmma
    for (int i = 0; i < nsteps; ++i) {
      const int buf = i % kStages;
      tma::wait(&smem.ready[buf], parity(i));
      tma::wait(&smem.full[buf], parity(i));  // (complete already: the producer waited for it)
      if (smem.stop[buf][0]) break;
      auto& tiles = smem.tiles[buf];
      transpose_x<XTile, XtTile, Shape::kConsumers>(tiles.Xt, tiles.X);
      wg::proxy_fence();
      wg::warpgroup_sync(1);  // X^T whole, for every warp's share of the products
#pragma unroll
      for (int sb = 0; sb < kBlocks; ++sb) {
        tile::FragA wb[kTokens / 8];
#pragma unroll
        for (int ks = 0; ks < kTokens / 8; ++ks) wb[ks] = wb_operand<BTile>(tiles.B, smem.w[buf], 64 * sb + m0, ks);
        wg::pin(acc[sb]), wg::pin(wb);
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < kTokens / 8; ++ks)
          wg::MmaTf32<64>::rs(acc[sb], wb[ks], wg::k_major<XtTile>(tiles.Xt, 0, ks));
        wg::commit();
      }
      wg::wait<0>();
#pragma unroll
      for (auto& block_h : acc) wg::pin(block_h);
      tma::arrive(&smem.free[buf]);  // every thread, after its own reads of the buffer
    }
    // Row p of the state: (p, n) and (p, n + 1) of a thread are adjacent (the padding rows and
    // columns are zero, as below).
    float* out = seg_state<kN>(a.seg.ends, a, b, seg, h);
#pragma unroll
    for (int sb = 0; sb < kBlocks; ++sb)
#pragma unroll
      for (int j = 0; j < kP / 8; ++j) {
        const int pi = p_base + 8 * j + tile::frag_col(0), n = tf32_state_col(64 * sb + m0);
        const tile::FragC& f = acc[sb][j];
        if (pi < a.geo.headdim) *reinterpret_cast<float2*>(out + pi * kN + n) = {f.v[0], f.v[2]};
        if (pi + 1 < a.geo.headdim) *reinterpret_cast<float2*>(out + (pi + 1) * kN + n) = {f.v[1], f.v[3]};
      }
    return;
  } else {
    // The consumer warpgroup: warp w holds rows 16 w .. of the state (p).
    const int p0 = 16 * tile::warp_id();
    tile::FragC acc[kCols / 8];
    wg::pin(acc);  // zeroed before the first wgmma
    // Each step's product is waited for before the next operand is built (with two operand sets
    // alternating and wait<1>, ptxas gave every k step's A the same registers and serialized them);
    // the other block on the multiprocessor fills the wait. (A second consumer warpgroup taking
    // turns with this one was twice as slow: perf-log.md v9.)
    for (int i = 0; i < nsteps; ++i) {
      const int buf = i % kStages;
      tma::wait(&smem.ready[buf], parity(i));
      tma::wait(&smem.full[buf], parity(i));  // (complete already: the producer waited for it)
      if (smem.stop[buf][0]) break;
      const float* w = smem.w[buf];
      tile::FragA xw[kKSteps];
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        xw[ks] = wg::load_a_trans<XTile>(smem.tiles[buf].X, p0, 16 * ks);
        tile::Mma<T>::scale_a_cols(xw[ks], [&](int k) { return w[16 * ks + k]; });
      }
      wg::pin(acc), wg::pin(xw);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        wg::Mma<T, kCols>::template rs<1>(acc, xw[ks], wg::mn_major<BTile>(smem.tiles[buf].B, 0, ks));
      wg::commit();
      wg::wait<0>();
      wg::pin(acc);
      tma::arrive(&smem.free[buf]);  // every thread, after its own reads of the buffer
    }

    if constexpr (kPrefill) {  // (written before the ready barrier of the request's first step, waited for above)
      const int64_t slot = smem.entry_slot;
      if (slot >= 0) {
        const float decay = smem.entry_decay;
        a.prefill.with_head<true>(slot, h, [&](auto head) {  // (the hopper path's caches allow pairs)
#pragma unroll
          for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {  // elements e and e + 1: columns ni and ni + 1
              const int pi = p_base + p0 + tile::frag_row(e), ni = n0 + 8 * j + tile::frag_col(e);
              if (pi >= a.geo.headdim || ni >= a.geo.dstate) continue;
              float v0, v1;
              head.load(pi, ni, v0, v1);
              acc[j].v[e] += decay * v0, acc[j].v[e + 1] += decay * v1;
            }
        });
      }
    }
    // All columns (B's padding ones are zero); the rows of the head dim (x's padding ones are zero).
    float* out = seg_state<kN>(a.seg.ends, a, b, seg, h) + n0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int pi = p_base + p0 + tile::frag_row(2 * half);
      if (pi >= a.geo.headdim) continue;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)
        *reinterpret_cast<float2*>(out + pi * kN + 8 * j + tile::frag_col(0)) = {acc[j].v[2 * half],
                                                                                 acc[j].v[2 * half + 1]};
    }
  }
#else
  __trap();  // built without sm_90a code: the host never selects this kernel (sm90_kernels_built)
#endif
}

}  // namespace mamba2ssd::cuda
