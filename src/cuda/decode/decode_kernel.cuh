// The decode step's kernel (include/mamba2ssd/mamba2ssd.h, "Decode"):
//   S = exp(A d) S + d outer(x, B);  out = (S C + D x) * silu(z)    per request, head and token.
//
// Design. The step is memory-bound: each (request, head) reads its P x N state from the cache and
// writes it back (or to other slots), and everything else (x, B, C, dt, out) is a few hundred
// bytes. So the kernel is a streaming copy with arithmetic in the middle. A thread holds one row's
// kDecodeChunks = 4 chunks of 16 bytes (64 bytes: 16 fp32 or 32 bf16/fp16 values), loaded as
// 16-byte vectors, all four issued before any is used, so enough bytes are in flight to cover the
// memory latency; a row is L consecutive lanes (a power of two), chunk c of lane l being the row's
// chunk l + c L, so each of a warp's four loads moves whole rows contiguously. A block of 128
// threads takes a tile of 4 * 32 / L rows of one (request, head) (fp32, N 128: 16 rows, 8 KiB), and
// the grid holds (heads x row tiles) x requests blocks: thousands at serving batch sizes, so every
// multiprocessor keeps several blocks' loads in flight. Per token the block stages the group's B
// and C rows in shared memory once (as fp32), then each thread updates its 16 or 32 values with
// fp32 FMAs, the row's output S C is a sum over its L lanes (butterfly shuffles), and the row's
// first lane adds D x, applies the gate and stores it. The state stays in fp32 registers across a
// request's tokens and is rounded to the cache's dtype only when it is stored (streaming hints: the
// cache is touched once per call). Slots come from decode_slots.h: a pad or out-of-range read slot
// skips the request (zeros out), a pad or out-of-range destination drops the store, so no index
// reaches outside the cache.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/decode_slots.h"
#include "common/dt.h"
#include "cuda/common/element.cuh"
#include "cuda/common/math.cuh"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

constexpr int kDecodeThreads = 128;     // 4 warps
constexpr int kDecodeChunks = 4;        // 16-byte chunks of state a thread holds (loads in flight)
constexpr int kDecodeMaxDstate = 256;
// Blocks per multiprocessor the register budget must allow (64 registers a thread). Without it
// ptxas keeps every B and C value of a thread's chunks in registers (126 for 16-bit states), four
// blocks fit, and half as many bytes are in flight; with it, 8 blocks x 128 threads x 64 bytes.
constexpr int kDecodeMinBlocks = 8;

struct DecodeArgs {
  int64_t batch, ntokens, nheads, headdim, dstate, heads_per_group;
  DType dtype, dt_dtype;
  void* state;  Strides4 state_stride;  // [slots, H, P, N]
  const void* x;   Strides4 x_stride;   // [b, T, H, P]
  const void* dt;  Strides3 dt_stride;  // [b, T, H]
  const float* A;
  const void* B;   Strides4 B_stride;   // [b, T, G, N]
  const void* C;   Strides4 C_stride;
  DLayout D_layout;
  const float* D;
  const void* z;   Strides4 z_stride;
  const float* dt_bias;
  bool dt_softplus;
  float dt_min, dt_max;
  DecodeSlots slots;
  void* out;  Strides4 out_stride;      // [b, T, H, P]
  // The thread layout (decode_cuda on the host).
  int lanes_per_row;   // L: a power of two, at most 32
  int tile_rows;       // rows of a block's tile: 4 warps * 32 / L
  int row_tiles;       // tiles per (request, head); the grid's x is nheads * row_tiles
};

