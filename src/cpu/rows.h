// Rows of a tensor in its storage dtype, converted to and from fp32 for the CPU backends.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_dtype.h"

namespace mamba2ssd::cpu {

// n elements starting at element `offset` of a buffer of dtype t, as fp32. The switch sits outside
// the loops so that each loop is type-specialized (and vectorizes for fp32 and bf16).
inline void load_row(const void* base, int64_t offset, int64_t n, DType t, float* out) {
  switch (t) {
    case DType::kF32: std::memcpy(out, static_cast<const float*>(base) + offset, n * sizeof(float)); return;
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = host::bf16_to_float(src[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = host::f16_to_float(src[i]);
      return;
    }
    case DType::kF64:  // refused by the CPU backends (refuse_f64); here so that the switch is total
      for (int64_t i = 0; i < n; ++i) out[i] = host::load(base, offset + i, t);
      return;
  }
}

inline void store_row(void* base, int64_t offset, int64_t n, DType t, const float* in) {
  switch (t) {
    case DType::kF32: std::memcpy(static_cast<float*>(base) + offset, in, n * sizeof(float)); return;
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = host::float_to_bf16(in[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = host::float_to_f16(in[i]);
      return;
    }
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) host::store(base, offset + i, t, in[i]);
      return;
  }
}

}  // namespace mamba2ssd::cpu
