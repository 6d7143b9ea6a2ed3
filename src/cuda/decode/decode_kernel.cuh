// The decode step's kernels (include/mamba2ssd/mamba2ssd.h, "Decode"):
//   S = exp(A d) S + d outer(x, B);  out = (S C + D x) * silu(z)    per request, head and token.
//
// The step is memory-bound: each (request, head) reads its P x N state from the cache and writes it
// back (or to other slots); x, B, C, dt and out are a few hundred bytes. So a kernel is a streaming
// copy with arithmetic in the middle, and its speed is how many bytes it keeps in flight. Two
// kernels share the layout and the per-token math below, and differ in how they keep bytes moving
// (docs/serving.md "Two kernels"):
//   decode_rows_kernel.cuh    one short-lived block per tile of rows, every load issued at once:
//                             the least latency; every call (decode_cuda);
//   decode_stream_kernel.cuh  each warp walks a contiguous range of row tiles with the state staged
//                             by cp.async a few tiles ahead: the most bytes in flight, which once
//                             paid on large fp32 calls; now only when forced (decode_cuda).
//
// Layout. A row of the state is L consecutive lanes (a power of two); lane l of a row holds kChunks
// 16-byte chunks of it, chunk c being the row's chunk l + c L, so that each copy of a warp moves
// whole rows contiguously. Per token each lane updates its values with fp32 FMAs, the row's S C is
// a sum over its L lanes (butterfly shuffles), and the row's first lane adds D x, applies the gate
// and stores it. The state stays in fp32 registers across a request's tokens and is rounded to the
// cache's dtype only when it is stored (streaming hints: the cache is touched once per call). Slots
// come from decode_slots.h: a pad or out-of-range read slot skips the request (zeros out), a pad or
// out-of-range destination drops the store, so no index reaches outside the cache. A cache whose
// rows are not 16-byte aligned takes the element path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

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

// In the order the rows kernel first reads the fields, those it reads before the state's loads
// first: each 64-byte line of a kernel's arguments that a warp first touches is a constant-cache
// miss, and a warp takes them one after another (at batch 2 they were a fifth of the stall samples:
// perf-log "Decode d8"). The inputs' innermost strides are 1 (validate), so only three are kept.
struct DecodeArgs {
  DecodeSlots slots;
  int lanes_per_row;       // L: a power of two, at most 32
  int tile_rows;           // rows of a tile: a block's (rows kernel) or a warp's (stream kernel)
  int row_tiles;           // tiles per (request, head): ceil(P / tile_rows)
  DType dt_dtype;
  int64_t heads_per_group, dstate, headdim;
  void* state;  Strides3 state_stride;  // [slots, H, P, N]
  const float* A;
  const float* dt_bias;
  const void* dt;  Strides3 dt_stride;  // [b, T, H]
  const void* x;   Strides3 x_stride;   // [b, T, H, P]
  const void* z;   Strides3 z_stride;
  const float* D;
  DLayout D_layout;
  DType dtype;
  const void* B;   Strides3 B_stride;   // [b, T, G, N]
  const void* C;   Strides3 C_stride;
  int64_t batch, ntokens, nheads;
  bool dt_softplus;
  float dt_min, dt_max;
  void* out;  Strides3 out_stride;      // [b, T, H, P]
  int64_t units;           // stream kernel: batch x heads x row_tiles
  int64_t units_per_warp;  // stream kernel: each warp's contiguous range
};

