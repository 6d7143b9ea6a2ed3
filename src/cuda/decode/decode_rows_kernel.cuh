// The decode step (decode_kernel.cuh; decode_cuda runs it for every call): one block of 4 warps per
// tile of rows of one (request, head), every 16-byte state load of a thread issued before any is
// used, B and C staged once per token for the whole block. A token's inputs are loaded while the
// request's slot is in flight (the next token's while this one computes), so a call costs little
// more than two memory latencies (the slot, then the state). Between blocks nothing is in flight,
// yet with that order it is ahead of the stream kernel on large fp32 calls too (docs/perf-log.md,
// "Decode d7").
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
// (values threadIdx.x + k x 128, as loaded: In, turned into fp32 as they are staged), held in
// registers so that their loads are issued together, ahead of whatever waits on them, and staged to
// shared memory once the block is ready for them.
template <typename In>
struct RowsTokenIn {
  static constexpr int kShare = kDecodeMaxDstate / kDecodeThreads;
  DecodeTokenIn in;
  In B[kShare], C[kShare];
};

template <typename In>
__device__ __forceinline__ RowsTokenIn<In> load_rows_token(const DecodeArgs& a, int64_t b, int64_t t, int64_t h,
                                                           int64_t g, int p, int col) {
  RowsTokenIn<In> r;
  r.in = load_token_in<In>(a, b, t, h, p, col);
  const In* Bp = static_cast<const In*>(a.B) + (b * a.B_stride.s0 + t * a.B_stride.s1 + g * a.B_stride.s2);
  const In* Cp = static_cast<const In*>(a.C) + (b * a.C_stride.s0 + t * a.C_stride.s1 + g * a.C_stride.s2);
  const int N = static_cast<int>(a.dstate);
  const In zero = tile::from_float<In>(0.0f);
#pragma unroll
  for (int k = 0; k < RowsTokenIn<In>::kShare; ++k) {
    const int n = threadIdx.x + k * kDecodeThreads;
    r.B[k] = n < N ? __ldg(Bp + n) : zero;
    r.C[k] = n < N ? __ldg(Cp + n) : zero;
  }
  return r;
}

// Grid: x = (head, row tile), y = requests (strided past the grid's limit). In: the dtype of x, B,
// C, z and out (typed loads: no run-time dtype branch before the state's loads).
//
// Order of a request's work, from its critical path: the slot's load, then the state's (which needs
// the slot), then the arithmetic. The slot is loaded first of all, even before the block's own
// indices are worked out, and the token's inputs are issued while it is in flight, kept as loaded
// bits until the state's loads are issued (a conversion would wait for its load there); what is
// issued between the slot's load and the state's delays the state when the slot returns first, so
// that part is kept short (typed loads, 32-bit index arithmetic, predicated state loads).
template <typename StateT, typename In, int kChunks, bool kVec>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeRowsMinBlocks) decode_rows_kernel(const DecodeArgs a) {
  using Chunk = StateChunk<StateT, kVec>;
  constexpr int kV = Chunk::kV;
  __shared__ __align__(16) float sB[kDecodeMaxDstate], sC[kDecodeMaxDstate];  // this token's B and C rows, fp32

  int64_t b = blockIdx.y;  // < batch (decode_cuda)
  int32_t read = read_slot(a.slots, b);

  // Where the thread works: 32-bit arithmetic (the grid's x is below 2^31, heads_per_group divides
  // nheads), L a power of two.
  const int L = a.lanes_per_row, log2L = __ffs(L) - 1;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned row_tiles = static_cast<unsigned>(a.row_tiles);
  const int h = static_cast<int>(blockIdx.x / row_tiles);
  const int tile = static_cast<int>(blockIdx.x - static_cast<unsigned>(h) * row_tiles);
  const int g = static_cast<int>(static_cast<unsigned>(h) / static_cast<unsigned>(a.heads_per_group));
  const int N = static_cast<int>(a.dstate), P = static_cast<int>(a.headdim);
  const int col = lane & (L - 1);
  const int row = tile * a.tile_rows + (warp << (5 - log2L)) + (lane >> log2L);
  const int p = row < P ? row : -1;
  int n0[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) n0[c] = (col + c * L) * kV < N ? (col + c * L) * kV : -1;
  // The row's chunks in slot 0 (a row past P or a chunk past N: an address of the head's rows, never
  // loaded), so that the slot adds one offset: what waits for the slot is as short as it can be.
  const Strides3& ss = a.state_stride;
  const StateT* chunk_src[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    chunk_src[c] = static_cast<const StateT*>(a.state) + h * ss.s1 + (p >= 0 ? p : 0) * ss.s2 + (n0[c] >= 0 ? n0[c] : 0);
  const float a_log2 = a.A[h] * kLog2e, bias = a.dt_bias ? a.dt_bias[h] : 0.0f;

  for (;;) {
    // The first token's inputs fly with the slot's load (only the state's loads wait for the slot).
    RowsTokenIn<In> next = load_rows_token<In>(a, b, 0, h, g, p, col);
    // The state: every chunk's load issued before any is used (none for a skipped request).
    const bool live = read >= 0;
    const int64_t slot_at = (live ? read : 0) * ss.s0;
    float s[kChunks][kV];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) Chunk::load(chunk_src[c] + slot_at, live && p >= 0 && n0[c] >= 0, s[c]);
    if (!live) {  // a pad (or a slot outside the cache): zero output, nothing stored
      decode_zero_out(a, col, p, b, h);
    } else {
      for (int64_t t = 0; t < a.ntokens; ++t) {
        __syncthreads();  // the previous token's (or request's) readers of sB and sC are done
#pragma unroll
        for (int k = 0; k < RowsTokenIn<In>::kShare; ++k) {
          const int n = threadIdx.x + k * kDecodeThreads;
          if (n < N) sB[n] = tile::to_float(next.B[k]), sC[n] = tile::to_float(next.C[k]);
        }
        __syncthreads();
        const DecodeTokenIn in = next.in;
        // The next token's loads fly while this one computes.
        if (t + 1 < a.ntokens) next = load_rows_token<In>(a, b, t + 1, h, g, p, col);
        const float d = token_dt(a, in, bias);
        decode_token<StateT, kVec, In>(a, L, col, p, n0, s, sB, sC, fast_exp2(a_log2 * d), d, in, b, t, h, read);
      }
    }
    b += gridDim.y;
    if (b >= a.batch) break;
    read = read_slot(a.slots, b);
  }
}

}  // namespace mamba2ssd::cuda
