// The hopper path's main kernel for fp32 inputs: the walk of segment_scan_sm90.cuh (one block per
// (segment of chunks, 64 head-dim columns, head, batch row), the state on chip, steps of 64 tokens)
// with TF32 wgmma. wgmma reads 32-bit shared-memory operands K-major only, so every product is
// arranged to sum along rows as they lie in shared memory:
//   S      = C B^T                          sums over n: C and B as TMA writes them
//   Y      = C h^T                          sums over n: h [p][n], written by the threads
//   h^T    = exp2(g_last - g_base) h^T + (w B)^T X   sums over tokens: (w B)^T from registers, X^T
//   Y     += (S * exp2(g_i - g_j) dt_j * mask) X     sums over tokens: P from registers, X^T
// The state is held transposed (h^T: rows are state columns n), and X^T is the one transpose a step
// makes (the threads, from the TMA tile, while S and C h^T run). Two orders make the register
// operands free to build:
// - X^T's columns (tokens) within each 8 are stored even tokens first (slots 0-3 hold tokens 0, 2,
//   4, 6; slots 4-7 tokens 1, 3, 5, 7): the order in which an accumulator row of S holds its
//   columns in the TF32 A layout, so that P is S's registers as they are (p_operand).
// - Row r of the state's 64-row blocks (warp w's rows 16 w + g and 16 w + g + 8) is state column
//   16 w + 2 g and 16 w + 2 g + 1 of the block, so that a thread's (w B)^T elements are adjacent
//   pairs of B's rows (wb_operand: two 8-byte loads per k-step).
// One block per multiprocessor (the fp32 tiles fill shared memory) with one warpgroup per 64 state
// columns (state size 128: two), each running the step on its columns of B, C and h: S, C h^T and
// P X are sums over those columns, so y is the sum of the warpgroups' parts (warpgroup 1 hands its
// part over through shared memory), and each warpgroup's state jump is its own block of h^T. Every
// head dim (walk_block, as the 16-bit kernel), varlen states (kCarry). y is stored from registers.
// The first pass is segment_ends_sm90 in its fp32 form.
#pragma once

#include "cuda/common/grid_dependency.cuh"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/output_steps.cuh"
#include "cuda/fwd/sm90_loads.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <int kN>
struct SegmentScanTf32Shape : Sm90Step {
  static_assert(kN == 64 || kN == 128, "fp32 walks take state sizes up to 128");
  static constexpr int kStages = 2;       // steps in flight
  static constexpr int kGroups = kN / 64;  // warpgroups, one per 64 state columns
  static constexpr int kThreads = kGroups * Sm90Step::kThreads;
  using XTile = tile::wg::SwizzledTile<kTokens, kHeadDim, 4>;   // [token][p], by TMA
  using XtTile = tile::wg::SwizzledTile<kHeadDim, kTokens, 4>;  // [p][token slot], X^T by the threads
  using BCTile = tile::wg::SwizzledTile<kTokens, kN, 4>;        // [token][n], B and C, by TMA
  using BCPart = tile::wg::SwizzledTile<kTokens, 64, 4>;        // a warpgroup's columns of B or C
  using HPart = tile::wg::SwizzledTile<kHeadDim, 64, 4>;        // [p][n] of a warpgroup, by its threads
  static constexpr int kStageElems = XTile::kElems + 2 * BCTile::kElems;  // X, B, C
  static constexpr int kPartialFloats = kGroups > 1 ? kTokens * kHeadDim : 0;  // warpgroup 1's part of y
  // Shared memory from one 1024-byte aligned base: the stages' X, B and C; X^T; h per warpgroup;
  // warpgroup 1's part of y; the stages' scalars; the token weights; the stages' barriers.
  static constexpr int kSmemBytes =
      (kStages * kStageElems + XtTile::kElems + kGroups * HPart::kElems + kPartialFloats) * 4 +
      kStages * sizeof(Scalars) + kTokens * 4 + kStages * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "fp32 walk blocks exceed shared memory");
  static_assert(BCPart::kElems * kGroups == BCTile::kElems, "B's parts are its column blocks");
};

// The state column of accumulator element e of the transposed state, for a warp whose 16 rows start
// at state column n0: rows g and g + 8 are n0 + 2 g and n0 + 2 g + 1 (the order above).
__device__ __forceinline__ int tf32_state_col(int n0, int e = 0) { return n0 + 2 * (tile::lane_id() >> 2) + (e >> 1); }

