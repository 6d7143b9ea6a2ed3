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
// a running sum, and it ends early at a sequence start (nothing before it reaches the end).
//
// One block per (segment but the last, head, batch row), two warpgroups: warpgroup g accumulates
// state columns kN/2 g .. of all 64 rows p. Both operands come from shared memory, read MN-major:
// A = X^T with X's rows scaled by w' in place, B = B. (With A from registers, ptxas reuses the
// registers of the wgmma in flight for the next chunk's A and serializes the two.) 16-bit inputs,
// head dim 64, state size up to kN (64 or 128).
#pragma once

#include "cuda/hopper_loads.cuh"
#include "cuda/kernel_args.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct SegmentEndsShape {
  static constexpr int kChunk = 128, kHeadDim = 64, kThreads = 256, kHalfN = kN / 2;
  // Loads go out two chunks ahead (kStages - 2): of the other two buffers, one is read by the
  // previous chunk's wgmma (still in flight) and one is this chunk's.
  static constexpr int kStages = 4;
  using XTile = tile::wg::SwizzledTile<kChunk, kHeadDim>;  // [token][p], by TMA
  using BTile = tile::wg::SwizzledTile<kChunk, kN>;        // [token][n], by TMA
  static constexpr int kStageElems = XTile::kElems + BTile::kElems;
  static constexpr int kScalarBytes = 3 * kChunk * 4;  // g, dt, seq
  static constexpr int kSmemBytes = kStages * (kStageElems * 2 + kScalarBytes + 8)  // and a barrier
                                    + 1024;  // to align the tiles to 1024 bytes
  static_assert(kSmemBytes <= 227 * 1024, "segment-end tiles exceed shared memory");
};

template <typename T, int kN>
__global__ void __launch_bounds__(SegmentEndsShape<T, kN>::kThreads, 1)
    segment_ends_hopper_kernel(const __grid_constant__ Args a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  using Shape = SegmentEndsShape<T, kN>;
  using XTile = typename Shape::XTile;
  using BTile = typename Shape::BTile;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kHalfN = Shape::kHalfN, kStages = Shape::kStages;
  constexpr int kSteps = kChunk / 16;  // k steps (tokens) per chunk
  const ForwardParams& p = a.p;
  const int64_t seg = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t grp = h / (p.nheads / p.ngroups);
  const int64_t c_begin = seg * a.seg_chunks, c_last = c_begin + a.seg_chunks - 1;  // never the last segment

  extern __shared__ __align__(128) unsigned char hopper_smem[];
  T* s_tiles = tile::tma::align_1024<T>(hopper_smem);
  auto sX = [&](int buf) { return s_tiles + buf * Shape::kStageElems; };
  auto sB = [&](int buf) { return sX(buf) + XTile::kElems; };
  float* s_scalars = reinterpret_cast<float*>(s_tiles + kStages * Shape::kStageElems);
  auto s_g = [&](int buf) { return s_scalars + buf * 3 * kChunk; };
  auto s_dt = [&](int buf) { return s_g(buf) + kChunk; };
  auto s_seq = [&](int buf) { return reinterpret_cast<int32_t*>(s_dt(buf) + kChunk); };
  uint64_t* s_full = reinterpret_cast<uint64_t*>(s_scalars + kStages * 3 * kChunk);  // [stages]

  // The i-th chunk of the walk is c_last - i, in buffer i % kStages; thread 0 issues its loads.
  auto stage_chunk = [&](int i) {
    const int buf = i % kStages;
    issue_chunk_loads<T, kChunk, kP, kN, false>(
        a, b, h, grp, (c_last - i) * kChunk, {sX(buf), sB(buf), nullptr, s_g(buf), s_dt(buf), s_seq(buf), &s_full[buf]});
  };
  prepare_stages<kStages, kChunk, Shape::kThreads>(a, s_full, s_seq);

  const int group = threadIdx.x / 128, warp = tile::warp_id() % 4;
  const int p0 = 16 * warp, n0 = kHalfN * group;
  tile::FragC acc[kHalfN / 8];

  wg::pin(acc);  // zeroed before the first wgmma
  const int nchunks = static_cast<int>(a.seg_chunks);
  int issued = 0;  // chunks whose loads thread 0 has issued
  if (threadIdx.x == 0)
    for (; issued < kStages - 2 && issued < nchunks; ++issued) stage_chunk(issued);
  float suffix = 0.0f;         // S: log2 decay of the chunks after this one
  int32_t seq_after = 0;       // last sequence id of the chunk after this one
  int i = 0;
  for (; i < nchunks; ++i) {
    const int buf = i % kStages;
    wg::wait<1>();  // chunk i - 2's wgmma: its buffers are free
    __syncthreads();
    if (threadIdx.x == 0 && issued < nchunks) stage_chunk(issued++);
    tile::tma::wait(&s_full[buf], static_cast<uint32_t>(i / kStages) & 1);

    const float* g = s_g(buf);
    const float* dt = s_dt(buf);
    const int32_t* seq = s_seq(buf);
    const float g_last = g[kChunk - 1];
    const int32_t seq_last = seq[kChunk - 1];
    // A sequence that starts in the chunk after this one cuts this chunk and all earlier ones off.
    if (i > 0 && seq_after != seq_last) break;
    wg::scale_rows<T, XTile, kChunk, kP, Shape::kThreads>(sX(buf), [&](int j) {
      return seq[j] == seq_last ? dt[j] * fast_exp2(g_last - g[j] + suffix) : 0.0f;
    });
    wg::proxy_fence();
    __syncthreads();
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks)
      wg::Mma<T, kHalfN>::template ss<1, 1>(acc, wg::mn_major<XTile>(sX(buf), 0, ks),
                                            wg::mn_major<BTile>(sB(buf), n0, ks));
    wg::commit();
    suffix += g_last;
    seq_after = seq_last;
  }
  wg::wait<0>();
  wg::pin(acc);
  // After an early end, no copy may land once the block is gone. (Chunk i's phase has completed
  // already; waiting on it again returns at once.)
  if (threadIdx.x == 0)
    for (; i < issued; ++i) tile::tma::wait(&s_full[i % kStages], static_cast<uint32_t>(i / kStages) & 1);

  float* out = a.ws.seg_ends + seg_index(a, b, seg, h);
#pragma unroll
  for (int j = 0; j < kHalfN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int pi = p0 + tile::frag_row(e), ni = n0 + 8 * j + tile::frag_col(e);
      if (ni < p.dstate) out[pi * p.dstate + ni] = acc[j].v[e];
    }
#else
  __trap();  // built without sm_90a code: the host never selects this kernel (hopper_kernels_built)
#endif
}

}  // namespace mamba2ssd::cuda
