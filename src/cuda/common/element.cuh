// One element of a tensor whose dtype is known only at run time (dt and its gradient, the decode
// step's small tensors), as float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

__device__ __forceinline__ float load_float(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF64: break;  // refused before any launch (validate)
  }
  return 0.0f;
}

__device__ __forceinline__ void store_float(void* base, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; return;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(v); return;
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); return;
    case DType::kF64: return;  // refused before any launch (validate)
  }
}

}  // namespace mamba2ssd::cuda
