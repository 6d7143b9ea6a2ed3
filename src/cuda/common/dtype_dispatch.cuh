// From a runtime dtype to the element type of a template instance: f(T{}) with T the type of x, B,
// C, z and y.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

template <typename F>
void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kBF16: return f(__nv_bfloat16{});
    case DType::kF16: return f(__half{});
    case DType::kF32: return f(float{});
  }
}

}  // namespace mamba2ssd::cuda
