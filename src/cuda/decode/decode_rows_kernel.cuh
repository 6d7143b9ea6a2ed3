// The decode step for 16-bit caches, small fp32 calls and several tokens per request
// (decode_kernel.cuh; decode_cuda chooses): one block of 4 warps per tile of rows of one (request,
// head), every 16-byte state load of a thread issued before any is used, B and C staged once per
// token for the whole block. A token's inputs are loaded before the request's slot is known (the
// next token's while this one computes), so a call costs little more than two memory latencies
// (the slot, then the state). Between blocks nothing is in flight: large fp32 calls reach about
// 0.78 of a copy of their bytes, where the stream kernel reaches 0.82 (docs/perf-log.md, "Decode d5").
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

// A token's inputs of one thread: its row's small inputs and its share of the group's B and C rows
// (values threadIdx.x + k x 128), held in registers so that their loads are issued together, ahead
// of whatever waits on them, and staged to shared memory once the block is ready for them.
struct RowsTokenIn {
  static constexpr int kShare = kDecodeMaxDstate / kDecodeThreads;
  DecodeTokenIn in;
  float B[kShare], C[kShare];
};

// Typed loads of B's and C's values (one dtype switch for all of them, not one per value, so that
// they issue back to back).
template <typename In>
__device__ __forceinline__ void load_bc_share(const DecodeArgs& a, int64_t B_at, int64_t C_at, int N,
                                              RowsTokenIn& r) {
  const In* Bp = static_cast<const In*>(a.B) + B_at;
  const In* Cp = static_cast<const In*>(a.C) + C_at;
#pragma unroll
  for (int k = 0; k < RowsTokenIn::kShare; ++k) {
    const int n = threadIdx.x + k * kDecodeThreads;
    r.B[k] = n < N ? tile::to_float(__ldg(Bp + n)) : 0.0f;
    r.C[k] = n < N ? tile::to_float(__ldg(Cp + n)) : 0.0f;
  }
}

__device__ __forceinline__ RowsTokenIn load_rows_token(const DecodeArgs& a, int64_t b, int64_t t, int64_t h, int64_t g,
                                                       int p, int col) {
  RowsTokenIn r;
  r.in = load_token_in(a, b, t, h, p, col);
  const int64_t B_at = b * a.B_stride.s0 + t * a.B_stride.s1 + g * a.B_stride.s2;
  const int64_t C_at = b * a.C_stride.s0 + t * a.C_stride.s1 + g * a.C_stride.s2;
  const int N = static_cast<int>(a.dstate);
  switch (a.dtype) {
    case DType::kF32: load_bc_share<float>(a, B_at, C_at, N, r); break;
    case DType::kF16: load_bc_share<__half>(a, B_at, C_at, N, r); break;
    default: load_bc_share<__nv_bfloat16>(a, B_at, C_at, N, r); break;  // bf16 (fp64 is refused)
  }
  return r;
}

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
  const float a_log2 = a.A[h] * kLog2e, bias = a.dt_bias ? a.dt_bias[h] : 0.0f;

  for (int64_t b = blockIdx.y; b < a.batch; b += gridDim.y) {
    // The first token's inputs before the slot: their loads fly with the slot's, on which only the
    // state's wait.
    RowsTokenIn next = load_rows_token(a, b, 0, h, g, p, col);
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

    for (int64_t t = 0; t < a.ntokens; ++t) {
      __syncthreads();  // the previous token's (or request's) readers of sB and sC are done
#pragma unroll
      for (int k = 0; k < RowsTokenIn::kShare; ++k) {
        const int n = threadIdx.x + k * kDecodeThreads;
        if (n < N) sB[n] = next.B[k], sC[n] = next.C[k];
      }
      __syncthreads();
      const DecodeTokenIn in = next.in;
      // The next token's loads fly while this one computes.
      if (t + 1 < a.ntokens) next = load_rows_token(a, b, t + 1, h, g, p, col);
      const float d = preprocess_dt(in.raw_dt, bias, a.dt_softplus, a.dt_min, a.dt_max);
      decode_token<StateT, kVec>(a, L, col, p, n0, s, sB, sC, fast_exp2(a_log2 * d), d, in, b, t, h, read);
    }
  }
}

}  // namespace mamba2ssd::cuda
