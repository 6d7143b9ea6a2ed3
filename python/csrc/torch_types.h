// What the op binding's files share about torch's types: a shape as text for error messages, the
// library's DType of a torch dtype, strides and the library's layout rule, and the translation of
// the library's exceptions.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <limits>
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

// A tensor's dtype as PyTorch names it ("BFloat16"), for error messages.
inline std::string dtype_text(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

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

// An int32 or int64 tensor of indices or ids (1-d or 2-d) as int32, the library's type; a cast
// would wrap an int64 entry past int32 (2^32 to 0). Where the host sees such an entry without a
// sync (a CPU tensor), outside(index, value) reports it (index "b, t" for a 2-d tensor, else "i");
// on a GPU, on_gpu(t) says what such entries become before the cast.
constexpr int64_t kInt32Lo = std::numeric_limits<int32_t>::min(), kInt32Hi = std::numeric_limits<int32_t>::max();
template <typename Outside, typename OnGpu>
at::Tensor int32_entries(const at::Tensor& t, Outside&& outside, OnGpu&& on_gpu) {
  if (t.scalar_type() == at::kInt) return t;
  if (!t.device().is_cpu()) return on_gpu(t).to(at::kInt);
  const at::Tensor flat = t.contiguous().view(-1);
  const int64_t* v = flat.data_ptr<int64_t>();
  const int64_t cols = t.dim() == 2 ? t.size(1) : 0;
  for (int64_t i = 0; i < flat.numel(); ++i)
    if (v[i] < kInt32Lo || v[i] > kInt32Hi)
      outside(cols > 0 ? std::to_string(i / cols) + ", " + std::to_string(i % cols) : std::to_string(i), v[i]);
  return t.to(at::kInt);
}

// seq_idx as the library reads it: on a GPU ids outside int32 saturate to its ends, which keeps
// their order and whether each is 0 (ids that differ only past int32 become one); wrapped, a
// sequence lost its restart or took the initial state. fail(message) raises the caller's error.
template <typename Fail>
at::Tensor int32_seq_idx(const at::Tensor& t, Fail&& fail) {
  auto outside = [&](const std::string& at, int64_t v) {
    fail("seq_idx[" + at + "] = " + std::to_string(v) + " is outside int32 (sequence ids are int32)");
  };
  return int32_entries(t, outside, [](const at::Tensor& g) { return g.clamp(kInt32Lo, kInt32Hi); });
}

// An output of an op: the caller's buffer `into` when given (an optional mutable argument, "name":
// a view of a larger tensor, say, written in place, so that the caller needs no copy), else a new
// tensor of `sizes` and `options`. The buffer must have those sizes, dtype and device and a
// contiguous last dimension; fail(message) raises the op's error naming it otherwise.
template <typename Fail>
at::Tensor output_into(const char* name, const std::optional<at::Tensor>& into, at::IntArrayRef sizes,
                       const at::TensorOptions& options, Fail&& fail) {
  if (!into) return at::empty(sizes, options);
  const at::Tensor& t = *into;
  const std::string n(name);
  if (t.device() != options.device())
    fail(n + " is on " + t.device().str() + ", the op's tensors on " + options.device().str());
  if (t.scalar_type() != c10::typeMetaToScalarType(options.dtype()))
    fail(n + " must be " + std::string(c10::toString(c10::typeMetaToScalarType(options.dtype()))) + ", got " +
         std::string(c10::toString(t.scalar_type())));
  if (t.sizes() != sizes) fail(n + " must have shape " + shape_text(sizes) + ", got " + shape_text(t.sizes()));
  if (t.size(-1) > 1 && t.stride(-1) != 1) fail(n + " must have a contiguous last dimension (stride 1)");
  return t;
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
