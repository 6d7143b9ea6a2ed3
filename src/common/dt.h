// dt preprocessing of the contract, shared by every backend (host and device):
// d = dt + bias; softplus if asked (identity above 20, as the peer does); clamp to [lo, hi].
// And its derivative, for the backward.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define M2_HD __host__ __device__ __forceinline__
#else
#define M2_HD inline
#endif

namespace mamba2ssd {

M2_HD float preprocess_dt(float dt, float bias, bool softplus, float lo, float hi) {
  float d = dt + bias;
  if (softplus) d = d <= 20.0f ? log1pf(expf(d)) : d;
  return d < lo ? lo : (d > hi ? hi : d);  // NaN passes through, never hidden
}

// The backward's view of the same step: d (bitwise preprocess_dt's) and its derivative with respect
// to the raw dt, which is also the one with respect to the bias: sigmoid(dt + bias) under softplus
// (1 above 20, where softplus is the identity), times 0 where the clamp holds d at a bound.
struct DtStep {
  float d, dd_ddt;
};
M2_HD DtStep preprocess_dt_step(float dt, float bias, bool softplus, float lo, float hi) {
  float d = dt + bias, grad = 1.0f;
  if (softplus && d <= 20.0f) {
    grad = 1.0f / (1.0f + expf(-d));
    d = log1pf(expf(d));
  }
  if (d < lo) return {lo, 0.0f};
  if (d > hi) return {hi, 0.0f};
  return {d, grad};  // NaN passes through
}

}  // namespace mamba2ssd
