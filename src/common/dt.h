// dt preprocessing of the contract, shared by every backend (host and device):
// d = dt + bias; softplus if asked (identity above 20, as the peer does); clamp to [lo, hi].
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

}  // namespace mamba2ssd
