// The fused path's first pass on Hopper: each segment's end state from a zero state, as one
// reduction over the segment's tokens instead of a walk that decays the state chunk by chunk:
//
//   end = sum_c (prod_{c' > c} D_c') X_c^T (w_c B_c) = sum_j x_j^T B_j w'_j,
//   w'_j = dt_j exp2(g_last(c) - g_j + S_c),  S_c = sum of g_last(c') over the later chunks c'
//
// (D_c' = exp2(g_last(c')) the chunk decays; zero weight for tokens of another sequence than their
// chunk's last, and for every token before a chunk boundary that starts a sequence). With the
// decays folded into the token weights, consecutive chunks' products only accumulate: the wgmma
// of one chunk runs while the next chunk's operands are built. The walk goes backwards, so S_c is
// a running sum, and it ends early at a sequence start (nothing before it reaches the end). The
// kernel does this per 64-token step rather than per chunk: a step's decay is g_last - g_base
// (g_base = g before the step, nonzero in a chunk's second half), and S sums those. It leaves
// segment_pass the segment's decay, exp2(S) over the whole segment (zero if a sequence starts in
// it).
//
// One block per (segment but the last, head, batch row), one warpgroup, two blocks per
// multiprocessor; the walk goes in steps of 64 tokens (half a chunk of the plan: a step in a
// chunk's second half measures its decays from g before it). Both operands come from shared
// memory, read MN-major: A = X^T with X's rows scaled by w' in place, B = B. (With A from
// registers, ptxas reuses the registers of the wgmma in flight for the next step's A and
// serializes the two.) 16-bit inputs, head dim 64, state size up to kN (64, 128 or 256); with 256,
// two blocks per segment, each with 128 of the state columns (kCols).
#pragma once

#include "cuda/hopper_loads.cuh"
#include "cuda/kernel_args.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct SegmentEndsShape : HopperStep {
  static constexpr int kCols = kN < 128 ? kN : 128;  // state columns of a block
  static constexpr int kParts = kN / kCols;          // blocks per segment
  // Loads go out two steps ahead (kStages - 2): of the other two buffers, one is read by the
  // previous step's wgmma (still in flight) and one is this step's.
  static constexpr int kStages = 4;
  using XTile = tile::wg::SwizzledTile<kChunk, kHeadDim>;  // [token][p], by TMA
  using BTile = tile::wg::SwizzledTile<kChunk, kCols>;     // [token][n], by TMA
  static constexpr int kStageElems = XTile::kElems + BTile::kElems;
  static constexpr int kSmemBytes = kStages * (kStageElems * 2 + kScalars * 4 + 8)  // and a barrier
                                    + 1024;  // to align the tiles to 1024 bytes
  static_assert(kHopperBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "segment-end blocks exceed shared memory");
};

