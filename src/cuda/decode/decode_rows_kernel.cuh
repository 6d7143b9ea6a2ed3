// The decode step for small calls and several tokens per request (decode_kernel.cuh): one block of
// 4 warps per tile of rows of one (request, head), every 16-byte state load of a thread issued
// before any is used, B and C staged once per token for the whole block. A block lives for about
// one memory latency, so a call costs little more than that latency; but between blocks nothing is
// in flight, which caps large calls near 0.68 of the copy ceiling (docs/serving.md).
#pragma once

#include "cuda/decode/decode_kernel.cuh"

namespace mamba2ssd::cuda {

// 16-byte chunks of a row a thread holds: 4 (64 bytes in flight), or 2 when a row has only two
// (16-bit states with N = 16).
constexpr int kDecodeRowsChunks = 4;
// Blocks per multiprocessor the register budget must allow (64 registers a thread): without it
// ptxas keeps every B and C value of a thread's chunks in registers, four blocks fit, and half as
// many bytes are in flight.
constexpr int kDecodeRowsMinBlocks = 8;

// Grid: x = (head, row tile), y = requests (strided past the grid's limit).
template <typename StateT, int kChunks, bool kVec>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeRowsMinBlocks) decode_rows_kernel(const DecodeArgs a) {
  using Chunk = StateChunk<StateT, kVec>;
  constexpr int kV = Chunk::kV;
  __shared__ float sB[kDecodeMaxDstate], sC[kDecodeMaxDstate];  // this token's B and C rows, fp32

  const int L = a.lanes_per_row, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t h = blockIdx.x / a.row_tiles;  // grid x: (head, tile), 32-bit (decode_cuda)
  const int tile = static_cast<int>(blockIdx.x % a.row_tiles);
  const int64_t g = h / a.heads_per_group;
  const int N = static_cast<int>(a.dstate);
  const Strides4& ss = a.state_stride;
  const int col = lane % L, P = static_cast<int>(a.headdim);
  const int row = tile * a.tile_rows + warp * (32 / L) + lane / L;
  const int p = row < P ? row : -1;
  int n0[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) n0[c] = (col + c * L) * kV < N ? (col + c * L) * kV : -1;

  for (int64_t b = blockIdx.y; b < a.batch; b += gridDim.y) {
    const int32_t read = read_slot(a.slots, b);
    if (read < 0) {  // a pad (or a slot outside the cache): zero output, nothing stored
      decode_zero_out(a, col, p, b, h);
      continue;
    }
    // The state: every chunk's load issued before any is used.
    const StateT* src = static_cast<const StateT*>(a.state) + read * ss.s0 + h * ss.s1 + (p >= 0 ? p : 0) * ss.s2;
    float s[kChunks][kV];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (p >= 0 && n0[c] >= 0) Chunk::load(src + n0[c], s[c]);
      else
#pragma unroll
        for (int i = 0; i < kV; ++i) s[c][i] = 0.0f;
    }

    const float a_log2 = a.A[h] * kLog2e, bias = a.dt_bias ? a.dt_bias[h] : 0.0f;
    for (int64_t t = 0; t < a.ntokens; ++t) {
      // This token's B and C rows of group g, staged once for the block.
      __syncthreads();  // the previous token's (or request's) readers are done
      for (int n = threadIdx.x; n < N; n += kDecodeThreads) {
        sB[n] = load_float(a.B, b * a.B_stride.s0 + t * a.B_stride.s1 + g * a.B_stride.s2 + n, a.dtype);
        sC[n] = load_float(a.C, b * a.C_stride.s0 + t * a.C_stride.s1 + g * a.C_stride.s2 + n, a.dtype);
      }
      const float raw_dt = load_float(a.dt, b * a.dt_stride.s0 + t * a.dt_stride.s1 + h * a.dt_stride.s2, a.dt_dtype);
      const float d = preprocess_dt(raw_dt, bias, a.dt_softplus, a.dt_min, a.dt_max);
      const float decay = fast_exp2(a_log2 * d);
      const float x =
          p >= 0 ? load_float(a.x, b * a.x_stride.s0 + t * a.x_stride.s1 + h * a.x_stride.s2 + p, a.dtype) : 0.0f;
      __syncthreads();
      decode_token<StateT, kVec>(a, L, P, col, p, n0, s, sB, sC, decay, d, x, b, t, h, read);
    }
  }
}

}  // namespace mamba2ssd::cuda
