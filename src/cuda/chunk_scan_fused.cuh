// The fused path's main kernel: one block per (segment of chunks, head, batch row) walks its chunks
// with the state on chip. Per chunk, with h the state entering it:
//   Y      = exp2(g) * (C h^T) + ((C B^T) * exp2(g_i - g_j) * dt_j * [j <= i]) X + D X   (ChunkOutput)
//   h_next = exp2(g_last) h + X^T (B * w)                                                 (ChunkJump)
// h lives in fp32 registers (as mma accumulators) and, rounded to the input type, in shared memory
// as the operand of C h^T. The next chunk's X, B, C, dt and g load while this one computes.
// Covers head dim 64 and state sizes up to 128 (other shapes take the Hopper kernels where they
// apply, else the three-kernel path).
//
// kSegmentEnds: the fused path's first pass. The same walk over each segment but the last, from a
// zero state, with the state jump only (no outputs, C not loaded); stores the segment's end state
// and its decay (the product of its chunks' decays).
#pragma once

#include "cuda/chunk_output.cuh"
#include "cuda/kernel_args.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct FusedShape {
  static constexpr int kChunk = 128, kHeadDim = 64;
  static constexpr int kWarps = kChunk / 16, kThreads = kWarps * 32;
  static constexpr int kStages = sizeof(T) == 4 ? 1 : 2;  // fp32 tiles fit shared memory once
  static constexpr int kLdN = kN + (sizeof(T) == 4 ? 4 : 8);  // C, B, h rows
  static constexpr int kLdX = kHeadDim + 8;                   // X rows
  static constexpr int kXElems = kChunk * kLdX, kBCElems = kChunk * kLdN;
  static constexpr int kStageElems = kXElems + 2 * kBCElems;
  static constexpr int kHElems = kHeadDim * kLdN;
  static constexpr int kSmemBytes =
      (kStages * kStageElems + kHElems) * sizeof(T) + kStages * kChunk * (2 * sizeof(float) + sizeof(int32_t)) +
      kChunk * sizeof(float);
  // The state [P x N] as mma tiles: warp w holds m-tile (w % 4) and kStateTiles n-tiles from
  // (w / 4) * kStateTiles.
  static constexpr int kStateMTiles = kHeadDim / 16;
  static constexpr int kStateTiles = kN / 8 / (kWarps / kStateMTiles);
  static_assert(kSmemBytes <= 227 * 1024, "fused tiles exceed shared memory");
};