// One 16-byte chunk of state (kV elements of StateT) to and from fp32 registers: a vector access
// with a streaming hint (the cache is touched once per call), or element by element when the
// cache's rows are not 16-byte aligned.
template <typename StateT, bool kVec>
struct StateChunk {
  static constexpr int kV = 16 / static_cast<int>(sizeof(StateT));
  static __device__ __forceinline__ void load(const StateT* src, float (&v)[kV]) {
    if constexpr (kVec) {
      const uint4 u = __ldcs(reinterpret_cast<const uint4*>(src));
      const StateT* e = reinterpret_cast<const StateT*>(&u);
#pragma unroll
      for (int i = 0; i < kV; ++i) v[i] = tile::to_float(e[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kV; ++i) v[i] = tile::to_float(src[i]);
    }
  }
  static __device__ __forceinline__ void store(StateT* dst, const float (&v)[kV]) {
    if constexpr (kVec) {
      uint4 u;
      StateT* e = reinterpret_cast<StateT*>(&u);
#pragma unroll
      for (int i = 0; i < kV; ++i) e[i] = tile::from_float<StateT>(v[i]);
      __stcs(reinterpret_cast<uint4*>(dst), u);
    } else {
#pragma unroll
      for (int i = 0; i < kV; ++i) dst[i] = tile::from_float<StateT>(v[i]);
    }
  }
};

// kChunks: the 16-byte chunks a thread holds, all in one row of the state (4, or 2 when a row has
// only two: 16-bit states with N = 16).
template <typename StateT, int kChunks, bool kVec>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeMinBlocks) decode_kernel(const DecodeArgs a) {
  using Chunk = StateChunk<StateT, kVec>;
  constexpr int kV = Chunk::kV;
  __shared__ float sB[kDecodeMaxDstate], sC[kDecodeMaxDstate];  // this token's B and C rows, fp32

  const int L = a.lanes_per_row, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = lane % L;                                // the thread's first chunk in its row
  const int64_t h = blockIdx.x / a.row_tiles;              // grid x: (head, tile), 32-bit (decode_cuda)
  const int tile = static_cast<int>(blockIdx.x % a.row_tiles);
  const int64_t g = h / a.heads_per_group;
  const int P = static_cast<int>(a.headdim), N = static_cast<int>(a.dstate);
  const int64_t T = a.ntokens;
  const Strides4& ss = a.state_stride;
  // The thread's row p (-1: past P) and its chunks' first n (-1: past N): chunk c is the row's
  // chunk col + c L, so that for each c the row's lanes move one contiguous piece.
  const int row = tile * a.tile_rows + warp * (32 / L) + lane / L;
  const int p = row < P ? row : -1;
  int n0[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) n0[c] = (col + c * L) * kV < N ? (col + c * L) * kV : -1;

  // Grid y strides over the requests (a grid dimension holds at most 65535).
  for (int64_t b = blockIdx.y; b < a.batch; b += gridDim.y) {
    const int32_t read = read_slot(a.slots, b);
    if (read < 0) {  // a pad (or a slot outside the cache): zero output, nothing stored
      if (col == 0 && p >= 0)
        for (int64_t t = 0; t < T; ++t)
          store_float(a.out, b * a.out_stride.s0 + t * a.out_stride.s1 + h * a.out_stride.s2 + p, a.dtype, 0.0f);
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
    for (int64_t t = 0; t < T; ++t) {
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

      const float dx = d * x;
      float y = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        // An idle chunk (past N) holds zeros and must keep them, or its S C would join the row's sum.
        const int n = n0[c] >= 0 ? n0[c] : 0;
        const float dxc = n0[c] >= 0 ? dx : 0.0f;
#pragma unroll
        for (int i = 0; i < kV; ++i) {
          s[c][i] = fmaf(decay, s[c][i], dxc * sB[n + i]);
          y = fmaf(s[c][i], sC[n + i], y);
        }
      }
      // S C over the row's L lanes (every lane takes part: idle ones add zeros).
      for (int offset = L / 2; offset > 0; offset /= 2) y += __shfl_xor_sync(0xffffffffu, y, offset);
      if (col == 0 && p >= 0) {
        if (a.D_layout == DLayout::kPerHead) y += a.D[h] * x;
        else if (a.D_layout == DLayout::kPerHeadDim) y += a.D[h * P + p] * x;
        if (a.z) y *= silu(load_float(a.z, b * a.z_stride.s0 + t * a.z_stride.s1 + h * a.z_stride.s2 + p, a.dtype));
        store_float(a.out, b * a.out_stride.s0 + t * a.out_stride.s1 + h * a.out_stride.s2 + p, a.dtype, y);
      }
      const int32_t dst = dst_slot(a.slots, b, t, read);
      if (dst >= 0 && p >= 0) {
        StateT* row_dst = static_cast<StateT*>(a.state) + dst * ss.s0 + h * ss.s1 + p * ss.s2;
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          if (n0[c] >= 0) Chunk::store(row_dst + n0[c], s[c]);
      }
    }
  }
}

}  // namespace mamba2ssd::cuda
