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
// (g_base = g before the step, nonzero in a chunk's second half), and S sums those.
//
// One block per (segment but the last, head, batch row), one warpgroup, two blocks per
// multiprocessor; or (kHeads = 2) one block per two heads of one group, a warpgroup each, that
// load B once for both (the pass moves little else: a third fewer bytes), one block per
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

template <typename T, int kN, int kHeads>
struct SegmentEndsShape : HopperStep {
  static constexpr int kCols = kN < 128 ? kN : 128;  // state columns of a block
  static constexpr int kParts = kN / kCols;          // blocks per segment
  static constexpr int kThreads = kHeads * HopperStep::kThreads;
  static constexpr int kBlocksPerSm = kHeads == 1 ? kHopperBlocksPerSm : 1;
  // Loads go out two steps ahead (kStages - 2): of the other two buffers, one is read by the
  // previous step's wgmma (still in flight) and one is this step's.
  static constexpr int kStages = 4;
  using XTile = tile::wg::SwizzledTile<kChunk, kHeadDim>;  // [token][p], by TMA
  using BTile = tile::wg::SwizzledTile<kChunk, kCols>;     // [token][n], by TMA
  static constexpr int kStageElems = kHeads * XTile::kElems + BTile::kElems;  // the heads' X, then B
  static constexpr int kSmemBytes = kStages * (kStageElems * 2 + kHeads * kScalars * 4 + 8)  // and a barrier
                                    + 1024;  // to align the tiles to 1024 bytes
  static_assert(kBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "segment-end blocks exceed shared memory");
};

template <typename T, int kN, int kHeads>
__global__ void __launch_bounds__(SegmentEndsShape<T, kN, kHeads>::kThreads,
                                  SegmentEndsShape<T, kN, kHeads>::kBlocksPerSm)
    segment_ends_hopper_kernel(const __grid_constant__ Args a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  using Shape = SegmentEndsShape<T, kN, kHeads>;
  using XTile = typename Shape::XTile;
  using BTile = typename Shape::BTile;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kStages = Shape::kStages;
  constexpr int kSteps = Shape::kSteps, kCols = Shape::kCols;
  constexpr int kKSteps = kChunk / 16;                // wgmma k steps (tokens) per step
  const ForwardParams& p = a.p;
  const int64_t seg = blockIdx.x / Shape::kParts, b = blockIdx.z;
  const int n0 = static_cast<int>(blockIdx.x % Shape::kParts) * kCols;  // the block's state columns
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kHeads;        // the block's first head
  const int64_t grp = h0 / (p.nheads / p.ngroups);                      // the host pairs heads in a group
  // Warpgroup wgi takes head h0 + wgi (written as the constant 0 for one head, so that ptxas keeps
  // the tiles' addresses uniform).
  const int wgi = kHeads > 1 ? static_cast<int>(threadIdx.x) / HopperStep::kThreads : 0;
  const int64_t h = h0 + wgi;
  const int wg_thread = static_cast<int>(threadIdx.x) % HopperStep::kThreads;
  const int nsteps = static_cast<int>(a.seg_chunks) * kSteps;  // never the last segment: all tokens real
  const int64_t s_last = (seg + 1) * nsteps - 1;

  extern __shared__ __align__(128) unsigned char hopper_smem[];
  T* s_tiles = tile::tma::align_1024<T>(hopper_smem);
  auto sX = [&](int buf, int hd) { return s_tiles + buf * Shape::kStageElems + hd * XTile::kElems; };
  auto sB = [&](int buf) { return sX(buf, kHeads); };
  float* s_scalars = reinterpret_cast<float*>(s_tiles + kStages * Shape::kStageElems);  // [stage][head]
  auto s_g = [&](int buf, int hd) { return Shape::g(s_scalars, buf * kHeads + hd); };
  auto s_dt = [&](int buf, int hd) { return Shape::dt(s_scalars, buf * kHeads + hd); };
  auto s_seq = [&](int area) { return Shape::seq(s_scalars, area); };  // area = buf * kHeads + head
  uint64_t* s_full = reinterpret_cast<uint64_t*>(s_scalars + kStages * kHeads * Shape::kScalars);  // [stages]

  // The i-th step of the walk is s_last - i, in buffer i % kStages; thread 0 issues its loads, B
  // once for the block's heads (a second-half step brings g's lead along).
  auto stage_step = [&](int i) {
    const int buf = i % kStages;
    const int64_t s = s_last - i;
    const bool lead = s % kSteps != 0;
    tile::tma::arrive_expect_bytes(&s_full[buf], kHeads * head_bytes<kChunk, kP>(a, lead) +
                                                     group_bytes<kChunk, kCols, false>());
    for (int hd = 0; hd < kHeads; ++hd)
      issue_head_loads<T, kChunk, kP>(a, b, h0 + hd, s * kChunk,
                                      {sX(buf, hd), nullptr, nullptr, s_g(buf, hd), s_dt(buf, hd),
                                       s_seq(buf * kHeads + hd), &s_full[buf]},
                                      lead);
    issue_group_loads<T, kChunk, kCols, false>(a, b, grp, s * kChunk,
                                               {nullptr, sB(buf), nullptr, nullptr, nullptr, nullptr, &s_full[buf]}, n0);
  };
  prepare_stages<kStages, kChunk, Shape::kThreads, decltype(s_seq), kStages * kHeads>(a, s_full, s_seq);
  wait_previous_kernel();  // chunk_cumsum's g and dt
  start_next_kernel();

  const int p0 = 16 * (tile::warp_id() % 4);
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

    const float* g = s_g(buf, wgi);
    const float* dt = s_dt(buf, wgi);
    const int32_t* seq = s_seq(buf * kHeads + wgi);  // the same ids for every head
    const float g_last = g[kChunk - 1], g_base = s % kSteps ? g[-1] : 0.0f;
    const int32_t seq_last = seq[kChunk - 1];
    // A sequence that starts in the step after this one cuts this step and all earlier ones off.
    if (i > 0 && seq_after != seq_last) break;
    T* x = sX(buf, wgi);
    wg::scale_rows<T, XTile, kChunk, kP, HopperStep::kThreads>(
        x, [&](int j) { return seq[j] == seq_last ? dt[j] * fast_exp2(g_last - g[j] + suffix) : 0.0f; }, wg_thread);
    wg::proxy_fence();
    __syncthreads();
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
      wg::Mma<T, kCols>::template ss<1, 1>(acc, wg::mn_major<XTile>(x, 0, ks), wg::mn_major<BTile>(sB(buf), 0, ks));
    wg::commit();
    suffix += g_last - g_base;
    seq_after = seq_last;
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
