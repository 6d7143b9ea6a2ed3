// conv1d_cuda and conv1d_backward_cuda: the layer's causal convolution (mamba2ssd.h, Conv1dParams).
// One thread per channel walks a range of tokens (a segment) with the last W tokens' inputs, and in
// the backward their gradients, in registers: each token is read once (and the W - 1 before the
// segment, and in the backward the W - 1 after it, a second time). The threads of a warp take
// consecutive channels, the contiguous dimension, so every token's loads and stores are coalesced.
// The backward's dweight and dbias: each thread's sums over its segment go to the workspace, and a
// second kernel adds them per (channel, tap) in a fixed order (no atomics: the same bits every run).
// No allocation, no synchronization: safe in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {
namespace cuda {
namespace {

constexpr int kConvThreads = 128;   // channels a block
constexpr int64_t kTargetBlocks = 2048;  // enough blocks to fill a GPU several times over
constexpr int64_t kMinSpan = 16;         // tokens a segment at least (the halo is W - 1 <= 3)

// Segments of the token axis: as many as fill the GPU with blocks, each at least kMinSpan tokens.
struct Conv1dPlan {
  int64_t span = 0, segments = 0, channel_blocks = 0;
};
Conv1dPlan plan(const Conv1dParams& p) {
  Conv1dPlan pl;
  pl.channel_blocks = (p.channels + kConvThreads - 1) / kConvThreads;
  const int64_t want = std::max<int64_t>(1, kTargetBlocks / (p.batch * pl.channel_blocks));
  const int64_t most = (p.seqlen + kMinSpan - 1) / kMinSpan;
  const int64_t segments = std::min(want, most);
  pl.span = (p.seqlen + segments - 1) / segments;
  pl.segments = (p.seqlen + pl.span - 1) / pl.span;
  return pl;
}

struct Conv1dArgs {
  const void* x;  Strides3 x_stride;
  const float* weight;
  const float* bias;      // or null
  const int32_t* seq_idx;  Strides2 seq_idx_stride;  // or null
  void* out;  Strides3 out_stride;  // the forward's out, the backward's dx
  const void* dout;  Strides3 dout_stride;
  float* partials;        // [b, segments, W + 1, C]: per segment, the sums of d x per tap and of d
  float* dweight;
  float* dbias;           // or null
  int64_t seqlen, channels, span, segments;
  int64_t items;          // the sums kernel: b * segments
  bool silu;
};

// One thread's channel, its weights and bias, and its window of the last W tokens: slot k holds
// token t - (W - 1) + k (its input and sequence id).
template <typename T, int W>
struct Walk {
  const T* x;
  const int32_t* seq;
  int64_t x_step, seq_step, seqlen;
  float w[W], bias;
  float xw[W] = {};
  int32_t sw[W] = {};

  // The walk of channel c of row b, its window ending just before token t0 (the segment's first).
  __device__ Walk(const Conv1dArgs& a, int64_t b, int64_t c, int64_t t0)
      : x(static_cast<const T*>(a.x) + b * a.x_stride.s0 + c * a.x_stride.s2),
        seq(a.seq_idx ? a.seq_idx + b * a.seq_idx_stride.s0 : nullptr),
        x_step(a.x_stride.s1), seq_step(a.seq_idx_stride.s1), seqlen(a.seqlen),
        bias(a.bias ? a.bias[c] : 0.0f) {
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = a.weight[c * W + k];
    for (int64_t t = t0 - (W - 1); t < t0; ++t) step(t);
  }

