// The fused walk on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a): the same
// algorithm as chunk_scan_fused.cuh (one block per (segment of chunks, head, batch row), the state
// on chip), with every chunk product a wgmma that reads its operands from shared memory:
//   S      = C B^T                       warpgroup g: rows 64g .. 64g + 63 (all columns: a branch
//                                        per warpgroup around wgmma makes ptxas serialize them)
//   Y      = C h^T                       h from shared memory, rounded to the input type
//   Y     += (S * exp2(g_i - g_j) dt_j * mask) X      S from registers, X read transposed
//   h_next = exp2(g_last) h + X^T (w B)  warpgroup g: state columns kN/2 g ..; X^T w from registers
// A chunk's tiles load (TMA, 128-byte swizzled tiles) while earlier chunks compute; h sits in fp32
// registers and, for C h^T, in one of two shared buffers (chunk c reads one, writes the other), so
// a chunk needs two barriers. 16-bit inputs, head dim 64, state size up to kN (64 or 128). The
// segments' end states come from segment_ends_hopper.cuh.
#pragma once

#include "cuda/chunk_output.cuh"
#include "cuda/hopper_loads.cuh"
#include "cuda/kernel_args.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct HopperShape {
  static constexpr int kChunk = 128, kHeadDim = 64, kThreads = 256;  // two warpgroups
  static constexpr int kHalfN = kN / 2;                              // state columns per warpgroup
  static constexpr int kStages = 2;  // chunks in flight
  using XTile = tile::wg::SwizzledTile<kChunk, kHeadDim>;  // [token][p], by TMA
  using BCTile = tile::wg::SwizzledTile<kChunk, kN>;       // [token][n], B and C, by TMA
  using HTile = tile::wg::CoreTile<kHeadDim, kN>;          // [p][n], written by the threads
  static constexpr int kStageElems = XTile::kElems + 2 * BCTile::kElems;  // X, B, C
  static constexpr int kHBuffers = 2;
  static constexpr int kScalarBytes = 3 * kChunk * 4;  // g, dt, seq of a chunk
  static constexpr int kSmemBytes = (kStages * kStageElems + XTile::kElems + kHBuffers * HTile::kElems) * 2 +
                                    kStages * kScalarBytes + kChunk * static_cast<int>(sizeof(float)) +
                                    kStages * 8 +  // the stages' barriers
                                    1024;          // to align the tiles to 1024 bytes
  static_assert(kSmemBytes <= 227 * 1024, "Hopper tiles exceed shared memory");
};

