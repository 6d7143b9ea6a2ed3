// The decode step's kernel (include/mamba2ssd/mamba2ssd.h, "Decode"):
//   S = exp(A d) S + d outer(x, B);  out = (S C + D x) * silu(z)    per request, head and token.
//
// Design. The step is memory-bound: each (request, head) reads its P x N state from the cache and
// writes it back (or to other slots), and everything else (x, B, C, dt, out) is a few hundred
// bytes. So the kernel is a streaming copy with arithmetic in the middle. A block of 128 threads
// takes a tile of rows of one (request, head). Within a warp, a row of the state is L consecutive
// lanes (L = the 16-byte chunks of a row, rounded up to a power of two, at most 32), each lane
// owning one 16-byte chunk of the row (two when a row has more than 32 chunks: fp32, N > 128), so
// that every load and store of the state is a 16-byte vector and a warp moves whole rows. Each
// thread holds kRegChunks = 4 chunks (its rows x its chunks) in registers and issues all four
// loads before it uses any, so enough bytes are in flight to cover the memory latency; the grid
// holds (requests x heads x row tiles) blocks, thousands at serving batch sizes. A thread's
// columns n are the same for all of its rows, so it takes its values of B and C once per token
// from shared memory, where the block staged the group's B and C rows (read once per block, as
// fp32). The state stays in fp32 registers across a request's tokens and is rounded to the
// cache's dtype only when it is stored; a row's output S C is a sum over the row's L lanes
// (butterfly shuffles), and the row's first lane adds D x, applies the gate and stores it.
// Slots come from decode_slots.h: a pad or out-of-range read slot skips the request (zeros out),
// a pad or out-of-range destination drops the store, so no index reaches outside the cache.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/decode_slots.h"
#include "common/dt.h"
#include "cuda/common/math.cuh"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

constexpr int kDecodeThreads = 128;     // 4 warps
constexpr int kDecodeRegChunks = 4;     // 16-byte chunks of state a thread holds (loads in flight)
constexpr int kDecodeMaxDstate = 256;

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
  // The thread layout (decode_layout on the host).
  int lanes_per_row;   // L: a power of two, at most 32
  int tile_rows;       // rows of a block's tile
  int64_t row_tiles;   // tiles per (request, head)
  int64_t work;        // batch * nheads * row_tiles
};

// Element i of a tensor of runtime dtype t, as float (the small tensors: x, z, B, C, dt).
__device__ __forceinline__ float load_float(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  }
  return 0.0f;
}
__device__ __forceinline__ void store_float(void* base, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; return;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(v); return;
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); return;
  }
}

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

