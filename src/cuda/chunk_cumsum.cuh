// Kernel 1, chunk_cumsum: per token and head, dt after preprocessing and the within-chunk inclusive
// cumulative sum g of A * dt (times log2(e), so later kernels use exp2). With packed sequences it
// also writes each token's sequence id. One warp per (chunk, head, batch row), kChunk / 32
// consecutive tokens per lane (one 8- or 16-byte store of each output), 8 chunks per block: a
// block per token would leave this kernel bound by launching and retiring thousands of blocks.
#pragma once

#include <type_traits>

#include "cuda/kernel_args.cuh"

namespace mamba2ssd::cuda {

constexpr int kCumsumWarps = 8;  // chunks per block

// Sequence id of token t: seq_idx, or the index s with cu_seqlens[s] <= t < cu_seqlens[s + 1].
__device__ __forceinline__ int32_t sequence_id(const ForwardParams& p, int64_t b, int64_t t) {
  if (p.seq_idx) return p.seq_idx[b * p.seq_idx_stride.s0 + t * p.seq_idx_stride.s1];
  int64_t lo = 0, hi = p.nseqs - 1;  // largest s in [0, S-1] with cu_seqlens[s] <= t
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (p.cu_seqlens[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return static_cast<int32_t>(lo);
}

template <int kChunk>
__global__ void __launch_bounds__(32 * kCumsumWarps) chunk_cumsum_kernel(Args a) {
  constexpr int kPer = kChunk / 32;  // tokens per lane
  static_assert(kPer == 2 || kPer == 4, "a lane's tokens move as one float2 or float4");
  using Vec = std::conditional_t<kPer == 4, float4, float2>;
  start_next_kernel();  // the Hopper path's next kernel sets up while this one runs, then waits
  const ForwardParams& p = a.p;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCumsumWarps + tile::warp_id();
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (c >= a.nchunks) return;
  const int lane = tile::lane_id();
  const int64_t t0 = c * kChunk + lane * kPer;  // the lane's first token

  // The lane's raw dt, all loads in flight at once (one dtype switch outside them).
  float d[kPer];
  auto load_raw = [&](auto zero) {
    using D = decltype(zero);
    const D* dt = static_cast<const D*>(p.dt) + b * p.dt_stride.s0 + h * p.dt_stride.s2;
#pragma unroll
    for (int k = 0; k < kPer; ++k) d[k] = t0 + k < p.seqlen ? tile::to_float(dt[(t0 + k) * p.dt_stride.s1]) : 0.0f;
  };
  switch (p.dt_dtype) {
    case DType::kF16: load_raw(__half{}); break;
    case DType::kBF16: load_raw(__nv_bfloat16{}); break;
    default: load_raw(float{}); break;
  }
  float g[kPer];
  const float bias = p.dt_bias ? p.dt_bias[h] : 0.0f, a_log2 = p.A[h] * kLog2e;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t t = t0 + k;
    d[k] = t < p.seqlen ? preprocess_dt(d[k], bias, p.dt_softplus, p.dt_min, p.dt_max) : 0.0f;
    g[k] = a_log2 * d[k] + (k > 0 ? g[k - 1] : 0.0f);
    if (a.resets && h == 0) a.ws.seq[b * a.lpad + t] = sequence_id(p, b, t < p.seqlen ? t : p.seqlen - 1);
  }
  // The lanes before this one: an inclusive scan of the lanes' totals, less this lane's own.
  float before = g[kPer - 1];
  for (int delta = 1; delta < 32; delta *= 2) {
    const float u = __shfl_up_sync(0xffffffffu, before, delta);
    if (lane >= delta) before += u;
  }
  before -= g[kPer - 1];
#pragma unroll
  for (int k = 0; k < kPer; ++k) g[k] += before;
  *reinterpret_cast<Vec*>(a.ws.dt + token_index(a, b, h, t0)) = *reinterpret_cast<const Vec*>(d);
  *reinterpret_cast<Vec*>(a.ws.g + token_index(a, b, h, t0)) = *reinterpret_cast<const Vec*>(g);
}

}  // namespace mamba2ssd::cuda
