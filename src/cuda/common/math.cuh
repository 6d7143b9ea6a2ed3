// Device math shared by every kernel: the fast exponentials and the gate.
#pragma once

namespace mamba2ssd::cuda {

// Decays are kept as log2 (g = cumsum(A dt) * log2(e)), so that every exponential is an exp2.
constexpr float kLog2e = 1.4426950408889634f;

// 2^x in one MUFU instruction (exp2f adds a range check around it). Results below 2^-126 flush to
// zero, which no sum here can tell from the true value.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// z sigmoid(z) with the fast division: an IEEE division adds a slow-path call per element, which
// bloats the epilogues (for z below about -87 the denominator passes 2^126 and __fdividef returns
// 0, where z sigmoid(z) is below 1e-36 anyway).
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }

// sigmoid(z) and silu's derivative sigmoid(z) (1 + z (1 - sigmoid(z))), with the same fast exponential
// and division (about 1e-6 relative error, under fp32's bars; the IEEE forms made the layer's
// elementwise kernels count instructions rather than bytes). sigmoid is 0 below z = -87, as silu.
__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }
// silu'(z) from s = sigmoid(z), for callers that also need s (the norm's gate).
__device__ __forceinline__ float silu_grad(float z, float s) { return s * (1.0f + z * (1.0f - s)); }
__device__ __forceinline__ float silu_grad(float z) { return silu_grad(z, sigmoid(z)); }

}  // namespace mamba2ssd::cuda
