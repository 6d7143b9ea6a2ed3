// The decode step's kernel (include/mamba2ssd/mamba2ssd.h, "Decode"):
//   S = exp(A d) S + d outer(x, B);  out = (S C + D x) * silu(z)    per request, head and token.
//
// Design. The step is memory-bound: each (request, head) reads its P x N state from the cache and
// writes it back (or to other slots); x, B, C, dt and out are a few hundred bytes. So the kernel is
// a streaming copy with arithmetic in the middle, and what decides its speed is how many bytes are
// in flight all the time, not the arithmetic.
//
// Work unit: a few rows of one (request, head)'s state, one warp's worth. A row is L consecutive
// lanes (a power of two); lane l of a row holds kChunks 16-byte chunks of it, chunk c being the
// row's chunk l + c L, so that each of the warp's copies moves whole rows contiguously (fp32, N 128:
// 8 lanes a row, 4 rows, 2 KiB a unit; bf16: 1 KiB). Units are numbered row tile fastest, then head, then
// request, and each warp walks a contiguous range of them: neighbouring units share the request's
// slot and the group's B and C, which the warp then reads once.
//
// Pipeline. The state goes global -> shared memory by cp.async, kDecodeStages units ahead: while a
// warp computes one unit, its next units' copies are in flight, so the memory system never waits
// for the arithmetic, the slot lookups or the small inputs (the first version, one short-lived
// block per 16 rows with no look-ahead, reached 0.62 of the copy ceiling). Each lane copies and
// reads back only its own chunks, so the stages need no barrier: cp.async.wait_group is per thread.
// The warp's B and C rows (as fp32) are the only shared data; __syncwarp guards their restaging.
//
// Per token each lane updates its values with fp32 FMAs, the row's S C is a sum over its L lanes
// (butterfly shuffles), and the row's first lane adds D x, applies the gate and stores it. The
// state stays in fp32 registers across a request's tokens and is rounded to the cache's dtype only
// when it is stored (streaming hint: the cache is touched once per call). Slots come from
// decode_slots.h: a pad or out-of-range read slot skips the request (zeros out), a pad or
// out-of-range destination drops the store, so no index reaches outside the cache. A cache whose
// rows are not 16-byte aligned takes the element path through the same stages.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/decode_slots.h"
#include "common/dt.h"
#include "cuda/common/element.cuh"
#include "cuda/common/math.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = 32 * kDecodeWarps;
constexpr int kDecodeMaxDstate = 256;
// 16-byte chunks of a row a lane takes per unit: 4 of an fp32 state (16 values), 2 of a 16-bit one
// (16 values: 32 would spill at the register budget below).
template <typename StateT>
constexpr int decode_chunks() { return sizeof(StateT) == 4 ? 4 : 2; }
// Units a warp has staged or in flight: about 4 KiB of state a warp ahead of its arithmetic.
constexpr int decode_stages(int chunks) { return chunks == 4 ? 3 : 5; }
// Blocks per multiprocessor the register budget must allow (80 registers a thread). The shared
// memory (stages of 32 x chunks x 16 bytes and 2 KiB of B and C a warp: 28-32 KiB a block) holds six.
constexpr int kDecodeMinBlocks = 6;

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
  // The work layout (decode_cuda on the host).
  int lanes_per_row;       // L: a power of two, at most 32
  int row_tiles;           // units per (request, head): ceil(P / (32 / L))
  int64_t units;           // batch x heads x row_tiles
  int64_t units_per_warp;  // each warp's contiguous range
};

