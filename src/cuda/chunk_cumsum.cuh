// Kernel 1, chunk_cumsum: per token and head, dt after preprocessing and the within-chunk inclusive
// cumulative sum g of A * dt (times log2(e), so later kernels use exp2). With packed sequences it
// also writes each token's sequence id. One block per (chunk, kCumsumHeads heads, batch row): dt is
// [batch, token, head], so the block reads the chunk's rows of its heads (adjacent heads: coalesced
// loads, all issued before any is used), turns them into per-head runs through shared memory, and
// each warp scans one head's chunk and stores it in 16-byte pieces ([batch, head, token]).
#pragma once

#include "cuda/kernel_args.cuh"

namespace mamba2ssd::cuda {

constexpr int kCumsumHeads = 8;  // heads of a chunk_cumsum block, one warp each
constexpr int kCumsumThreads = kCumsumHeads * 32;

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

template <int kChunk, typename DtT>
__global__ void __launch_bounds__(kCumsumThreads) chunk_cumsum_kernel(Args a) {
  constexpr int kPerLane = kChunk / 32, kLd = kChunk + 4;  // kLd: the transposing writes hit 32 banks
  constexpr int kLoads = kChunk * kCumsumHeads / kCumsumThreads;
  __shared__ __align__(16) float s_dt[kCumsumHeads * kLd];  // [head][token]
  start_next_kernel();  // the Hopper path's next kernel sets up while this one runs, then waits
  const ForwardParams& p = a.p;
  const int64_t c = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kCumsumHeads, b = blockIdx.z;
  const int64_t t0 = c * kChunk;

  if (a.resets && blockIdx.y == 0)
    for (int i = threadIdx.x; i < kChunk; i += kCumsumThreads)
      a.ws.seq[b * a.lpad + t0 + i] = sequence_id(p, b, t0 + i < p.seqlen ? t0 + i : p.seqlen - 1);

  // Element i of the block's [token][head] rows: head i % kCumsumHeads of token i / kCumsumHeads.
  // A thread keeps one head (kCumsumThreads is a multiple of kCumsumHeads) and takes every
  // (kCumsumThreads / kCumsumHeads)-th token.
  static_assert(kCumsumThreads % kCumsumHeads == 0, "a thread's elements share a head");
  const int hh = threadIdx.x % kCumsumHeads, tt = threadIdx.x / kCumsumHeads;
  constexpr int kTokenStride = kCumsumThreads / kCumsumHeads;
  const bool head_in = h0 + hh < p.nheads;
  const DtT* dt = static_cast<const DtT*>(p.dt) + b * p.dt_stride.s0 + (h0 + hh) * p.dt_stride.s2;
  float raw[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int64_t t = t0 + tt + k * kTokenStride;
    raw[k] = 0.0f;
    if (head_in && t < p.seqlen) raw[k] = tile::to_float(dt[t * p.dt_stride.s1]);
  }
  const float bias = head_in && p.dt_bias ? p.dt_bias[h0 + hh] : 0.0f;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int64_t t = t0 + tt + k * kTokenStride;
    s_dt[hh * kLd + tt + k * kTokenStride] =
        head_in && t < p.seqlen ? preprocess_dt(raw[k], bias, p.dt_softplus, p.dt_min, p.dt_max)
                                : 0.0f;  // padding: no effect
  }
  __syncthreads();

  const int64_t h = h0 + tile::warp_id();
  if (h >= p.nheads) return;
  const int lane = tile::lane_id();
  const float* d = s_dt + tile::warp_id() * kLd + kPerLane * lane;
  const float a_log2 = p.A[h] * kLog2e;
  float g[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) g[e] = (e ? g[e - 1] : 0.0f) + a_log2 * d[e];
  float incl = g[kPerLane - 1];  // the lanes' totals, scanned
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const float u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  const float before = incl - g[kPerLane - 1];
  float* out_dt = a.ws.dt + token_index(a, b, h, t0 + kPerLane * lane);
  float* out_g = a.ws.g + token_index(a, b, h, t0 + kPerLane * lane);
  static_assert(kPerLane == 2 || kPerLane == 4, "chunks of 64 or 128 tokens");
  if constexpr (kPerLane == 4) {
    *reinterpret_cast<float4*>(out_dt) = {d[0], d[1], d[2], d[3]};
    *reinterpret_cast<float4*>(out_g) = {before + g[0], before + g[1], before + g[2], before + g[3]};
  } else {
    *reinterpret_cast<float2*>(out_dt) = {d[0], d[1]};
    *reinterpret_cast<float2*>(out_g) = {before + g[0], before + g[1]};
  }
}

}  // namespace mamba2ssd::cuda