// kChunks: 16-byte chunks per lane and row (1, or 2 when a row has more than 32 chunks).
template <typename StateT, int kChunks, bool kVec>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(const DecodeArgs a) {
  using Chunk = StateChunk<StateT, kVec>;
  constexpr int kV = Chunk::kV;
  constexpr int kRows = kDecodeRegChunks / kChunks;  // rows a thread holds
  static_assert(kRows * kChunks == kDecodeRegChunks, "a thread's chunks are rows x chunks per row");
  __shared__ float sB[kDecodeMaxDstate], sC[kDecodeMaxDstate];  // this token's B and C rows, fp32

  const int L = a.lanes_per_row, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int rows_per_warp = 32 / L, rows_per_pass = (kDecodeThreads / 32) * rows_per_warp;
  const int col = lane % L;                                        // the thread's chunk in a row
  const int row0 = warp * rows_per_warp + lane / L;                // its first row in the tile
  const int64_t P = a.headdim, N = a.dstate, T = a.ntokens;
  const Strides4& ss = a.state_stride;

  for (int64_t w = blockIdx.x; w < a.work; w += gridDim.x) {
    const int64_t tile = w % a.row_tiles, h = (w / a.row_tiles) % a.nheads, b = w / (a.row_tiles * a.nheads);
    const int64_t g = h / a.heads_per_group;
    // The thread's rows (p) and columns (first n of each chunk); -1 past P or N.
    int64_t p[kRows];
    int n0[kChunks];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = tile * a.tile_rows + r * rows_per_pass + row0;
      p[r] = row < P ? row : -1;
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) n0[c] = (col + c * L) * kV < N ? (col + c * L) * kV : -1;

    const int32_t read = read_slot(a.slots, b);
    if (read < 0) {  // a pad (or a slot outside the cache): zero output, nothing stored
      if (col == 0)
        for (int64_t t = 0; t < T; ++t)
#pragma unroll
          for (int r = 0; r < kRows; ++r)
            if (p[r] >= 0)
              store_float(a.out, b * a.out_stride.s0 + t * a.out_stride.s1 + h * a.out_stride.s2 + p[r], a.dtype, 0.0f);
      continue;
    }

    // The state: every chunk's load issued before any is used.
    const StateT* cache = static_cast<const StateT*>(a.state);
    float s[kRows][kChunks][kV];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        if (p[r] >= 0 && n0[c] >= 0) Chunk::load(cache + read * ss.s0 + h * ss.s1 + p[r] * ss.s2 + n0[c], s[r][c]);
        else
#pragma unroll
          for (int i = 0; i < kV; ++i) s[r][c][i] = 0.0f;
      }

    const float a_log2 = a.A[h] * kLog2e, bias = a.dt_bias ? a.dt_bias[h] : 0.0f;
    for (int64_t t = 0; t < T; ++t) {
      // This token's B and C rows of group g, staged once for the block.
      __syncthreads();  // the previous token's (or work item's) readers are done
      for (int64_t n = threadIdx.x; n < N; n += kDecodeThreads) {
        sB[n] = load_float(a.B, b * a.B_stride.s0 + t * a.B_stride.s1 + g * a.B_stride.s2 + n, a.dtype);
        sC[n] = load_float(a.C, b * a.C_stride.s0 + t * a.C_stride.s1 + g * a.C_stride.s2 + n, a.dtype);
      }
      const float raw_dt = load_float(a.dt, b * a.dt_stride.s0 + t * a.dt_stride.s1 + h * a.dt_stride.s2, a.dt_dtype);
      const float d = preprocess_dt(raw_dt, bias, a.dt_softplus, a.dt_min, a.dt_max);
      const float decay = fast_exp2(a_log2 * d);
      float x[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        x[r] = p[r] >= 0 ? load_float(a.x, b * a.x_stride.s0 + t * a.x_stride.s1 + h * a.x_stride.s2 + p[r], a.dtype)
                         : 0.0f;
      __syncthreads();
      float Bv[kChunks][kV], Cv[kChunks][kV];
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int i = 0; i < kV; ++i) {
          Bv[c][i] = n0[c] >= 0 ? sB[n0[c] + i] : 0.0f;
          Cv[c][i] = n0[c] >= 0 ? sC[n0[c] + i] : 0.0f;
        }

      const int32_t dst = dst_slot(a.slots, b, t, read);
      StateT* dst_cache = static_cast<StateT*>(a.state) + (dst >= 0 ? dst * ss.s0 + h * ss.s1 : 0);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float dx = d * x[r];
        float y = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
#pragma unroll
          for (int i = 0; i < kV; ++i) {
            s[r][c][i] = fmaf(decay, s[r][c][i], dx * Bv[c][i]);
            y = fmaf(s[r][c][i], Cv[c][i], y);
          }
        // S C over the row's L lanes (every lane takes part: inactive ones hold zeros).
        for (int offset = L / 2; offset > 0; offset /= 2) y += __shfl_xor_sync(0xffffffffu, y, offset);
        if (col == 0 && p[r] >= 0) {
          if (a.D_layout == DLayout::kPerHead) y += a.D[h] * x[r];
          else if (a.D_layout == DLayout::kPerHeadDim) y += a.D[h * P + p[r]] * x[r];
          if (a.z) y *= silu(load_float(a.z, b * a.z_stride.s0 + t * a.z_stride.s1 + h * a.z_stride.s2 + p[r], a.dtype));
          store_float(a.out, b * a.out_stride.s0 + t * a.out_stride.s1 + h * a.out_stride.s2 + p[r], a.dtype, y);
        }
        if (dst >= 0 && p[r] >= 0)
#pragma unroll
          for (int c = 0; c < kChunks; ++c)
            if (n0[c] >= 0) Chunk::store(dst_cache + p[r] * ss.s2 + n0[c], s[r][c]);
      }
    }
  }
}

}  // namespace mamba2ssd::cuda