// One 16-byte chunk of state (kV elements of StateT) to and from fp32: loaded straight into
// registers (rows kernel) or staged in shared memory first (stream kernel); element by element when
// the cache's rows are not 16-byte aligned (kVec false).
template <typename StateT, bool kVec>
struct StateChunk {
  static constexpr int kV = 16 / static_cast<int>(sizeof(StateT));
  static __device__ __forceinline__ void to_float(const uint4& u, float (&v)[kV]) {
    const StateT* e = reinterpret_cast<const StateT*>(&u);
#pragma unroll
    for (int i = 0; i < kV; ++i) v[i] = tile::to_float(e[i]);
  }
  // `valid` false: zeros, nothing read (a row past P, a chunk past N, a skipped request).
  static __device__ __forceinline__ void load(const StateT* src, bool valid, float (&v)[kV]) {
    if constexpr (kVec) {
      to_float(tile::load_16_cs_if(src, valid), v);
    } else {
#pragma unroll
      for (int i = 0; i < kV; ++i) v[i] = valid ? tile::to_float(src[i]) : 0.0f;
    }
  }
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

// The inputs' dtype (x, B, C, z and out) as a kernel's template parameter In, or In = void: the
// call's dtype, chosen per value at run time (the stream kernel, whose small inputs are a small part
// of a unit's work). A typed load is one instruction where the run-time choice is a branch of three.
//
// Element i of an input as loaded: its bits (a 16-bit value zero-extended), of dtype In, or of t for
// In = void. Turned into a value (bits_value) only where it is used: a conversion right behind its
// load holds the warp there until the load lands, and in the rows kernel that was before the
// state's loads were issued, a memory latency more on a small call's path (perf-log "Decode d7").
template <typename In>
__device__ __forceinline__ uint32_t load_bits(const void* base, int64_t i, DType t) {
  if constexpr (std::is_void_v<In>) {
    switch (t) {
      case DType::kF16: return load_bits<__half>(base, i, t);
      case DType::kBF16: return load_bits<__nv_bfloat16>(base, i, t);
      default: return load_bits<float>(base, i, t);  // fp32 (fp64 is refused)
    }
  } else if constexpr (std::is_same_v<In, float>) {
    return __float_as_uint(static_cast<const float*>(base)[i]);
  } else if constexpr (std::is_same_v<In, __half>) {
    return __half_as_ushort(static_cast<const __half*>(base)[i]);
  } else {
    return __bfloat16_as_ushort(static_cast<const __nv_bfloat16*>(base)[i]);
  }
}
template <typename In>
__device__ __forceinline__ float bits_value(uint32_t u, DType t) {
  if constexpr (std::is_void_v<In>) {
    switch (t) {
      case DType::kF16: return bits_value<__half>(u, t);
      case DType::kBF16: return bits_value<__nv_bfloat16>(u, t);
      default: return bits_value<float>(u, t);
    }
  } else if constexpr (std::is_same_v<In, float>) {
    return __uint_as_float(u);
  } else if constexpr (std::is_same_v<In, __half>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(u)));
  } else {
    return __uint_as_float(u << 16);  // bf16: the high half of an fp32
  }
}
template <typename In>
__device__ __forceinline__ void store_output(const DecodeArgs& a, int64_t i, float v) {
  if constexpr (std::is_void_v<In>) store_float(a.out, i, a.dtype, v);
  else static_cast<In*>(a.out)[i] = tile::from_float<In>(v);
}

// A token's small inputs for one lane's row p of head h: dt (raw: before dt_bias, softplus and the
// limits), x, and for the row's first lane z and D (0 where the call has none, or past P); dt, x
// and z as bits (load_bits). Loaded together and early (the rows kernel: while the request's slot
// is in flight; both kernels: with x and dt, not after the row's sum), so that no load waits on
// another: a small call then costs two memory latencies, the slot and then the state, where a load
// of D or z behind the state's arithmetic added a third (perf-log, "Decode d5").
struct DecodeTokenIn {
  uint32_t dt, x, z;
  float D;
};
template <typename In = void>
__device__ __forceinline__ DecodeTokenIn load_token_in(const DecodeArgs& a, int64_t b, int64_t t, int64_t h, int p,
                                                       int col) {
  DecodeTokenIn in{load_bits<void>(a.dt, b * a.dt_stride.s0 + t * a.dt_stride.s1 + h * a.dt_stride.s2, a.dt_dtype), 0u,
                   0u, 0.0f};
  if (p < 0) return in;
  in.x = load_bits<In>(a.x, b * a.x_stride.s0 + t * a.x_stride.s1 + h * a.x_stride.s2 + p, a.dtype);
  if (col != 0) return in;
  if (a.z) in.z = load_bits<In>(a.z, b * a.z_stride.s0 + t * a.z_stride.s1 + h * a.z_stride.s2 + p, a.dtype);
  if (a.D_layout == DLayout::kPerHead) in.D = a.D[h];
  else if (a.D_layout == DLayout::kPerHeadDim) in.D = a.D[h * a.headdim + p];
  return in;
}