template <typename T, int kN, bool kSegmentEnds>
__global__ void __launch_bounds__(FusedShape<T, kN>::kThreads) chunk_scan_fused_kernel(Args a) {
  using Shape = FusedShape<T, kN>;
  using M = tile::Mma<T>;
  using Out = ChunkOutput<T, Shape::kChunk, Shape::kHeadDim>;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kLdN = Shape::kLdN, kLdX = Shape::kLdX;
  const ForwardParams& p = a.p;
  const int64_t seg = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t grp = h / (p.nheads / p.ngroups);
  const int64_t c_begin = seg * a.seg_chunks;
  const int64_t c_end = c_begin + a.seg_chunks < a.nchunks ? c_begin + a.seg_chunks : a.nchunks;

  extern __shared__ __align__(16) unsigned char smem[];
  T* s_tiles = reinterpret_cast<T*>(smem);           // [stages] of X [chunk][kLdX], B and C [chunk][kLdN]
  T* sH = s_tiles + Shape::kStages * Shape::kStageElems;  // [P][kLdN] the state entering the chunk
  float* s_scalars = reinterpret_cast<float*>(sH + Shape::kHElems);  // [stages] of g, dt, seq [chunk]
  auto sX = [&](int buf) { return s_tiles + buf * Shape::kStageElems; };
  auto sB = [&](int buf) { return sX(buf) + Shape::kXElems; };
  auto sC = [&](int buf) { return sB(buf) + Shape::kBCElems; };
  auto s_g = [&](int buf) { return s_scalars + buf * 3 * kChunk; };
  auto s_dt = [&](int buf) { return s_g(buf) + kChunk; };
  auto s_seq = [&](int buf) { return reinterpret_cast<int32_t*>(s_dt(buf) + kChunk); };
  float* s_w = s_scalars + Shape::kStages * 3 * kChunk;  // [chunk] token weights of the state jump

  auto stage_chunk = [&](int64_t c, int buf) {
    const int64_t t0 = c * kChunk;
    const int rows = static_cast<int>(p.seqlen - t0 < kChunk ? p.seqlen - t0 : kChunk);
    const int n = static_cast<int>(p.dstate);
    tile::stage<T, kChunk, kP, Shape::kThreads>(
        sX(buf), kLdX,
        {static_cast<const T*>(p.x) + b * p.x_stride.s0 + t0 * p.x_stride.s1 + h * p.x_stride.s2, p.x_stride.s1,
         rows, kP, a.x_aligned});
    tile::stage<T, kChunk, kN, Shape::kThreads>(
        sB(buf), kLdN,
        {static_cast<const T*>(p.B) + b * p.B_stride.s0 + t0 * p.B_stride.s1 + grp * p.B_stride.s2, p.B_stride.s1,
         rows, n, a.B_aligned});
    if (!kSegmentEnds)
      tile::stage<T, kChunk, kN, Shape::kThreads>(
          sC(buf), kLdN,
          {static_cast<const T*>(p.C) + b * p.C_stride.s0 + t0 * p.C_stride.s1 + grp * p.C_stride.s2,
           p.C_stride.s1, rows, n, a.C_aligned});
    stage_chunk_scalars<kChunk, Shape::kThreads>(a, b, h, c, s_g(buf), s_dt(buf), s_seq(buf));
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

  load_segment_entry<kSegmentEnds, kN>(a, b, seg, h, for_each_state);
  if (!kSegmentEnds) state_to_smem();
  int32_t seq_prev = a.resets && c_begin > 0 ? seq_of(a, b, c_begin * kChunk - 1) : 0;

  float seg_decay_total = 1.0f;  // kSegmentEnds: the decay across the segment
  if (Shape::kStages == 2) stage_chunk(c_begin, 0);
  for (int64_t c = c_begin; c < c_end; ++c) {
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
    const float *g = s_g(buf), *dt = s_dt(buf);
    const int32_t* seq = s_seq(buf);
    const int64_t t0 = c * kChunk;
    const int rows = static_cast<int>(p.seqlen - t0 < kChunk ? p.seqlen - t0 : kChunk);
    const ChunkJump jump(g, seq, kChunk, seq_prev);
    jump.weights<kChunk, Shape::kThreads>(g, dt, seq, s_w);
    __syncthreads();

    // The chunk's outputs, from the state entering it.
    if (!kSegmentEnds) {
      tile::FragC acc_s[Out::kSTiles], acc_y[Out::kYTiles];
      Out::template accumulate<kN>(acc_s, acc_y, C, B, sH, kLdN, m0);
      Out::decay_and_mask(acc_s, acc_y, g, dt, seq, seq_prev, m0, a.resets);
      Out::add_intra(acc_y, acc_s, x, kLdX, m0);
      Out::store_y(acc_y, a, b, h, t0, rows, [&](int i, int pi) { return x + i * kLdX + pi; }, m0);
    }

    // The state jump across the chunk: h = decay h + X^T (B * w).
    seq_prev = jump.seq_last;
    seg_decay_total *= jump.decay;
#pragma unroll
    for (auto& f : acc_h)
#pragma unroll
      for (float& v : f.v) v *= jump.decay;
#pragma unroll 2
    for (int k0 = 0; k0 < kChunk; k0 += M::kK) {
      tile::FragA xw = M::load_a_trans(x, kLdX, sm * 16, k0);  // X^T: [p][token], times w per token
      M::scale_a_cols(xw, [&](int k) { return s_w[k0 + k]; });
#pragma unroll
      for (int nt = 0; nt < Shape::kStateTiles; ++nt)
        M::mma(acc_h[nt], xw, M::load_b_trans(B, kLdN, (sn0 + nt) * 8, k0));  // B: [token][n]
    }
    __syncthreads();  // every warp is done with sH and this stage
    if (!kSegmentEnds) state_to_smem();
  }

  store_segment_exit<kSegmentEnds, kN>(a, b, seg, h, for_each_state);
  if (kSegmentEnds && threadIdx.x == 0) seg_decay(a, b, seg, h) = seg_decay_total;
}

}  // namespace mamba2ssd::cuda