  // Moves the window on to token t (a token outside [0, L) reads 0).
  __device__ __forceinline__ void step(int64_t t) {
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) xw[k] = xw[k + 1], sw[k] = sw[k + 1];
    const bool in = t >= 0 && t < seqlen;
    xw[W - 1] = in ? tile::to_float(x[t * x_step]) : 0.0f;
    sw[W - 1] = in && seq ? seq[t * seq_step] : 0;
  }
  // Whether slot k is a tap of the window's last token (a token before 0 reads 0 anyway).
  __device__ __forceinline__ bool tap(int k) const { return sw[k] == sw[W - 1]; }
  // The convolution of the window's last token, before its activation.
  __device__ __forceinline__ float pre() const {
    float v = bias;
#pragma unroll
    for (int k = 0; k < W; ++k) v += tap(k) ? w[k] * xw[k] : 0.0f;
    return v;
  }
};

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float silu_grad(float v) {
  const float s = 1.0f / (1.0f + expf(-v));
  return s * (1.0f + v * (1.0f - s));
}

template <typename T, int W>
__global__ void __launch_bounds__(kConvThreads) conv1d_kernel(Conv1dArgs a) {
  const int64_t c = int64_t{blockIdx.x} * kConvThreads + threadIdx.x, b = blockIdx.z;
  if (c >= a.channels) return;
  const int64_t t0 = int64_t{blockIdx.y} * a.span, t1 = min(t0 + a.span, a.seqlen);
  Walk<T, W> walk(a, b, c, t0);
  T* out = static_cast<T*>(a.out) + b * a.out_stride.s0 + c * a.out_stride.s2;
  for (int64_t t = t0; t < t1; ++t) {
    walk.step(t);
    const float v = walk.pre();
    out[t * a.out_stride.s1] = tile::from_float<T>(a.silu ? silu(v) : v);
  }
}

// With d[t] = dout[t] act'(pre[t]): dx[s] = sum_j weight[W - 1 - j] d[s + j] over the tokens s + j of
// s's sequence, and this segment's sums of d x[t - (W - 1) + k] (tap k) and of d. The walk runs W - 1
// tokens past the segment: their d reach its last tokens' dx (their sums are the next segment's).
template <typename T, int W>
__global__ void __launch_bounds__(kConvThreads) conv1d_backward_kernel(Conv1dArgs a) {
  const int64_t c = int64_t{blockIdx.x} * kConvThreads + threadIdx.x, b = blockIdx.z;
  if (c >= a.channels) return;
  const int64_t t0 = int64_t{blockIdx.y} * a.span, t1 = min(t0 + a.span, a.seqlen);
  Walk<T, W> walk(a, b, c, t0);
  float dw[W];  // d of the window's tokens (those before t0 are never read: dx starts at t0)
  float sum_dx[W], sum_d = 0.0f;
#pragma unroll
  for (int k = 0; k < W; ++k) dw[k] = 0.0f, sum_dx[k] = 0.0f;
  const T* dout = static_cast<const T*>(a.dout) + b * a.dout_stride.s0 + c * a.dout_stride.s2;
  T* dx = static_cast<T*>(a.out) + b * a.out_stride.s0 + c * a.out_stride.s2;
  for (int64_t t = t0; t < t1 + (W - 1); ++t) {
    walk.step(t);
    float d = 0.0f;
    if (t < a.seqlen) {
      d = tile::to_float(dout[t * a.dout_stride.s1]);
      if (a.silu) d *= silu_grad(walk.pre());
      if (t < t1) {
        sum_d += d;
#pragma unroll
        for (int k = 0; k < W; ++k) sum_dx[k] += walk.tap(k) ? d * walk.xw[k] : 0.0f;
      }
    }
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) dw[k] = dw[k + 1];
    dw[W - 1] = d;
    const int64_t s = t - (W - 1);  // the window's first token: every token that taps it is in the window
    if (s >= t0) {
      float v = 0.0f;
#pragma unroll
      for (int j = 0; j < W; ++j) v += walk.sw[j] == walk.sw[0] ? walk.w[W - 1 - j] * dw[j] : 0.0f;
      dx[s * a.out_stride.s1] = tile::from_float<T>(v);
    }
  }
  float* part = a.partials + (b * a.segments + blockIdx.y) * (W + 1) * a.channels + c;
#pragma unroll
  for (int k = 0; k < W; ++k) part[k * a.channels] = sum_dx[k];
  part[W * a.channels] = sum_d;
}

