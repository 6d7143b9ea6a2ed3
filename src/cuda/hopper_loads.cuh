// A chunk's inputs in shared memory for the Hopper kernels, by TMA: one thread issues the copies
// (the x and B tiles, the C tile if asked, and the chunk's g, dt and, with resets, sequence ids),
// every thread waits for the stage's barrier. Tokens past the sequence arrive as zero rows.
#pragma once

#include "cuda/kernel_args.cuh"
#include "cuda/tile/tma.cuh"

namespace mamba2ssd::cuda {

// The step both Hopper kernels walk in: 64 tokens (half a chunk of the plan, whose segments and
// cumsum stay in 128-token chunks), one warpgroup, and a stage's scalars laid out as 4 values of g
// before the step (its lead: a step in a chunk's second half measures its decays from g[-1]), then
// the step's g, dt and sequence ids.
struct HopperStep {
  static constexpr int kChunk = 64;       // tokens per step
  static constexpr int kPlanChunk = 128;  // the chunk of the plan
  static constexpr int kSteps = kPlanChunk / kChunk;  // steps per chunk of the plan
  static constexpr int kHeadDim = 64, kThreads = 128;
  static constexpr int kScalars = 4 + 3 * kChunk;  // floats per stage
  // Stage k's g (after its lead), dt and seq, in the scalar area that starts at `scalars`.
  static __device__ __forceinline__ float* g(float* scalars, int k) { return scalars + k * kScalars + 4; }
  static __device__ __forceinline__ float* dt(float* scalars, int k) { return g(scalars, k) + kChunk; }
  static __device__ __forceinline__ int32_t* seq(float* scalars, int k) {
    return reinterpret_cast<int32_t*>(dt(scalars, k) + kChunk);
  }
};

// Where one stage of a chunk's inputs lives.
template <typename T>
struct ChunkStage {
  T *x, *B, *C;  // SwizzledTiles [token][p], [token][n], [token][n] (C unused when not loaded)
  float *g, *dt;
  int32_t* seq;  // zeros, written once, when the call has no resets
  uint64_t* full;  // completes when everything above has landed
};

// Before the first load, with every thread: the stages' barriers (one arrival each: the issuing
// thread's) and, when the call has no resets, the sequence ids of every stage, zeros that no load
// overwrites. s_seq(k) is stage k's [kChunk] ids. Ends with a barrier.
template <int kStages, int kChunk, int kThreads, typename SeqOf>
__device__ __forceinline__ void prepare_stages(const Args& a, uint64_t* full, SeqOf s_seq) {
  if (threadIdx.x == 0) {
    for (int k = 0; k < kStages; ++k) tile::tma::barrier_init(&full[k], 1);
    tile::tma::barrier_init_fence();
  }
  if (!a.resets)
    for (int i = threadIdx.x; i < kStages * kChunk; i += kThreads) s_seq(i / kChunk)[i % kChunk] = 0;
  __syncthreads();
}

// Tokens [t0, t0 + kRows) of head h (x, g, dt) and group grp (B, C: kN columns from n0) of batch
// row b. With g_lead, the 4 values of g before t0 land in front of s.g as well (s.g[-1] is g of
// token t0 - 1).
template <typename T, int kRows, int kHeadDim, int kN, bool kWithC>
__device__ __forceinline__ void issue_chunk_loads(const Args& a, int64_t b, int64_t h, int64_t grp, int64_t t0,
                                                  const ChunkStage<T>& s, bool g_lead = false, int n0 = 0) {
  namespace tma = tile::tma;
  constexpr uint32_t kTileBytes = kRows * (kHeadDim + (kWithC ? 2 : 1) * kN) * 2, kScalarBytes = kRows * 4;
  const int lead = g_lead ? 4 : 0, t = static_cast<int>(t0);
  tma::arrive_expect_bytes(s.full, kTileBytes + (a.resets ? 3 : 2) * kScalarBytes + 4 * lead);
  tma::load_swizzled_tile<kRows, kHeadDim>(s.x, &a.x_map, t, static_cast<int>(h), static_cast<int>(b), s.full);
  tma::load_swizzled_tile<kRows, kN>(s.B, &a.B_map, t, static_cast<int>(grp), static_cast<int>(b), s.full, n0);
  if (kWithC)
    tma::load_swizzled_tile<kRows, kN>(s.C, &a.C_map, t, static_cast<int>(grp), static_cast<int>(b), s.full, n0);
  tma::load_bytes(s.g - lead, a.ws.g + token_index(a, b, h, t0) - lead, kScalarBytes + 4 * lead, s.full);
  tma::load_bytes(s.dt, a.ws.dt + token_index(a, b, h, t0), kScalarBytes, s.full);
  if (a.resets) tma::load_bytes(s.seq, a.ws.seq + b * a.lpad + t0, kScalarBytes, s.full);
}

}  // namespace mamba2ssd::cuda
