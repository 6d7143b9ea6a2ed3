// What every kernel of the CUDA forward receives: the caller's params, the workspace carved out of
// the caller's buffer, and the sizes derived once on the host.
#pragma once

#include <cstdint>

#include "common/dt.h"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Scratch shared by the kernels, all in [batch, head, token]-major order so that a chunk's values
// are one contiguous run. Tokens are padded to whole chunks (padding has dt = 0: no effect).
struct Workspace {
  float* dt;       // [b, H, Lpad] dt after bias, softplus and clamp
  float* g;        // [b, H, Lpad] within-chunk inclusive cumsum of A * dt, times log2(e)
  int32_t* seq;    // [b, Lpad] sequence id per token; nullptr when the call has no resets
  float* states;   // [b, nchunks, H, P, N] state entering each chunk
};

struct Args {
  ForwardParams p;
  Workspace ws;
  int64_t nchunks;   // chunks of the kernels' chunk length
  int64_t lpad;      // nchunks * chunk
  bool resets;       // seq_idx or cu_seqlens given
  // 16-byte alignment of each staged tensor (base pointer and every stride).
  bool x_aligned, B_aligned, C_aligned;
};

// Scalar element of a tensor of runtime dtype t, as float.
__device__ __forceinline__ float load_as_float(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ float silu(float z) { return z / (1.0f + __expf(-z)); }

// Offsets in the workspace.
__device__ __forceinline__ int64_t token_index(const Args& a, int64_t b, int64_t h, int64_t t) {
  return (b * a.p.nheads + h) * a.lpad + t;
}
__device__ __forceinline__ int64_t state_index(const Args& a, int64_t b, int64_t c, int64_t h) {
  return ((b * a.nchunks + c) * a.p.nheads + h) * a.p.headdim * a.p.dstate;
}

// Sequence id of token t (padding belongs to the last real token's sequence).
__device__ __forceinline__ int32_t seq_of(const Args& a, int64_t b, int64_t t) {
  return a.ws.seq[b * a.lpad + t];
}

}  // namespace mamba2ssd::cuda
