// What the op binding's files share about torch's types: a shape as text for error messages, and
// the library's DType of a torch dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::binding {

// "[2, 16, 4]" (without iostreams: see src/common/text.h).
inline std::string shape_text(at::IntArrayRef v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// float32, float16, bfloat16 and float64 (the reference backend's); nullopt for any other.
inline std::optional<DType> library_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kF32;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kDouble: return DType::kF64;
    default: return std::nullopt;
  }
}

}  // namespace mamba2ssd::binding
