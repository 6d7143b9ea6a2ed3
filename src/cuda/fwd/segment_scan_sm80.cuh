// The fused path (sm_80 and newer, mma.sync): one block per (segment of chunks, 64 head-dim
// columns, head, batch row) walks its chunks with the state on chip. Per chunk, with h the state entering it:
//   Y      = exp2(g) * (C h^T) + ((C B^T) * exp2(g_i - g_j) * dt_j * [j <= i]) X + D X   (OutputSteps)
//   h_next = exp2(g_last) h + X^T (B * w)                                                 (StateJump)
// h lives in fp32 registers (as mma accumulators) and, rounded to the input type, in shared memory
// as the operand of C h^T. The next chunk's X, B, C, dt and g load while this one computes.
// Covers every head dim (in tiles of kWalkPCols = 64 columns, FwdPlan::ptiles) and state sizes up to
// 128 (larger ones take the sm_90 kernels where they apply, else the three-kernel path).
//
// Two kernels share the walk (segment_walk_sm80):
// - segment_ends_sm80_kernel, the first pass: the walk over each segment but the last, from a zero
//   state, with the state jump only (no outputs, C not loaded); stores the segment's end state and
//   its decay (the product of its chunks' decays) for segment_entries.
// - segment_scan_sm80_kernel, the main pass: every segment from its entry state, y and the final
//   state (and, with varlen states, the state entering each chunk in which a sequence ends:
//   CarriedStates).
#pragma once

#include "cuda/fwd/args.cuh"
#include "cuda/fwd/output_steps.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct SegmentScanShape {
  static constexpr int kChunk = 128, kHeadDim = kWalkPCols;  // a block's head-dim columns
  static constexpr int kWarps = kChunk / 16, kThreads = kWarps * 32;
  static constexpr int kStages = sizeof(T) == 4 ? 1 : 2;  // fp32 tiles fit shared memory once
  static constexpr int kLdN = kN + (sizeof(T) == 4 ? 4 : 8);  // C, B, h rows
  static constexpr int kLdX = kHeadDim + 8;                   // X rows
  struct Tiles {  // one stage's tiles (C unused by the first pass)
    alignas(16) T X[kChunk][kLdX];
    alignas(16) T B[kChunk][kLdN];
    alignas(16) T C[kChunk][kLdN];
  };
  struct Scalars {  // one stage's chunk scalars
    alignas(16) float g[kChunk];
    float dt[kChunk];
    int32_t seq[kChunk];
  };
  struct SharedStorage {
    Tiles tiles[kStages];
    alignas(16) T H[kHeadDim][kLdN];  // the state entering the chunk, as an mma operand
    Scalars scalars[kStages];
    float w[kChunk];  // token weights of the state jump
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  // The state [P x N] as mma tiles: warp w holds m-tile (w % 4) and kStateTiles n-tiles from
  // (w / 4) * kStateTiles.
  static constexpr int kStateMTiles = kHeadDim / 16;
  static constexpr int kStateTiles = kN / 8 / (kWarps / kStateMTiles);
  static_assert(kSmemBytes <= 227 * 1024, "fused tiles exceed shared memory");
};