// Which rows a unit covers. A warp decomposes its first unit once and steps from there: 64-bit
// divisions per unit cost more issue slots than the unit's arithmetic.
struct DecodeUnit {
  int64_t b, h, g;   // request, head, the head's group
  int64_t h_in_g;    // h's place in its group
  int tile;
  // The next unit in the numbering: row tile fastest, then head, then request.
  __device__ __forceinline__ void advance(const DecodeArgs& a) {
    if (++tile < a.row_tiles) return;
    tile = 0;
    if (++h_in_g == a.heads_per_group) h_in_g = 0, ++g;
    if (++h < a.nheads) return;
    h = 0, g = 0, h_in_g = 0;
    ++b;
  }
};
__device__ __forceinline__ DecodeUnit decode_unit(const DecodeArgs& a, int64_t u) {
  if (a.units <= INT32_MAX) {  // 32-bit divisions (a few instructions, not a 64-bit routine)
    const uint32_t u32 = static_cast<uint32_t>(u), bh = u32 / a.row_tiles;
    const uint32_t H = static_cast<uint32_t>(a.nheads), hpg = static_cast<uint32_t>(a.heads_per_group);
    const uint32_t h = bh % H;
    return {bh / H, h, h / hpg, h % hpg, static_cast<int>(u32 % a.row_tiles)};
  }
  const int64_t bh = u / a.row_tiles, h = bh % a.nheads;
  return {bh / a.nheads, h, h / a.heads_per_group, h % a.heads_per_group, static_cast<int>(u % a.row_tiles)};
}

// One 16-byte chunk of state (kV elements of StateT): staged by cp.async (kVec) or element by
// element into the lane's stage slot, converted to fp32 there, and stored back from fp32.
template <typename StateT, bool kVec>
struct StateChunk {
  static constexpr int kV = 16 / static_cast<int>(sizeof(StateT));
  // `valid` false: the slot reads as zeros (a row past P, a chunk past N, a skipped request).
  static __device__ __forceinline__ void stage(uint4* slot, const StateT* src, bool valid) {
    if constexpr (kVec) {
      tile::cp_async_16(slot, src, valid);
    } else {
      StateT* e = reinterpret_cast<StateT*>(slot);
#pragma unroll
      for (int i = 0; i < kV; ++i) e[i] = valid ? src[i] : tile::from_float<StateT>(0.0f);
    }
  }
  static __device__ __forceinline__ void to_float(const uint4& u, float (&v)[kV]) {
    const StateT* e = reinterpret_cast<const StateT*>(&u);
#pragma unroll
    for (int i = 0; i < kV; ++i) v[i] = tile::to_float(e[i]);
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

template <typename StateT, bool kVec>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeMinBlocks) decode_kernel(const DecodeArgs a) {
  using Chunk = StateChunk<StateT, kVec>;
  constexpr int kV = Chunk::kV, kChunks = decode_chunks<StateT>(), kDecodeStages = decode_stages(kChunks);
  __shared__ uint4 stages[kDecodeWarps][kDecodeStages][kChunks][32];  // [.., chunk, lane]: no bank conflicts
  __shared__ float sBC[kDecodeWarps][2][kDecodeMaxDstate];            // the warp's B and C rows, fp32

  const int L = a.lanes_per_row, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = lane % L, row_in_unit = lane / L, rows_per_unit = 32 / L;
  const int P = static_cast<int>(a.headdim), N = static_cast<int>(a.dstate);
  const int64_t T = a.ntokens;
  const Strides4& ss = a.state_stride;
  float* const sB = sBC[warp][0];
  float* const sC = sBC[warp][1];
  // The lane's chunks' first n (-1: past N).
  int n0[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) n0[c] = (col + c * L) * kV < N ? (col + c * L) * kV : -1;

  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kDecodeWarps + warp) * a.units_per_warp;
  const int64_t end = first + a.units_per_warp < a.units ? first + a.units_per_warp : a.units;
  if (first >= end) return;  // warp-uniform

