// Kernel 1, chunk_cumsum: per token and head, dt after preprocessing and the within-chunk inclusive
// cumulative sum g of A * dt (times log2(e), so later kernels use exp2). With packed sequences it
// also writes each token's sequence id. One block per (chunk, head, batch row), one thread per token.
#pragma once

#include "cuda/kernel_args.cuh"

namespace mamba2ssd::cuda {

// Inclusive prefix sum over the block (kThreads a multiple of 32, at most 1024).
template <int kThreads>
__device__ float block_inclusive_scan(float v, float* s_warp_totals) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = 1; d < 32; d *= 2) {
    const float u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += u;
  }
  if (lane == 31) s_warp_totals[warp] = v;
  __syncthreads();
  float before = 0.0f;
  for (int w = 0; w < warp; ++w) before += s_warp_totals[w];
  __syncthreads();  // the totals are reused by the next scan
  return v + before;
}

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
__global__ void __launch_bounds__(kChunk) chunk_cumsum_kernel(Args a) {
  __shared__ float s_totals[kChunk / 32];
  start_next_kernel();  // the Hopper path's next kernel sets up while this one runs, then waits
  const ForwardParams& p = a.p;
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t t = c * kChunk + threadIdx.x;
  const bool valid = t < p.seqlen;

  if (a.resets && h == 0) a.ws.seq[b * a.lpad + t] = sequence_id(p, b, valid ? t : p.seqlen - 1);

  float d = 0.0f;
  if (valid) {
    const float raw = load_as_float(p.dt, b * p.dt_stride.s0 + t * p.dt_stride.s1 + h * p.dt_stride.s2, p.dt_dtype);
    d = preprocess_dt(raw, p.dt_bias ? p.dt_bias[h] : 0.0f, p.dt_softplus, p.dt_min, p.dt_max);
  }
  const float g = block_inclusive_scan<kChunk>(p.A[h] * d * kLog2e, s_totals);
  a.ws.dt[token_index(a, b, h, t)] = d;
  a.ws.g[token_index(a, b, h, t)] = g;
}

}  // namespace mamba2ssd::cuda
