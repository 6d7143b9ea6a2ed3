// What the op binding's files share about torch's types: a shape as text for error messages, the
// library's DType of a torch dtype, strides and the library's layout rule, and the translation of
// the library's exceptions.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>

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

// The library reads every tensor with a contiguous last dimension; copy the rare one without.
inline at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.size(-1) > 1 && t.stride(-1) != 1 ? t.contiguous() : t;
}

inline Strides4 strides4(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }
inline Strides3 strides3(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }
inline Strides2 strides2(const at::Tensor& t) { return {t.stride(0), t.stride(1)}; }

// Runs f, turning the library's exceptions into PyTorch's, each message after `prefix` (the Python
// function's name): mamba2ssd::Error (bad input) a ValueError, CudaError a RuntimeError.
template <typename F>
void rethrow_as_torch(const std::string& prefix, F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    TORCH_CHECK_VALUE(false, prefix + e.what());
  } catch (const CudaError& e) {
    TORCH_CHECK(false, prefix + e.what());
  }
}

}  // namespace mamba2ssd::binding
