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
    case DType::kF64: throw Error("dtype fp64: the CUDA backend takes fp32, fp16 and bf16 (fp64 runs on the reference backend)");
  }
}

}  // namespace mamba2ssd::cuda