// The token's dt after dt_bias, softplus and the limits.
__device__ __forceinline__ float token_dt(const DecodeArgs& a, const DecodeTokenIn& in, float bias) {
  return preprocess_dt(bits_value<void>(in.dt, a.dt_dtype), bias, a.dt_softplus, a.dt_min, a.dt_max);
}

// One token of request b on one lane's piece of row p, with this token's B and C rows of the
// head's group in sB, sC (fp32, 16-byte aligned, shared by the lanes), its small inputs in `in`
// and the state in s: S = decay S + d x B; the row's out; the state stored where dst_slot says. Every lane of the warp
// must call it (the row's sum is a warp shuffle). Where the lane works: L lanes a row, its place in
// its row (col: its first chunk), its row p (-1: past P) and its chunks' first n (-1: past N);
// plain values, not a struct (ptxas kept such a struct in local memory: 80 bytes of spills in the
// 16-bit rows kernel).
template <typename StateT, bool kVec, typename In = void, int kChunks>
__device__ __forceinline__ void decode_token(const DecodeArgs& a, int L, int col, int p, const int (&n0)[kChunks],
                                             float (&s)[kChunks][StateChunk<StateT, kVec>::kV], const float* sB,
                                             const float* sC, float decay, float d, const DecodeTokenIn& in, int64_t b,
                                             int64_t t, int64_t h, int32_t read) {
  using Chunk = StateChunk<StateT, kVec>;
  const float x = bits_value<In>(in.x, a.dtype);
  const float dx = d * x;
  float y = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    // An idle chunk (past N) holds zeros and must keep them, or its S C would join the row's sum.
    const int n = n0[c] >= 0 ? n0[c] : 0;
    const float dxc = n0[c] >= 0 ? dx : 0.0f;
#pragma unroll
    for (int i = 0; i < Chunk::kV; i += 4) {  // B and C 4 values a load (n is a multiple of 4)
      const float4 B4 = *reinterpret_cast<const float4*>(sB + n + i);
      const float4 C4 = *reinterpret_cast<const float4*>(sC + n + i);
      const float Bv[4] = {B4.x, B4.y, B4.z, B4.w}, Cv[4] = {C4.x, C4.y, C4.z, C4.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[c][i + j] = fmaf(decay, s[c][i + j], dxc * Bv[j]);
        y = fmaf(s[c][i + j], Cv[j], y);
      }
    }
  }
  // S C over the row's L lanes (every lane takes part: idle ones add zeros).
  for (int offset = L / 2; offset > 0; offset /= 2) y += __shfl_xor_sync(0xffffffffu, y, offset);
  if (col == 0 && p >= 0) {
    if (a.D_layout != DLayout::kNone) y += in.D * x;
    if (a.z) y *= silu(bits_value<In>(in.z, a.dtype));
    store_output<In>(a, b * a.out_stride.s0 + t * a.out_stride.s1 + h * a.out_stride.s2 + p, y);
  }
  const int32_t dst = dst_slot(a.slots, b, t, read);
  if (dst >= 0 && p >= 0) {
    const Strides3& ss = a.state_stride;
    StateT* row_dst = static_cast<StateT*>(a.state) + dst * ss.s0 + h * ss.s1 + p * ss.s2;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      if (n0[c] >= 0) Chunk::store(row_dst + n0[c], s[c]);
  }
}

// A skipped request's out rows (pad or out-of-range read slot): zeros, one store per row.
__device__ __forceinline__ void decode_zero_out(const DecodeArgs& a, int col, int p, int64_t b, int64_t h) {
  if (col != 0 || p < 0) return;
  for (int64_t t = 0; t < a.ntokens; ++t)
    store_float(a.out, b * a.out_stride.s0 + t * a.out_stride.s1 + h * a.out_stride.s2 + p, a.dtype, 0.0f);
}

}  // namespace mamba2ssd::cuda