// (wB)^T's A operand for k-step ks (tokens 8 ks ..) of a warp whose state rows start at n0: rows
// are state columns tf32_state_col(n0, e), slot q token 8 ks + 2 q, slot q + 4 the token after it.
template <typename BCTile>
__device__ __forceinline__ tile::FragA wb_operand(const float* B, const float* w, int n0, int ks) {
  const int n = tf32_state_col(n0);
  const int j = 8 * ks + 2 * (tile::lane_id() & 3);
  const float2 b0 = *reinterpret_cast<const float2*>(B + BCTile::offset(j, n));
  const float2 b1 = *reinterpret_cast<const float2*>(B + BCTile::offset(j + 1, n));
  const float2 wj = *reinterpret_cast<const float2*>(w + j);
  return {{tile::to_tf32(b0.x * wj.x), tile::to_tf32(b0.y * wj.x), tile::to_tf32(b1.x * wj.y),
           tile::to_tf32(b1.y * wj.y)}};
}

// P's A operand for k-step ks from S's accumulator tile ks: columns 2 q, 2 q + 1 are slots q, q + 4.
__device__ __forceinline__ tile::FragA p_operand(const tile::FragC& s) {
  return {{tile::to_tf32(s.v[0]), tile::to_tf32(s.v[2]), tile::to_tf32(s.v[1]), tile::to_tf32(s.v[3])}};
}

// X^T of a step into xt by kThreads threads, rounded to TF32, slots as above: thread (p, part)
// writes 16-byte pieces of row p, each from four tokens of column p (a warp reads 32 consecutive
// columns of a row: no bank conflict; its 16-byte stores land in 8 distinct swizzle positions per
// 8 rows).
template <typename XTile, typename XtTile, int kThreads>
__device__ __forceinline__ void transpose_x(float* xt, const float* x) {
  constexpr int kParts = kThreads / 64, kPieces = 16 / kParts;  // 16 pieces a row
  const int p = threadIdx.x % 64, part = threadIdx.x / 64;
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    const int piece = kPieces * part + k;
    const int t0 = 8 * (piece / 2) + piece % 2;  // tokens t0, t0 + 2, t0 + 4, t0 + 6
    uint4 v;
    v.x = tile::to_tf32(x[XTile::offset(t0, p)]);
    v.y = tile::to_tf32(x[XTile::offset(t0 + 2, p)]);
    v.z = tile::to_tf32(x[XTile::offset(t0 + 4, p)]);
    v.w = tile::to_tf32(x[XTile::offset(t0 + 6, p)]);
    *reinterpret_cast<uint4*>(xt + XtTile::offset(p, (t0 & ~7) + 4 * (t0 & 1))) = v;
  }
}

