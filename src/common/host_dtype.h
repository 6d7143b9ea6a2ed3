// Host-side conversions between fp32 and the 16-bit storage types, and typed element access through
// a DType tag. Round-to-nearest-even, NaN preserved, as the CUDA intrinsics do.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::host {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0u));
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absu < 0x38800000u) {  // subnormal or zero in f16: scale into integer units of 2^-24
    float a = bits_float(absu);
    float scaled = a * 16777216.0f;  // exact
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = absu & 0x7fffffu;
  uint32_t exp = (absu >> 23) - 112;  // rebias 127 -> 15
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}
inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

// Reads element i of a buffer of type t as float.
inline float load(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kF64: return static_cast<float>(static_cast<const double*>(base)[i]);
  }
  return 0.0f;
}

// Writes v (rounded to t) to element i of a buffer of type t.
inline void store(void* base, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; return;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = float_to_f16(v); return;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); return;
    case DType::kF64: static_cast<double*>(base)[i] = v; return;
  }
}

// The fp64 oracle's access: element i as a double, and a double stored into t (through fp32 for the
// types narrower than fp64, as the backends round). Exact for fp64, where load and store are not.
inline double load_double(const void* base, int64_t i, DType t) {
  return t == DType::kF64 ? static_cast<const double*>(base)[i] : load(base, i, t);
}
inline void store_double(void* base, int64_t i, DType t, double v) {
  if (t == DType::kF64) static_cast<double*>(base)[i] = v;
  else store(base, i, t, static_cast<float>(v));
}

// fp32 value rounded through t and back (what storing in t loses).
inline float round_to(DType t, float v) {
  switch (t) {
    case DType::kF32: return v;
    case DType::kF16: return f16_to_float(float_to_f16(v));
    case DType::kBF16: return bf16_to_float(float_to_bf16(v));
    case DType::kF64: return v;
  }
  return v;
}

}  // namespace mamba2ssd::host