// The walk of one block over its segment (kSegmentEnds: the first pass's form; kCarry: the main
// pass with varlen states, which stores carried states; k3xTf32: fp32 products as 3xTF32; kTiled:
// the block's 64 head-dim columns from walk_block's p_base, for every head dim but 64).
template <typename T, int kN, bool kSegmentEnds, bool kCarry, bool k3xTf32, bool kTiled>
__device__ __forceinline__ void segment_walk_sm80(const FwdArgs& a) {
  using Shape = SegmentScanShape<T, kN>;
  using Out = OutputSteps<T, Shape::kChunk, Shape::kHeadDim, k3xTf32>;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kLdN = Shape::kLdN, kLdX = Shape::kLdX;
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const WalkBlock block = kTiled ? walk_block(a, blockIdx.x) : WalkBlock{blockIdx.x, 0};
  const int64_t seg = block.seg, h = blockIdx.y, b = blockIdx.z;
  const int p_base = kTiled ? block.p_base : 0;
  const HeadRows<kTiled> head_rows{p_base, kTiled ? geo.headdim : kP};
  const int64_t grp = geo.group_of(h);
  // The block's columns of x (the rest of the tile: zeros).
  const int p_cols = kTiled ? static_cast<int>(geo.headdim - p_base < kP ? geo.headdim - p_base : kP) : kP;
  const int64_t c_begin = seg * a.seg.chunks;
  const int64_t c_end = c_begin + a.seg.chunks < a.scan.nchunks ? c_begin + a.seg.chunks : a.scan.nchunks;

  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Shape::SharedStorage*>(smem_bytes);
  T* sH = smem.H[0];
  auto sX = [&](int buf) { return smem.tiles[buf].X[0]; };
  auto sB = [&](int buf) { return smem.tiles[buf].B[0]; };
  auto sC = [&](int buf) { return smem.tiles[buf].C[0]; };

  auto stage_chunk = [&](int64_t c, int buf) {
    const int64_t t0 = c * kChunk;
    const int rows = static_cast<int>(geo.seqlen - t0 < kChunk ? geo.seqlen - t0 : kChunk);
    const int n = static_cast<int>(geo.dstate);
    tile::stage<T, kChunk, kP, Shape::kThreads>(
        sX(buf), kLdX,
        {static_cast<const T*>(io.x) + b * io.x_stride.s0 + t0 * io.x_stride.s1 + h * io.x_stride.s2 + p_base,
         io.x_stride.s1, rows, p_cols, io.x_aligned});
    tile::stage<T, kChunk, kN, Shape::kThreads>(
        sB(buf), kLdN,
        {static_cast<const T*>(io.B) + b * io.B_stride.s0 + t0 * io.B_stride.s1 + grp * io.B_stride.s2,
         io.B_stride.s1, rows, n, io.B_aligned});
    if (!kSegmentEnds)
      tile::stage<T, kChunk, kN, Shape::kThreads>(
          sC(buf), kLdN,
          {static_cast<const T*>(io.C) + b * io.C_stride.s0 + t0 * io.C_stride.s1 + grp * io.C_stride.s2,
           io.C_stride.s1, rows, n, io.C_aligned});
    typename Shape::Scalars& sc = smem.scalars[buf];
    stage_chunk_scalars<kChunk, Shape::kThreads>(a, b, h, c, sc.g, sc.dt, sc.seq);
    tile::cp_async_commit();
  };

  // This warp's tiles of the state: rows 16 * sm .., columns 8 * (sn0 + nt) ..
  const int warp = tile::warp_id(), m0 = warp * 16;
  const int sm = warp % Shape::kStateMTiles, sn0 = warp / Shape::kStateMTiles * Shape::kStateTiles;
  tile::FragC acc_h[Shape::kStateTiles];
  auto for_each_state = [&](auto&& f) {  // f(value, p index, n index)
#pragma unroll
    for (int nt = 0; nt < Shape::kStateTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(acc_h[nt].v[e], sm * 16 + tile::frag_row(e), (sn0 + nt) * 8 + tile::frag_col(e));
  };
  auto state_to_smem = [&] {
    for_each_state([&](float v, int pi, int ni) { sH[pi * kLdN + ni] = tile::from_float<T>(v); });
  };

  load_segment_entry<kSegmentEnds, kN>(a, b, seg, h, head_rows, for_each_state);
  if (!kSegmentEnds) state_to_smem();
  int32_t seq_prev = a.scan.resets && c_begin > 0 ? seq_of(a, b, c_begin * kChunk - 1) : 0;
  CarriedStates carried(a, c_begin);  // (without kCarry never used, and its load goes away)

  float seg_decay_total = 1.0f;  // kSegmentEnds: the decay across the segment
  bool seg_cut = false;          // kSegmentEnds: a sequence starts in the segment
  if (Shape::kStages == 2) stage_chunk(c_begin, 0);
  for (int64_t c = c_begin; c < c_end; ++c) {
    if constexpr (kCarry) carried.enter(a, h, c, c_end, head_rows, for_each_state);
    const int buf = Shape::kStages == 2 ? (c - c_begin) & 1 : 0;
    if (Shape::kStages == 1) {
      stage_chunk(c, 0);
      tile::cp_async_wait<0>();
    } else if (c + 1 < c_end) {
      stage_chunk(c + 1, buf ^ 1);  // its buffer was last read before the previous iteration's barrier
      tile::cp_async_wait<1>();
    } else {
      tile::cp_async_wait<0>();
    }
    __syncthreads();
    const T *x = sX(buf), *B = sB(buf), *C = sC(buf);
    const float *g = smem.scalars[buf].g, *dt = smem.scalars[buf].dt;
    const int32_t* seq = smem.scalars[buf].seq;
    const int64_t t0 = c * kChunk;
    const int rows = static_cast<int>(geo.seqlen - t0 < kChunk ? geo.seqlen - t0 : kChunk);
    const StateJump jump(g, seq, kChunk, seq_prev);
    jump.weights<kChunk, Shape::kThreads>(g, dt, seq, smem.w);
    __syncthreads();

    // The chunk's outputs, from the state entering it.
    if (!kSegmentEnds) {
      tile::FragC acc_s[Out::kSTiles], acc_y[Out::kYTiles];
      Out::template accumulate<kN>(acc_s, acc_y, C, B, sH, kLdN, m0);
      Out::decay_and_mask(acc_s, acc_y, g, dt, seq, seq_prev, m0, a.scan.resets);
      Out::add_intra(acc_y, acc_s, x, kLdX, m0);
      Out::store_y(acc_y, io, b, h, t0, rows, [&](int i, int pi) { return x + i * kLdX + pi; }, m0, head_rows.headdim,
                   p_base);
    }

    // The state jump across the chunk: h = decay h + X^T (B * w).
    seg_cut = seg_cut || jump.seq_last != seq_prev;  // (where the jump's decay is 0)
    seq_prev = jump.seq_last;
    seg_decay_total *= jump.decay;
#pragma unroll
    for (auto& f : acc_h)
#pragma unroll
      for (float& v : f.v) v *= jump.decay;
    add_state_jump<T, kChunk, Shape::kStateTiles, 2, k3xTf32>(acc_h, x, kLdX, B, kLdN, smem.w, sm * 16, sn0 * 8);
    __syncthreads();  // every warp is done with sH and this stage
    if (!kSegmentEnds) state_to_smem();
  }

  store_segment_exit<kSegmentEnds, kN>(a, b, seg, h, head_rows, for_each_state);
  if (kSegmentEnds && threadIdx.x == 0 && p_base == 0) seg_decay(a, b, seg, h) = seg_cut ? kSegmentCut : seg_decay_total;
}

// kTiled: any head dim but 64, as column tiles (HeadRows; a kernel of its own, so that head dim 64
// compiles to the code it had before the tiles, which cost it 3% on the H200).
template <typename T, int kN, bool k3xTf32, bool kTiled>
__global__ void __launch_bounds__(SegmentScanShape<T, kN>::kThreads) segment_ends_sm80_kernel(FwdArgs a) {
  segment_walk_sm80<T, kN, true, false, k3xTf32, kTiled>(a);
}

// kCarry: with varlen states (a kernel of its own, so that the plain walk's code stays as it was).
template <typename T, int kN, bool kCarry, bool k3xTf32, bool kTiled>
__global__ void __launch_bounds__(SegmentScanShape<T, kN>::kThreads) segment_scan_sm80_kernel(FwdArgs a) {
  segment_walk_sm80<T, kN, false, kCarry, k3xTf32, kTiled>(a);
}

}  // namespace mamba2ssd::cuda