template <int kN, bool kCarry, bool kTiled>
__global__ void __launch_bounds__(SegmentScanTf32Shape<kN>::kThreads, 1)
    segment_scan_tf32_sm90_kernel(const __grid_constant__ Sm90FwdArgs a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  using Shape = SegmentScanTf32Shape<kN>;
  using XTile = typename Shape::XTile;
  using XtTile = typename Shape::XtTile;
  using BCTile = typename Shape::BCTile;
  using BCPart = typename Shape::BCPart;
  using HPart = typename Shape::HPart;
  using Out = OutputSteps<float, Shape::kTokens, Shape::kHeadDim>;
  using Mma = wg::MmaTf32<64>;
  constexpr int kTokens = Shape::kTokens, kP = Shape::kHeadDim, kStages = Shape::kStages;
  constexpr int kStepsPerChunk = Shape::kStepsPerChunk, kGroups = Shape::kGroups;
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const WalkBlock block = kTiled ? walk_block(a, blockIdx.x) : WalkBlock{blockIdx.x, 0};
  const int64_t seg = block.seg, h = blockIdx.y, b = blockIdx.z;
  const int p_base = kTiled ? block.p_base : 0;
  const HeadRows<kTiled> head_rows{p_base, kTiled ? geo.headdim : kWalkPCols};
  const int64_t grp = geo.group_of(h);
  const int64_t step_begin = seg * a.seg.chunks * kStepsPerChunk;
  const int64_t seq_steps = (geo.seqlen + kTokens - 1) / kTokens;
  const int64_t step_end =
      step_begin + a.seg.chunks * kStepsPerChunk < seq_steps ? step_begin + a.seg.chunks * kStepsPerChunk : seq_steps;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  float* smem_tiles = tile::tma::align_1024<float>(smem_bytes);
  auto sX = [&](int buf) { return smem_tiles + buf * Shape::kStageElems; };
  auto sB = [&](int buf) { return sX(buf) + XTile::kElems; };
  auto sC = [&](int buf) { return sB(buf) + BCTile::kElems; };
  float* s_xt = smem_tiles + kStages * Shape::kStageElems;
  float* s_hs = s_xt + XtTile::kElems;                            // [warpgroups] of h
  float* s_partial = s_hs + kGroups * HPart::kElems;              // [kYTiles][4][128]
  float* s_scalars = s_partial + Shape::kPartialFloats;           // [stages] of Scalars
  auto s_g = [&](int buf) { return Shape::g(s_scalars, buf); };
  auto s_dt = [&](int buf) { return Shape::dt(s_scalars, buf); };
  auto s_seq = [&](int buf) { return Shape::seq(s_scalars, buf); };
  float* s_w = s_scalars + kStages * Shape::kScalarFloats;       // [kTokens] token weights of the state jump
  uint64_t* s_full = reinterpret_cast<uint64_t*>(s_w + kTokens);  // [stages]

  auto stage_step = [&](int64_t s, int buf) {
    issue_step_loads<float, kTokens, kP, kN, true>(a, b, h, grp, s * kTokens, p_base,
                                                   {sX(buf), sB(buf), sC(buf), s_g(buf), s_dt(buf), s_seq(buf),
                                                    &s_full[buf]},
                                                   s % kStepsPerChunk != 0);
  };
  prepare_stages<kStages, Shape::kThreads>(a, s_full, s_seq);

  // Warpgroup wgi holds state columns n0 .. n0 + 63 (one 64-row block of h^T); its warp w holds
  // rows 16 w .. of the step (S, Y) and of that block. (wgi through warp_uniform: derived from
  // threadIdx alone, the tiles' addresses would leave uniform registers, segment_scan_sm90.cuh.)
  const int wgi = kGroups > 1 ? tile::warp_uniform(static_cast<int>(threadIdx.x) / Sm90Step::kThreads) : 0;
  const int n0 = 64 * wgi;
  const int m0 = 16 * (tile::warp_id() % 4);
  float* s_h = s_hs + wgi * HPart::kElems;
  tile::FragC acc_h[kP / 8];
  // tf32_state_col(n0 + m0, e), written out: through the helper ptxas scheduled the state-64 walk
  // differently (16 instructions fewer, not measured).
  auto state_col = [&](int e) { return n0 + m0 + 2 * (tile::lane_id() >> 2) + (e >> 1); };
  auto for_each_state = [&](auto&& f) {  // f(value, p index, n index)
#pragma unroll
    for (int j = 0; j < kP / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(acc_h[j].v[e], 8 * j + tile::frag_col(e), state_col(e));
  };
  // The warpgroup's h [p][n] as the B operand of C h^T: a thread's elements (p, n) and (p, n + 1)
  // are adjacent.
  auto state_to_smem = [&] {
#pragma unroll
    for (int j = 0; j < kP / 8; ++j) {
      const tile::FragC& f = acc_h[j];
      const int p = 8 * j + tile::frag_col(0), n = state_col(0) - n0;
      *reinterpret_cast<uint2*>(s_h + HPart::offset(p, n)) = {tile::to_tf32(f.v[0]), tile::to_tf32(f.v[2])};
      *reinterpret_cast<uint2*>(s_h + HPart::offset(p + 1, n)) = {tile::to_tf32(f.v[1]), tile::to_tf32(f.v[3])};
    }
  };
  typename Out::DFactors d_factors;
  Out::load_d(io, h, head_rows.headdim, p_base, d_factors);
  const int y_cols = kTiled && head_rows.headdim - p_base < kP ? static_cast<int>(head_rows.headdim - p_base) : kP;

  wait_previous_kernel();  // the segment entries (and, before them, chunk_cumsum's g and dt)
  load_segment_entry<false, kN>(a, b, seg, h, head_rows, for_each_state);
  state_to_smem();
  int32_t seq_prev = a.scan.resets && step_begin > 0 ? seq_of(a, b, step_begin * kTokens - 1) : 0;
  const int64_t chunk_end = (step_end + kStepsPerChunk - 1) / kStepsPerChunk;
  CarriedStates carried(a, step_begin / kStepsPerChunk);
  if (threadIdx.x == 0 && step_begin < step_end) stage_step(step_begin, 0);
  for (int64_t s = step_begin; s < step_end; ++s) {
    const int64_t i = s - step_begin;
    const int buf = static_cast<int>(i % kStages);
    if constexpr (kCarry)
      if (s % kStepsPerChunk == 0) carried.enter(a, h, s / kStepsPerChunk, chunk_end, head_rows, for_each_state);
    // h (written at the end of the previous step) is visible to the async proxy, and every thread
    // is done with step s - 1, so its buffers take step s + 1; then step s's tiles arrive.
    wg::proxy_fence();
    __syncthreads();
    if (threadIdx.x == 0 && s + 1 < step_end) stage_step(s + 1, static_cast<int>((i + 1) % kStages));
    tile::tma::wait(&s_full[buf], static_cast<uint32_t>(i / kStages) & 1);

    const float *x = sX(buf), *B = sB(buf) + wgi * BCPart::kElems, *C = sC(buf) + wgi * BCPart::kElems;
    const float *g = s_g(buf), *dt = s_dt(buf);
    const int32_t* seq = s_seq(buf);
    const float g_base = s % kStepsPerChunk ? g[-1] : 0.0f;
    const int64_t t0 = s * kTokens;
    const int rows = static_cast<int>(geo.seqlen - t0 < kTokens ? geo.seqlen - t0 : kTokens);
    const StateJump jump(g, seq, kTokens, seq_prev, g_base);
#pragma unroll
    for (auto& f : acc_h)
#pragma unroll
      for (float& v : f.v) v *= jump.decay;  // before any wgmma of this step is in flight

    // S = C B^T and Y = C h^T over the warpgroup's columns, while X^T and the jump weights are made.
    tile::FragC acc_s[Out::kSTiles], acc_y[Out::kYTiles];
    wg::pin(acc_h);
    wg::fence();
    Mma::ss<false>(acc_s, wg::k_major<BCPart>(C, 0, 0), wg::k_major<BCPart>(B, 0, 0));
    Mma::ss<false>(acc_y, wg::k_major<BCPart>(C, 0, 0), wg::k_major<HPart>(s_h, 0, 0));
#pragma unroll
    for (int ks = 1; ks < 64 / 8; ++ks) {
      const uint64_t c_desc = wg::k_major<BCPart>(C, 0, ks);
      Mma::ss(acc_s, c_desc, wg::k_major<BCPart>(B, 0, ks));
      Mma::ss(acc_y, c_desc, wg::k_major<HPart>(s_h, 0, ks));
    }
    wg::commit();
    transpose_x<XTile, XtTile, Shape::kThreads>(s_xt, x);
    jump.weights<kTokens, Shape::kThreads>(g, dt, seq, s_w);
    wg::proxy_fence();  // X^T, written by the threads, is read by wgmma after the barrier
    wg::wait<0>();
    wg::pin(acc_s), wg::pin(acc_y);
    // X^T and the weights are visible, and every warp's share of C h^T is done: s_h may be
    // rewritten. The same barrier tells whether the mask may take the weights as a factor.
    const bool exact_mask =
        __syncthreads_or(threadIdx.x < kTokens && !(fabsf(g[threadIdx.x] - jump.g_last) < Out::kFactoredRange)) ||
        a.scan.resets;

    // h^T += (w B)^T X (the warpgroup's block), then Y += P X with P = the masked, decayed S.
    tile::FragA wb[kTokens / 8];
#pragma unroll
    for (int ks = 0; ks < kTokens / 8; ++ks) wb[ks] = wb_operand<BCPart>(B, s_w, m0, ks);
    wg::pin(acc_h), wg::pin(wb);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kTokens / 8; ++ks) Mma::rs(acc_h, wb[ks], wg::k_major<XtTile>(s_xt, 0, ks));
    wg::commit();
    if (exact_mask) Out::decay_and_mask(acc_s, acc_y, g, dt, seq, seq_prev, m0, a.scan.resets, g_base);
    else Out::decay_and_mask_factored(acc_s, acc_y, g, s_w, m0, jump.g_last, g_base);
    tile::FragA pa[kTokens / 8];
#pragma unroll
    for (int ks = 0; ks < kTokens / 8; ++ks) pa[ks] = p_operand(acc_s[ks]);
    wg::pin(acc_y), wg::pin(pa);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kTokens / 8; ++ks) Mma::rs(acc_y, pa[ks], wg::k_major<XtTile>(s_xt, 0, ks));
    wg::commit();
    wg::wait<1>();  // h to shared memory (read by step s + 1 after its barrier) while P X runs
    wg::pin(acc_h);
    state_to_smem();
    wg::wait<0>();
    wg::pin(acc_y);
    seq_prev = jump.seq_last;
    if constexpr (kGroups > 1) wg::sum_into_first(acc_y, s_partial, wgi);  // y = the warpgroups' parts
    if (wgi == 0) {
      float* y = static_cast<float*>(io.y) + b * io.y_stride.s0 + t0 * io.y_stride.s1 + h * io.y_stride.s2 + p_base;
      Out::finish_y(
          acc_y, io, b, h, t0, rows, [&](int r, int p) { return x + XTile::offset(r, p); }, m0, d_factors, y_cols,
          [&](int r, int p, const float(&v)[2]) { tile::store_pair(y + r * io.y_stride.s1 + p, io.y_pairs, v); },
          p_base);
    }
  }
  store_segment_exit<false, kN>(a, b, seg, h, head_rows, for_each_state);
#else
  __trap();  // built without sm_90a code: the host never selects this kernel (sm90_kernels_built)
#endif
}

}  // namespace mamba2ssd::cuda