// dweight[c, k] (k < W) and dbias[c] (k = W): the segments' sums added in order.
template <int W>
__global__ void __launch_bounds__(kConvThreads) conv1d_sums_kernel(Conv1dArgs a) {
  const int64_t c = int64_t{blockIdx.x} * kConvThreads + threadIdx.x;
  const int k = blockIdx.y;
  if (c >= a.channels) return;
  float s = 0.0f;
  for (int64_t i = 0; i < a.items; ++i) s += a.partials[(i * (W + 1) + k) * a.channels + c];
  if (k < W) a.dweight[c * W + k] = s;
  else a.dbias[c] = s;
}

template <typename F>
void dispatch_width(int64_t width, F&& f) {
  switch (width) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
  }
  throw Error("width must be 2, 3 or 4, got " + std::to_string(width));
}

Conv1dArgs forward_args(const Conv1dParams& p, const Conv1dPlan& pl) {
  Conv1dArgs a{};
  a.x = p.x, a.x_stride = p.x_stride, a.weight = p.weight, a.bias = p.bias;
  a.seq_idx = p.seq_idx, a.seq_idx_stride = p.seq_idx_stride;
  a.seqlen = p.seqlen, a.channels = p.channels, a.span = pl.span, a.segments = pl.segments, a.silu = p.silu;
  return a;
}

std::size_t partials_bytes(const Conv1dParams& p, const Conv1dPlan& pl) {
  return static_cast<std::size_t>(p.batch * pl.segments * (p.width + 1) * p.channels) * sizeof(float);
}

}  // namespace
}  // namespace cuda

void conv1d_cuda(const Conv1dParams& p, void* stream) {
  validate(p);
  const cuda::Conv1dPlan pl = cuda::plan(p);
  cuda::Conv1dArgs a = cuda::forward_args(p, pl);
  a.out = p.out, a.out_stride = p.out_stride;
  const dim3 grid(static_cast<unsigned>(pl.channel_blocks), static_cast<unsigned>(pl.segments),
                  static_cast<unsigned>(p.batch));
  cuda::dispatch_dtype(p.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_width(p.width, [&](auto w) {
      cuda::launch(cuda::conv1d_kernel<T, decltype(w)::value>, "conv1d_kernel", grid, cuda::kConvThreads, 0,
                   static_cast<cudaStream_t>(stream), a);
    });
  });
}

std::size_t cuda_conv1d_backward_workspace_bytes(const Conv1dBackwardParams& p) {
  validate(p);
  return cuda::partials_bytes(p.fwd, cuda::plan(p.fwd));
}

void conv1d_backward_cuda(const Conv1dBackwardParams& p, void* workspace, std::size_t workspace_bytes,
                          void* stream) {
  validate(p);
  const Conv1dParams& f = p.fwd;
  const cuda::Conv1dPlan pl = cuda::plan(f);
  const std::size_t need = cuda::partials_bytes(f, pl);
  if (!workspace || workspace_bytes < need)
    throw Error("workspace: the convolution's backward needs " + std::to_string(need) + " bytes, got " +
                (workspace ? std::to_string(workspace_bytes) + " bytes" : std::string("null")) +
                " (cuda_conv1d_backward_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) throw Error("workspace: not 256-byte aligned");
  cuda::Conv1dArgs a = cuda::forward_args(f, pl);
  a.out = p.dx, a.out_stride = p.dx_stride, a.dout = p.dout, a.dout_stride = p.dout_stride;
  a.partials = static_cast<float*>(workspace), a.dweight = p.dweight, a.dbias = p.dbias;
  a.items = f.batch * pl.segments;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(pl.channel_blocks), static_cast<unsigned>(pl.segments),
                  static_cast<unsigned>(f.batch));
  const dim3 sums_grid(static_cast<unsigned>(pl.channel_blocks), static_cast<unsigned>(f.width + (p.dbias ? 1 : 0)));
  cuda::dispatch_dtype(f.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_width(f.width, [&](auto w) {
      constexpr int W = decltype(w)::value;
      cuda::launch(cuda::conv1d_backward_kernel<T, W>, "conv1d_backward_kernel", grid, cuda::kConvThreads, 0, s, a);
      cuda::launch(cuda::conv1d_sums_kernel<W>, "conv1d_sums_kernel", sums_grid, cuda::kConvThreads, 0, s, a);
    });
  });
}

}  // namespace mamba2ssd
