// Backward kernel 4: dA, ddt_bias and dD, the sums over batch rows and chunks of the per-chunk parts
// chunk_grads_sm80 left, one block per head. Every sum runs in a fixed order (threads over a fixed
// stride of the parts, then a fixed tree), so reruns give the same bits. A block of 1024 threads:
// with few heads (8 at the headline shape) these few blocks are the whole kernel, and at 256
// threads it took 35 us there (ncu, H200 run 3 of the fourteenth session).
#pragma once

#include "cuda/bwd/args.cuh"
#include "cuda/common/grid_dependency.cuh"

namespace mamba2ssd::cuda {

constexpr int kHeadSumsThreads = 1024;

// The block's sum of f(k) for k in [0, n), in a fixed order. s_tmp: kHeadSumsThreads floats.
template <typename F>
__device__ float block_sum(int64_t n, F f, float* s_tmp) {
  float s = 0.0f;
#pragma unroll 8  // the loads go out together; the sum keeps its order
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
  wait_previous_kernel();  // the chunk kernels' partial sums
  const Geometry& geo = a.geo;
  const int64_t h = blockIdx.x, nc = a.scan.nchunks, items = geo.batch * nc;  // item k: batch row k / nc, chunk k % nc
  auto at = [&](int64_t k) { return k * geo.nheads + h; };  // chunk_head(a, k / nc, k % nc, h)
  const float dA = block_sum(items, [&](int64_t k) { return a.work.dA[at(k)]; }, s_tmp);
  const float dbias = block_sum(items, [&](int64_t k) { return a.work.ddt_bias[at(k)]; }, s_tmp);
  if (threadIdx.x == 0) {
    a.grad.dA[h] = dA;
    if (a.grad.ddt_bias) a.grad.ddt_bias[h] = dbias;
  }
  if (!a.grad.dD) return;
  // dD: thread t sums column t % P over the items t / P, t / P + lanes, ...; then the lanes of each
  // column in order. The threads past the last whole lane (the head dim need not divide the block)
  // sum nothing.
  const int P = static_cast<int>(geo.headdim), lanes = kHeadSumsThreads / P;
  const int pi = threadIdx.x % P, lane = threadIdx.x / P;
  float s = 0.0f;
  // Unrolled so that 16 loads are in flight (a thread sums items / lanes parts: 64 at the headline
  // shape, which one at a time took most of the kernel's 14 us); the sum keeps its order.
  if (lane < lanes) {
#pragma unroll 16
    for (int64_t k = lane; k < items; k += lanes) s += a.work.dD[at(k) * P + pi];
  }
  s_tmp[threadIdx.x] = s;
  __syncthreads();
  if (lane == 0)
    for (int l = 1; l < lanes; ++l) s += s_tmp[l * P + pi];
  __syncthreads();
  if (lane == 0) s_tmp[pi] = s;  // the column's sum (threadIdx.x == pi: its own slot)
  __syncthreads();
  if (a.io.D_layout == DLayout::kPerHeadDim) {
    if (lane == 0) a.grad.dD[h * P + pi] = s;
  } else if (threadIdx.x == 0) {  // D per head: the columns added in order
    float total = 0.0f;
    for (int p = 0; p < P; ++p) total += s_tmp[p];
    a.grad.dD[h] = total;
  }
}

}  // namespace mamba2ssd::cuda
