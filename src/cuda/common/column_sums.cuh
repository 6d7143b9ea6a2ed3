// Sums down the columns of a matrix of partial sums, in a fixed order (no atomics: the same bits
// every run). The layer's kernels leave one row of partial weight gradients per block or segment;
// a second kernel adds them with this.
#pragma once

#include <cstdint>

namespace mamba2ssd::cuda {

// The sum of column `column` of m (`rows` rows, `row_stride` elements apart) for a block of
// kWarps * 32 threads over 32 columns, lane i taking column 32 blockIdx + i (the caller's):
// warp w adds rows w, w + kWarps, ... (striped, so that the warps' loads run side by side), then
// every thread adds the warps' sums in warp order. Columns past `columns` read nothing and sum 0.
// Every thread of the block calls it (a block barrier); the result is the same on every warp.
template <int kWarps>
__device__ __forceinline__ float striped_column_sum(const float* m, int64_t rows, int64_t row_stride, int64_t column,
                                                    int64_t columns) {
  __shared__ float part[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float s = 0.0f;
  if (column < columns)
    for (int64_t i = warp; i < rows; i += kWarps) s += m[i * row_stride + column];
  part[warp][lane] = s;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += part[w][lane];
  return total;
}

}  // namespace mamba2ssd::cuda