  // Issues the next unit's copies into the next stage (then one commit group, issued or not, per
  // unit, so that wait_group counts units).
  int64_t issued = first;
  DecodeUnit next = decode_unit(a, first);
  DecodeUnit w = next;  // the unit being computed (next: the next one to issue)
  int next_stage = 0;
  auto issue = [&]() {
    if (issued < end) {
      const int32_t read = read_slot(a.slots, next.b);
      const int p = next.tile * rows_per_unit + row_in_unit;
      const bool row_ok = read >= 0 && p < P;
      const StateT* src = static_cast<const StateT*>(a.state) + (row_ok ? read * ss.s0 + next.h * ss.s1 + p * ss.s2 : 0);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const bool ok = row_ok && n0[c] >= 0;
        Chunk::stage(&stages[warp][next_stage][c][lane], ok ? src + n0[c] : src, ok);
      }
      next.advance(a);
    }
    tile::cp_async_commit();
    ++issued;
    next_stage = next_stage + 1 < kDecodeStages ? next_stage + 1 : 0;
  };
#pragma unroll
  for (int s = 0; s < kDecodeStages - 1; ++s) issue();

  int64_t staged_b = -1, staged_g = -1, staged_t = -1;  // whose B and C rows sB and sC hold
  int stage = 0;
  for (int64_t u = first; u < end; ++u, w.advance(a), stage = stage + 1 < kDecodeStages ? stage + 1 : 0) {
    issue();  // unit u + kDecodeStages - 1, into the stage unit u - 1 used
    const int64_t b = w.b, h = w.h, g = w.g;
    const int32_t read = read_slot(a.slots, b);
    const int row = w.tile * rows_per_unit + row_in_unit;
    const int p = row < P ? row : -1;
    const int64_t x_at = b * a.x_stride.s0 + h * a.x_stride.s2 + (p >= 0 ? p : 0);
    const int64_t out_at = b * a.out_stride.s0 + h * a.out_stride.s2 + (p >= 0 ? p : 0);
    if (read < 0) {  // a pad (or a slot outside the cache): zero output, nothing stored
      tile::cp_async_wait<kDecodeStages - 1>();  // its zero fill lands before the stage is reused
      if (col == 0 && p >= 0)
        for (int64_t t = 0; t < T; ++t) store_float(a.out, out_at + t * a.out_stride.s1, a.dtype, 0.0f);
      continue;
    }

    const float a_log2 = a.A[h] * kLog2e, bias = a.dt_bias ? a.dt_bias[h] : 0.0f;
    float s[kChunks][kV];
    for (int64_t t = 0; t < T; ++t) {
      // The token's small inputs first, so that their loads overlap B's and C's.
      const float raw_dt = load_float(a.dt, b * a.dt_stride.s0 + t * a.dt_stride.s1 + h * a.dt_stride.s2, a.dt_dtype);
      const float x = p >= 0 ? load_float(a.x, x_at + t * a.x_stride.s1, a.dtype) : 0.0f;
      // This token's B and C rows of group g, staged for the warp when they change.
      if (b != staged_b || g != staged_g || t != staged_t) {
        __syncwarp();  // every lane is done with the rows staged before
        for (int n = lane; n < N; n += 32) {
          sB[n] = load_float(a.B, b * a.B_stride.s0 + t * a.B_stride.s1 + g * a.B_stride.s2 + n, a.dtype);
          sC[n] = load_float(a.C, b * a.C_stride.s0 + t * a.C_stride.s1 + g * a.C_stride.s2 + n, a.dtype);
        }
        __syncwarp();
        staged_b = b, staged_g = g, staged_t = t;
      }
      const float d = preprocess_dt(raw_dt, bias, a.dt_softplus, a.dt_min, a.dt_max);
      const float decay = fast_exp2(a_log2 * d);
      if (t == 0) {  // the unit's state, from its stage (this lane's own copies)
        tile::cp_async_wait<kDecodeStages - 1>();
#pragma unroll
        for (int c = 0; c < kChunks; ++c) Chunk::to_float(stages[warp][stage][c][lane], s[c]);
      }

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
        store_float(a.out, out_at + t * a.out_stride.s1, a.dtype, y);
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
  tile::cp_async_wait<0>();  // no copy outlives the block (the last units' empty groups included)
}

}  // namespace mamba2ssd::cuda