template <typename T, int kN>
__global__ void __launch_bounds__(SegmentEndsShape<T, kN>::kThreads, kHopperBlocksPerSm)
    segment_ends_hopper_kernel(const __grid_constant__ Args a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  using Shape = SegmentEndsShape<T, kN>;
  using XTile = typename Shape::XTile;
  using BTile = typename Shape::BTile;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kStages = Shape::kStages;
  constexpr int kSteps = Shape::kSteps, kCols = Shape::kCols;
  constexpr int kKSteps = kChunk / 16;                // wgmma k steps (tokens) per step
  const ForwardParams& p = a.p;
  const int64_t seg = blockIdx.x / Shape::kParts, h = blockIdx.y, b = blockIdx.z;
  const int n0 = static_cast<int>(blockIdx.x % Shape::kParts) * kCols;  // the block's state columns
  const int64_t grp = h / (p.nheads / p.ngroups);
  const int nsteps = static_cast<int>(a.seg_chunks) * kSteps;  // never the last segment: all tokens real
  const int64_t s_last = (seg + 1) * nsteps - 1;

  extern __shared__ __align__(128) unsigned char hopper_smem[];
  T* s_tiles = tile::tma::align_1024<T>(hopper_smem);
  auto sX = [&](int buf) { return s_tiles + buf * Shape::kStageElems; };
  auto sB = [&](int buf) { return sX(buf) + XTile::kElems; };
  float* s_scalars = reinterpret_cast<float*>(s_tiles + kStages * Shape::kStageElems);
  auto s_g = [&](int buf) { return Shape::g(s_scalars, buf); };
  auto s_dt = [&](int buf) { return Shape::dt(s_scalars, buf); };
  auto s_seq = [&](int buf) { return Shape::seq(s_scalars, buf); };
  uint64_t* s_full = reinterpret_cast<uint64_t*>(s_scalars + kStages * Shape::kScalars);  // [stages]

  // The i-th step of the walk is s_last - i, in buffer i % kStages; thread 0 issues its loads (a
  // second-half step brings g's lead along).
  auto stage_step = [&](int i) {
    const int buf = i % kStages;
    const int64_t s = s_last - i;
    issue_chunk_loads<T, kChunk, kP, kCols, false>(
        a, b, h, grp, s * kChunk, {sX(buf), sB(buf), nullptr, s_g(buf), s_dt(buf), s_seq(buf), &s_full[buf]},
        s % kSteps != 0, n0);
  };
  prepare_stages<kStages, kChunk, Shape::kThreads>(a, s_full, s_seq);
  wait_previous_kernel();  // chunk_cumsum's g and dt
  start_next_kernel();

  const int p0 = 16 * tile::warp_id();
  tile::FragC acc[kCols / 8];

  wg::pin(acc);  // zeroed before the first wgmma
  int issued = 0;  // steps whose loads thread 0 has issued
  if (threadIdx.x == 0)
    for (; issued < kStages - 2 && issued < nsteps; ++issued) stage_step(issued);
  float suffix = 0.0f;         // log2 decay from the end of this step to the end of the segment
  int32_t seq_after = 0;       // last sequence id of the step after this one
  int i = 0;
  for (; i < nsteps; ++i) {
    const int buf = i % kStages;
    const int64_t s = s_last - i;
    wg::wait<1>();  // step i - 2's wgmma: its buffers are free
    __syncthreads();
    if (threadIdx.x == 0 && issued < nsteps) stage_step(issued++);
    tile::tma::wait(&s_full[buf], static_cast<uint32_t>(i / kStages) & 1);

    const float* g = s_g(buf);
    const float* dt = s_dt(buf);
    const int32_t* seq = s_seq(buf);
    const float g_last = g[kChunk - 1], g_base = s % kSteps ? g[-1] : 0.0f;
    const int32_t seq_last = seq[kChunk - 1];
    // A sequence that starts in the step after this one cuts this step and all earlier ones off.
    if (i > 0 && seq_after != seq_last) break;
    wg::scale_rows<T, XTile, kChunk, kP, Shape::kThreads>(sX(buf), [&](int j) {
      return seq[j] == seq_last ? dt[j] * fast_exp2(g_last - g[j] + suffix) : 0.0f;
    });
    wg::proxy_fence();
    __syncthreads();
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
      wg::Mma<T, kCols>::template ss<1, 1>(acc, wg::mn_major<XTile>(sX(buf), 0, ks), wg::mn_major<BTile>(sB(buf), 0, ks));
    wg::commit();
    suffix += g_last - g_base;
    seq_after = seq_last;
  }
  // The segment's decay: none if a sequence starts in it (the walk stopped early, or the token
  // before the segment belongs to another sequence than its first step's last token).
  if (threadIdx.x == 0 && n0 == 0) {
    const int64_t t_first = (s_last - nsteps + 1) * kChunk;
    const bool cut = i < nsteps || (a.resets && seq_after != (t_first > 0 ? seq_of(a, b, t_first - 1) : 0));
    seg_decay(a, b, seg, h) = cut ? 0.0f : exp2f(suffix);
  }
  wg::wait<0>();
  wg::pin(acc);
  // After an early end, no copy may land once the block is gone. (Step i's phase has completed
  // already; waiting on it again returns at once.)
  if (threadIdx.x == 0)
    for (; i < issued; ++i) tile::tma::wait(&s_full[i % kStages], static_cast<uint32_t>(i / kStages) & 1);

  float* out = seg_state<kN>(a.ws.seg_ends, a, b, seg, h) + n0;  // all columns (B's padding ones are zero)
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int pi = p0 + tile::frag_row(2 * half), ni = 8 * j + tile::frag_col(0);
      *reinterpret_cast<float2*>(out + pi * kN + ni) = {acc[j].v[2 * half], acc[j].v[2 * half + 1]};
    }
#else
  __trap();  // built without sm_90a code: the host never selects this kernel (hopper_kernels_built)
#endif
}

}  // namespace mamba2ssd::cuda