// 217 to 235 registers with no spills (ptxas -v): the accumulators alone take 160 (S 64, Y 32,
// h 32, the X^T w operands 32); there is little margin for more state per thread.
template <typename T, int kN>
__global__ void __launch_bounds__(HopperShape<T, kN>::kThreads, 1)
    chunk_scan_hopper_kernel(const __grid_constant__ Args a) {
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  using Shape = HopperShape<T, kN>;
  using XTile = typename Shape::XTile;
  using BCTile = typename Shape::BCTile;
  using HTile = typename Shape::HTile;
  using Out = ChunkOutput<T, Shape::kChunk, Shape::kHeadDim>;
  constexpr int kChunk = Shape::kChunk, kP = Shape::kHeadDim, kHalfN = Shape::kHalfN, kStages = Shape::kStages;
  const ForwardParams& p = a.p;
  const int64_t seg = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t grp = h / (p.nheads / p.ngroups);
  const int64_t c_begin = seg * a.seg_chunks;
  const int64_t c_end = c_begin + a.seg_chunks < a.nchunks ? c_begin + a.seg_chunks : a.nchunks;

  extern __shared__ __align__(128) unsigned char hopper_smem[];  // TMA boxes land 128-byte aligned
  T* s_tiles = tile::tma::align_1024<T>(hopper_smem);  // [stages] of X, B, C; then h [2]
  auto sX = [&](int buf) { return s_tiles + buf * Shape::kStageElems; };
  auto sB = [&](int buf) { return sX(buf) + XTile::kElems; };
  auto sC = [&](int buf) { return sB(buf) + BCTile::kElems; };
  T* s_y = s_tiles + kStages * Shape::kStageElems;  // a chunk's y on its way out (TMA store), as X
  auto sH = [&](int buf) { return s_y + XTile::kElems + buf * HTile::kElems; };
  float* s_scalars = reinterpret_cast<float*>(sH(Shape::kHBuffers));  // [stages] of g, dt, seq [chunk]
  auto s_g = [&](int buf) { return s_scalars + buf * 3 * kChunk; };
  auto s_dt = [&](int buf) { return s_g(buf) + kChunk; };
  auto s_seq = [&](int buf) { return reinterpret_cast<int32_t*>(s_dt(buf) + kChunk); };
  float* s_w = s_scalars + kStages * 3 * kChunk;  // [chunk] token weights of the state jump
  uint64_t* s_full = reinterpret_cast<uint64_t*>(s_w + kChunk);  // [stages]

  // Chunk c's loads into buffer buf, issued by thread 0.
  auto stage_chunk = [&](int64_t c, int buf) {
    issue_chunk_loads<T, kChunk, kP, kN, true>(
        a, b, h, grp, c, {sX(buf), sB(buf), sC(buf), s_g(buf), s_dt(buf), s_seq(buf), &s_full[buf]});
  };
  // Chunk c's y from s_y to global memory (rows past the sequence are not written), by thread 0
  // after a proxy fence and a barrier.
  auto store_y_tile = [&](int64_t c) {
    tile::tma::store_4d(&a.y_map, 0, static_cast<int>(h), static_cast<int>(c * kChunk), static_cast<int>(b), s_y);
  };
  prepare_stages<kStages, kChunk, Shape::kThreads>(a, s_full, s_seq);

  // Warpgroup g owns chunk rows 64g .. (S, Y) and state columns kHalfN g .. (all 64 rows of p);
  // warp w of the group holds 16 of those rows.
  const int group = threadIdx.x / 128, warp = tile::warp_id() % 4;
  const int m0 = 64 * group + 16 * warp, p0 = 16 * warp, n0 = kHalfN * group;
  tile::FragC acc_h[kHalfN / 8];
  auto for_each_state = [&](auto&& f) {  // f(value, p index, n index)
#pragma unroll
    for (int j = 0; j < kHalfN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(acc_h[j].v[e], p0 + tile::frag_row(e), n0 + 8 * j + tile::frag_col(e));
  };
  // h rounded to T as the operand of C h^T (as the other paths do; with fp16 inputs an |h| above
  // 65504 becomes inf).
  auto state_to_smem = [&](T* dst) {
#pragma unroll
    for (int j = 0; j < kHalfN / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // columns 2q, 2q + 1 as one 4-byte store
        const int pi = p0 + tile::frag_row(2 * half), ni = n0 + 8 * j + tile::frag_col(0);
        *reinterpret_cast<uint32_t*>(dst + HTile::offset(pi, ni)) =
            tile::pack2<T>(acc_h[j].v[2 * half], acc_h[j].v[2 * half + 1]);
      }
  };

  load_segment_entry<false>(a, b, seg, h, for_each_state);
  state_to_smem(sH(0));
  int32_t seq_prev = a.resets && c_begin > 0 ? seq_of(a, b, c_begin * kChunk - 1) : 0;

  if (threadIdx.x == 0)
    for (int k = 0; k + 1 < kStages && c_begin + k < c_end; ++k) stage_chunk(c_begin + k, k);
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int64_t i = c - c_begin;
    const int buf = static_cast<int>(i % kStages), hbuf = static_cast<int>(i & 1);
    // h (written at the end of the previous chunk) is visible to wgmma, and every thread is done
    // with chunk c - 1, so its buffers take chunk c + kStages - 1; then chunk c's tiles arrive.
    wg::proxy_fence();
    __syncthreads();
    const int64_t ahead = c + kStages - 1;
    if (threadIdx.x == 0) {
      if (ahead < c_end) stage_chunk(ahead, static_cast<int>((ahead - c_begin) % kStages));
      if (c > c_begin) store_y_tile(c - 1);
    }
    tile::tma::wait(&s_full[buf], static_cast<uint32_t>(i / kStages) & 1);

    const T *x = sX(buf), *B = sB(buf), *C = sC(buf);
    const float *g = s_g(buf), *dt = s_dt(buf);
    const int32_t* seq = s_seq(buf);
    const int64_t t0 = c * kChunk;
    const int rows = static_cast<int>(p.seqlen - t0 < kChunk ? p.seqlen - t0 : kChunk);
    const ChunkJump jump(g, seq, kChunk, seq_prev);
#pragma unroll
    for (auto& f : acc_h)
#pragma unroll
      for (float& v : f.v) v *= jump.decay;  // before any wgmma of this chunk is in flight

    // S = C B^T and Y = C h^T, asynchronously while the jump weights are computed.
    tile::FragC acc_s[Out::kSTiles], acc_y[Out::kYTiles];
    wg::pin(acc_s), wg::pin(acc_y), wg::pin(acc_h);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kN / 16; ++ks) {
      const uint64_t c_desc = wg::k_major<BCTile>(C, 64 * group, ks);
      wg::Mma<T, kChunk>::template ss<0, 0>(acc_s, c_desc, wg::k_major<BCTile>(B, 0, ks));
      wg::Mma<T, kP>::template ss<0, 0>(acc_y, c_desc, wg::k_major<HTile>(sH(hbuf), 0, ks));
    }
    wg::commit();
    jump.weights<kChunk, Shape::kThreads>(g, dt, seq, s_w);
    if (threadIdx.x == 0) tile::tma::wait_stores_read();  // s_y is free for this chunk's y
    __syncthreads();

    // h += X^T (w B) (h already decayed): A = (X^T scaled by w per token) from registers, B = B read
    // MN-major.
    tile::FragA xw[kChunk / 16];
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks) {
      xw[ks] = wg::load_a_trans<XTile>(x, p0, 16 * ks);
      tile::Mma<T>::scale_a_cols(xw[ks], [&](int k) { return s_w[16 * ks + k]; });
    }
    wg::pin(acc_h), wg::pin(xw);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks)
      wg::Mma<T, kHalfN>::template rs<1>(acc_h, xw[ks], wg::mn_major<BCTile>(B, n0, ks));
    wg::commit();

    // Y += P X with P = the masked, decayed S (registers) and X read MN-major.
    wg::wait<1>();
    wg::pin(acc_s), wg::pin(acc_y);
    Out::decay_and_mask(acc_s, acc_y, g, dt, seq, seq_prev, m0, a.resets);
    tile::FragA pa[kChunk / 16];
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks) pa[ks] = tile::a_from_accum<T>(acc_s, ks);
    wg::pin(acc_y), wg::pin(pa);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks)
      wg::Mma<T, kP>::template rs<1>(acc_y, pa[ks], wg::mn_major<XTile>(x, 0, ks));
    wg::commit();
    wg::wait<0>();
    wg::pin(acc_h), wg::pin(acc_y);
    seq_prev = jump.seq_last;
    Out::finish_y(acc_y, a, b, h, t0, rows, [&](int i, int pi) { return x + XTile::offset(i, pi); }, m0,
                  [&](int i, int pi, const float(&v)[2]) {
                    *reinterpret_cast<uint32_t*>(s_y + XTile::offset(i, pi)) = tile::pack2<T>(v[0], v[1]);
                  });
    state_to_smem(sH(hbuf ^ 1));  // read by chunk c + 1 after its barrier
  }

  wg::proxy_fence();  // the last chunk's y
  __syncthreads();
  if (threadIdx.x == 0) {
    if (c_end > c_begin) store_y_tile(c_end - 1);
    tile::tma::wait_stores();
  }
  store_segment_exit<false>(a, b, seg, h, for_each_state);
#else
  __trap();  // built without sm_90a code: the host never selects this kernel (hopper_kernels_built)
#endif
}

}  // namespace mamba2ssd::cuda
