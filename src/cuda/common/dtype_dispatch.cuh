// From a runtime dtype to the element type of a template instance: f(T{}) with T the type of x, B,
// C, z and y.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

template <typename F>
void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kBF16: return f(__nv_bfloat16{});
    case DType::kF16: return f(__half{});
    case DType::kF32: return f(float{});
    case DType::kF64: throw Error("dtype fp64: the CUDA backend takes fp32, fp16 and bf16 (fp64 runs on the reference backend)");
  }
}

// dispatch_dtype with the forward's choice of fp32 products: f(T{}, std::bool_constant<k3xTf32>{}),
// k3xTf32 true for an fp32 call with fp32_math kAccurate only (the 16-bit types ignore fp32_math, so
// their kernels are built once).
template <typename F>
void dispatch_dtype_math(DType t, Fp32Math math, F&& f) {
  dispatch_dtype(t, [&](auto v) {
    if constexpr (std::is_same_v<decltype(v), float>) {
      if (math == Fp32Math::kAccurate) return f(v, std::true_type{});
    }
    f(v, std::false_type{});
  });
}

// From a runtime head dim (a multiple of 16 up to 128: validate's rule) to the row extent of the
// kernels built per head dim, the least of 32, 64 and 128 that holds it:
// f(std::integral_constant<int, P>{}). Those kernels mask the rows past the head dim (head dim 80 in
// 128: zeros staged, nothing stored).
template <typename F>
void dispatch_headdim(int64_t headdim, F&& f) {
  if (headdim <= 32) return f(std::integral_constant<int, 32>{});
  if (headdim <= 64) return f(std::integral_constant<int, 64>{});
  return f(std::integral_constant<int, 128>{});
}

// Shared memory a block of some kernels takes for a call of dtype t and head dim headdim (host
// planning, for the refusals of GPUs with less of it per block than the H200):
// f(T{}, std::integral_constant<int, P>{}) returns the bytes for element type T and head dim P.
template <typename F>
int smem_bytes_for(DType t, int64_t headdim, F&& f) {
  int bytes = 0;
  dispatch_dtype(t, [&](auto v) { dispatch_headdim(headdim, [&](auto p) { bytes = f(v, p); }); });
  return bytes;
}

}  // namespace mamba2ssd::cuda
