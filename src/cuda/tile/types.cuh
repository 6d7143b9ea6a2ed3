// Element types of the tile layer: the storage types of x/B/C/y (bf16, fp16, fp32) and their
// conversions. fp32 tiles feed the tensor cores as TF32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace mamba2ssd::tile {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(float v) { return v; }
template <>
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

// Two floats packed as the 32-bit register a 16-bit mma operand wants (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<__half2*>(&v));
}

// fp32 rounded to TF32 (round to nearest, ties away), as a register for the tensor cores.
__device__ __forceinline__ uint32_t to_tf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
  return r;
}

// Two adjacent elements as floats, read in one access when `paired` (the address is aligned for it).
template <typename T>
__device__ __forceinline__ void load_pair(const T* src, bool paired, float (&v)[2]) {
  if (paired) {
    float2 f;
    if constexpr (sizeof(T) == 2) f = unpack2<T>(*reinterpret_cast<const uint32_t*>(src));
    else f = *reinterpret_cast<const float2*>(src);
    v[0] = f.x, v[1] = f.y;
  } else {
    v[0] = to_float(src[0]), v[1] = to_float(src[1]);
  }
}

// Two adjacent elements written in one access when `paired`.
template <typename T>
__device__ __forceinline__ void store_pair(T* dst, bool paired, const float (&v)[2]) {
  if constexpr (sizeof(T) == 2) {
    if (paired) {
      *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v[0], v[1]);
      return;
    }
  } else {
    if (paired) {
      *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
      return;
    }
  }
  dst[0] = from_float<T>(v[0]);
  dst[1] = from_float<T>(v[1]);
}

// The unsigned type of an access of kBytes (2, 4, 8 or 16) bytes.
template <int kBytes> struct AccessOf;
template <> struct AccessOf<2> { using type = uint16_t; };
template <> struct AccessOf<4> { using type = uint32_t; };
template <> struct AccessOf<8> { using type = uint2; };
template <> struct AccessOf<16> { using type = uint4; };

// kVec adjacent elements as floats, in accesses of up to 16 bytes: src aligned to the access
// (kVec * sizeof(T) bytes, or 16 when that is more).
template <typename T, int kVec>
__device__ __forceinline__ void load_vec(const T* src, float (&v)[kVec]) {
  constexpr int kBytes = kVec * sizeof(T) < 16 ? kVec * sizeof(T) : 16, kPer = kBytes / sizeof(T);
  using Access = typename AccessOf<kBytes>::type;
#pragma unroll
  for (int a = 0; a < kVec / kPer; ++a) {
    const Access raw = *reinterpret_cast<const Access*>(src + a * kPer);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[a * kPer + j] = to_float(e[j]);
  }
}

// kVec adjacent elements written from floats, aligned as load_vec's.
template <typename T, int kVec>
__device__ __forceinline__ void store_vec(T* dst, const float (&v)[kVec]) {
  constexpr int kBytes = kVec * sizeof(T) < 16 ? kVec * sizeof(T) : 16, kPer = kBytes / sizeof(T);
  using Access = typename AccessOf<kBytes>::type;
#pragma unroll
  for (int a = 0; a < kVec / kPer; ++a) {
    Access raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < kPer; ++j) e[j] = from_float<T>(v[a * kPer + j]);
    *reinterpret_cast<Access*>(dst + a * kPer) = raw;
  }
}

}  // namespace mamba2ssd::tile
