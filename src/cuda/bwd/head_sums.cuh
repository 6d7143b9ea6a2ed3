// Backward kernel 4: dA, ddt_bias and dD, the sums over batch rows and chunks of the per-chunk parts
// chunk_grads_sm80 left, one block per head. Each thread sums a fixed stride of (batch row, chunk)
// pairs, then the block adds the threads' sums in a fixed tree: the same bits every run.
#pragma once

#include "cuda/bwd/args.cuh"

namespace mamba2ssd::cuda {

constexpr int kHeadSumsThreads = 256;

// The block's sum of f(k) for k in [0, n), in a fixed order. s_tmp: kHeadSumsThreads floats.
template <typename F>
__device__ float block_sum(int64_t n, F f, float* s_tmp) {
  float s = 0.0f;
  for (int64_t k = threadIdx.x; k < n; k += kHeadSumsThreads) s += f(k);
  s_tmp[threadIdx.x] = s;
  __syncthreads();
  for (int o = kHeadSumsThreads / 2; o > 0; o /= 2) {
    if (threadIdx.x < o) s_tmp[threadIdx.x] += s_tmp[threadIdx.x + o];
    __syncthreads();
  }
  const float total = s_tmp[0];
  __syncthreads();  // s_tmp is reused by the next sum
  return total;
}

__global__ void __launch_bounds__(kHeadSumsThreads) head_sums_kernel(BwdArgs a) {
  __shared__ float s_tmp[kHeadSumsThreads];
  const Geometry& geo = a.geo;
  const int64_t h = blockIdx.x, nc = a.scan.nchunks, items = geo.batch * nc;
  auto part = [&](const float* base, int64_t k) {  // k = b * nc + c
    return base[chunk_head(a, k / nc, k % nc, h)];
  };
  const float dA = block_sum(items, [&](int64_t k) { return part(a.work.dA, k); }, s_tmp);
  const float dbias = block_sum(items, [&](int64_t k) { return part(a.work.ddt_bias, k); }, s_tmp);
  if (threadIdx.x == 0) {
    a.grad.dA[h] = dA;
    if (a.grad.ddt_bias) a.grad.ddt_bias[h] = dbias;
  }
  if (!a.grad.dD) return;
  const int64_t P = geo.headdim;
  if (a.io.D_layout == DLayout::kPerHeadDim) {
    for (int64_t pi = 0; pi < P; ++pi) {
      const float s = block_sum(items, [&](int64_t k) { return a.work.dD[chunk_head(a, k / nc, k % nc, h) * P + pi]; }, s_tmp);
      if (threadIdx.x == 0) a.grad.dD[h * P + pi] = s;
    }
  } else {
    const float s = block_sum(items * P, [&](int64_t k) {
      return a.work.dD[chunk_head(a, k / P / nc, k / P % nc, h) * P + k % P];
    }, s_tmp);
    if (threadIdx.x == 0) a.grad.dD[h] = s;
  }
}

}  // namespace mamba2ssd::cuda
