// A step's inputs in shared memory for the sm_90 kernels, by TMA: one thread issues the copies
// (the x and B tiles, the C tile if asked, and the step's g, dt and, with resets, sequence ids),
// every thread waits for the stage's barrier. Tokens past the sequence arrive as zero rows.
#pragma once

#include "cuda/fwd/args.cuh"
#include "cuda/tile/tma.cuh"

namespace mamba2ssd::cuda {

// Both sm_90 kernels walk in steps of 64 tokens (half a chunk of the plan, whose segments and
// cumsum stay in 128-token chunks) with one warpgroup: a step in a chunk's second half measures its
// decays from g of the token before it.
struct Sm90Step {
  static constexpr int kTokens = 64;                      // tokens per step
  static constexpr int kChunk = 128;                      // the chunk of the plan
  static constexpr int kStepsPerChunk = kChunk / kTokens;
  static constexpr int kHeadDim = kWalkPCols, kThreads = 128;  // kHeadDim: a block's head-dim columns
  // A step's scalars: g with a lead of the kGLead values before the step, then dt and sequence ids.
  static constexpr int kGLead = 4;  // one 16-byte bulk copy unit
  struct Scalars {
    alignas(16) float g_with_lead[kGLead + kTokens];
    float dt[kTokens];
    int32_t seq[kTokens];  // zeros, written once, when the call has no resets
    __device__ float* g() { return g_with_lead + kGLead; }  // g()[-1] is g of the token before the step
  };
  // The same, for stages laid out as floats from `scalars` (stage k's Scalars at k * kScalarFloats).
  static constexpr int kScalarFloats = sizeof(Scalars) / 4;
  static __device__ __forceinline__ float* g(float* scalars, int k) { return scalars + k * kScalarFloats + kGLead; }
  static __device__ __forceinline__ float* dt(float* scalars, int k) { return g(scalars, k) + kTokens; }
  static __device__ __forceinline__ int32_t* seq(float* scalars, int k) {
    return reinterpret_cast<int32_t*>(dt(scalars, k) + kTokens);
  }
};

// Where one stage of a step's inputs lives.
template <typename T>
struct StepStage {
  T *x, *B, *C;  // SwizzledTiles [token][p], [token][n], [token][n] (C unused when not loaded)
  float *g, *dt;
  int32_t* seq;    // zeros, written once, when the call has no resets
  uint64_t* full;  // completes when everything above has landed
};

// Before the first load, with every thread: the stages' barriers (one arrival each: the issuing
// thread's) and, when the call has no resets, the sequence ids of every stage, zeros that no load
// overwrites. seq_of(k) is stage k's [kTokens] ids. Ends with a barrier.
template <int kStages, int kThreads, typename SeqOf>
__device__ __forceinline__ void prepare_stages(const ScanArgs& a, uint64_t* full, SeqOf seq_of) {
  constexpr int kTokens = Sm90Step::kTokens;
  if (threadIdx.x == 0) {
    for (int k = 0; k < kStages; ++k) tile::tma::barrier_init(&full[k], 1);
    tile::tma::barrier_init_fence();
  }
  if (!a.scan.resets)
    for (int i = threadIdx.x; i < kStages * kTokens; i += kThreads) seq_of(i / kTokens)[i % kTokens] = 0;
  __syncthreads();
}

// Tokens [t0, t0 + kRows) of head h (x: kHeadDim columns from p_base; g, dt) and group grp (B, C:
// kN columns from n0) of batch row b. Columns past the head dim or the state size arrive as zeros.
// With g_lead, the kGLead values of g before t0 land in front of s.g as well (s.g[-1] is g of token
// t0 - 1). tile_t0 >= 0: x, B and C from that token instead (the packed prefill's chunks, whose
// scalars are in padded coordinates t0 but whose tokens are the caller's rows).
//
// In two parts, so that a kernel can issue a step's tiles before wait_previous_kernel: x, B and C
// are the caller's, complete before chunk_cumsum (never a programmatic launch) began, while g, dt
// and the sequence ids are chunk_cumsum's. The tiles' part expects the bytes of both.
template <typename T, int kRows, int kHeadDim, int kN, bool kWithC>
__device__ __forceinline__ void issue_step_tiles(const Sm90FwdArgs& a, int64_t b, int64_t h, int64_t grp, int64_t t0,
                                                 int p_base, const StepStage<T>& s, bool g_lead = false, int n0 = 0,
                                                 int64_t tile_t0 = -1) {
  namespace tma = tile::tma;
  constexpr uint32_t kTileBytes = kRows * (kHeadDim + (kWithC ? 2 : 1) * kN) * sizeof(T), kScalarBytes = kRows * 4;
  constexpr uint32_t kLeadBytes = Sm90Step::kGLead * 4;
  const int t = static_cast<int>(tile_t0 >= 0 ? tile_t0 : t0);
  tma::arrive_expect_bytes(s.full, kTileBytes + (a.scan.resets ? 3 : 2) * kScalarBytes + (g_lead ? kLeadBytes : 0));
  tma::load_swizzled_tile<kRows, kHeadDim, sizeof(T)>(s.x, &a.x_map, t, static_cast<int>(h), static_cast<int>(b),
                                                      s.full, p_base);
  tma::load_swizzled_tile<kRows, kN, sizeof(T)>(s.B, &a.B_map, t, static_cast<int>(grp), static_cast<int>(b), s.full,
                                                n0);
  if (kWithC)
    tma::load_swizzled_tile<kRows, kN, sizeof(T)>(s.C, &a.C_map, t, static_cast<int>(grp), static_cast<int>(b),
                                                  s.full, n0);
}
template <typename T, int kRows>
__device__ __forceinline__ void issue_step_scalars(const Sm90FwdArgs& a, int64_t b, int64_t h, int64_t t0,
                                                   const StepStage<T>& s, bool g_lead = false) {
  namespace tma = tile::tma;
  constexpr uint32_t kScalarBytes = kRows * 4;
  const int lead = g_lead ? Sm90Step::kGLead : 0;
  tma::load_bytes(s.g - lead, a.scan.g + token_index(a, b, h, t0) - lead, kScalarBytes + 4 * lead, s.full);
  tma::load_bytes(s.dt, a.scan.dt + token_index(a, b, h, t0), kScalarBytes, s.full);
  if (a.scan.resets) tma::load_bytes(s.seq, a.scan.seq + b * a.scan.lpad + t0, kScalarBytes, s.full);
}
template <typename T, int kRows, int kHeadDim, int kN, bool kWithC>
__device__ __forceinline__ void issue_step_loads(const Sm90FwdArgs& a, int64_t b, int64_t h, int64_t grp, int64_t t0,
                                                 int p_base, const StepStage<T>& s, bool g_lead = false, int n0 = 0,
                                                 int64_t tile_t0 = -1) {
  issue_step_tiles<T, kRows, kHeadDim, kN, kWithC>(a, b, h, grp, t0, p_base, s, g_lead, n0, tile_t0);
  issue_step_scalars<T, kRows>(a, b, h, t0, s, g_lead);
}

}  // namespace mamba2ssd::cuda
