// conv1d_cuda and conv1d_backward_cuda: the layer's causal convolution (mamba2ssd.h, Conv1dParams).
// A thread takes four adjacent channels (one where the rows do not allow one access for them) and
// walks a range of tokens (a segment) with the last W tokens' inputs, and in the backward their
// gradients, in registers: each token is read once (and the W - 1 before the segment, and in the
// backward the W - 1 after it, a second time). The threads of a warp take consecutive channels,
// the contiguous dimension, so every token's accesses are coalesced. The backward's dweight and dbias: each thread's sums over its segment go to the
// workspace, and a second kernel adds them per (channel, tap) in a fixed order (no atomics: the
// same bits every run). No allocation, no synchronization: safe in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "cuda/common/check.h"
#include "cuda/common/column_sums.cuh"
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

constexpr int kConvVec = 4;              // channels a thread where the rows allow one access for them
constexpr int kSumWarps = 8;             // the dweight sums kernel: warps a block, each over every 8th segment

// A thread's channels (kConvVec where every tensor's channels are contiguous and aligned for one
// access, else 1) and the segments of the token axis: as many as fill the GPU with blocks, each at
// least kMinSpan tokens.
struct Conv1dPlan {
  int vec = 1;
  int64_t span = 0, segments = 0, channel_blocks = 0;
};
Conv1dPlan plan(const Conv1dParams& p, int vec) {
  Conv1dPlan pl;
  pl.vec = vec;
  pl.channel_blocks = (p.channels + int64_t{kConvThreads} * vec - 1) / (int64_t{kConvThreads} * vec);
  const int64_t want = std::max<int64_t>(1, kTargetBlocks / (p.batch * pl.channel_blocks));
  const int64_t most = (p.seqlen + kMinSpan - 1) / kMinSpan;
  const int64_t segments = std::min(want, most);
  pl.span = (p.seqlen + segments - 1) / segments;
  pl.segments = (p.seqlen + pl.span - 1) / pl.span;
  return pl;
}

bool channels_aligned(const void* ptr, const Strides3& s, std::size_t es) {
  return s.s2 == 1 && s.s1 % kConvVec == 0 && s.s0 % kConvVec == 0 &&
         reinterpret_cast<uintptr_t>(ptr) % (kConvVec * es) == 0;
}

// The plan for these tensors (x and out, or x, dout and dx): kConvVec channels a thread where each allows.
Conv1dPlan plan(const Conv1dParams& p, std::initializer_list<std::pair<const void*, Strides3>> tensors) {
  bool aligned = p.channels % kConvVec == 0;
  for (const auto& [ptr, s] : tensors) aligned = aligned && channels_aligned(ptr, s, dtype_size(p.dtype));
  return plan(p, aligned ? kConvVec : 1);
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

// kVec adjacent channels of token t: one access when kVec > 1 (unit channel stride, aligned:
// channels_aligned checks), else one element at p (the channel's own address).
template <typename T, int kVec>
__device__ __forceinline__ void load_channels(const T* p, int64_t t_step, int64_t t, float (&v)[kVec]) {
  if constexpr (kVec == 1) v[0] = tile::to_float(p[t * t_step]);
  else tile::load_vec<T, kVec>(p + t * t_step, v);
}
template <typename T, int kVec>
__device__ __forceinline__ void store_channels(T* p, int64_t t_step, int64_t t, const float (&v)[kVec]) {
  if constexpr (kVec == 1) p[t * t_step] = tile::from_float<T>(v[0]);
  else tile::store_vec<T, kVec>(p + t * t_step, v);
}

// One thread's kVec channels, their weights and bias, and their window of the last W tokens: slot
// k holds token t - (W - 1) + k (its inputs and sequence id).
template <typename T, int W, int kVec>
struct Walk {
  const T* x;
  const int32_t* seq;
  int64_t x_step, seq_step, seqlen;
  float w[W][kVec], bias[kVec];
  float xw[W][kVec] = {};
  int32_t sw[W] = {};

  // The walk of channels c.. of row b, its window ending just before token t0 (the segment's first).
  __device__ Walk(const Conv1dArgs& a, int64_t b, int64_t c, int64_t t0)
      : x(static_cast<const T*>(a.x) + b * a.x_stride.s0 + c * a.x_stride.s2),
        seq(a.seq_idx ? a.seq_idx + b * a.seq_idx_stride.s0 : nullptr),
        x_step(a.x_stride.s1), seq_step(a.seq_idx_stride.s1), seqlen(a.seqlen) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      bias[j] = a.bias ? a.bias[c + j] : 0.0f;
#pragma unroll
      for (int k = 0; k < W; ++k) w[k][j] = a.weight[(c + j) * W + k];
    }
    for (int64_t t = t0 - (W - 1); t < t0; ++t) step(t);
  }

  // Token t's inputs and sequence id (0 outside [0, L)).
  struct Token {
    float x[kVec];
    int32_t seq;
  };
  __device__ __forceinline__ Token fetch(int64_t t) const {
    Token tk{};
    if (t >= 0 && t < seqlen) {
      load_channels<T, kVec>(x, x_step, t, tk.x);
      if (seq) tk.seq = seq[t * seq_step];
    }
    return tk;
  }
  // Moves the window on by one token.
  __device__ __forceinline__ void push(const Token& tk) {
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) {
      sw[k] = sw[k + 1];
#pragma unroll
      for (int j = 0; j < kVec; ++j) xw[k][j] = xw[k + 1][j];
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) xw[W - 1][j] = tk.x[j];
    sw[W - 1] = tk.seq;
  }
  __device__ __forceinline__ void step(int64_t t) { push(fetch(t)); }
  // Whether slot k is a tap of the window's last token (a token before 0 reads 0 anyway).
  __device__ __forceinline__ bool tap(int k) const { return sw[k] == sw[W - 1]; }
  // The convolution of the window's last token for channel j, before its activation.
  __device__ __forceinline__ float pre(int j) const {
    float v = bias[j];
#pragma unroll
    for (int k = 0; k < W; ++k) v += tap(k) ? w[k][j] * xw[k][j] : 0.0f;
    return v;
  }
};

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float silu_grad(float v) {
  const float s = 1.0f / (1.0f + expf(-v));
  return s * (1.0f + v * (1.0f - s));
}

// The first of a thread's kVec channels, or -1 past the last.
template <int kVec>
__device__ __forceinline__ int64_t first_channel(const Conv1dArgs& a) {
  const int64_t c = (int64_t{blockIdx.x} * kConvThreads + threadIdx.x) * kVec;
  return c < a.channels ? c : -1;
}

template <typename T, int W, int kVec>
__global__ void __launch_bounds__(kConvThreads) conv1d_kernel(Conv1dArgs a) {
  const int64_t c = first_channel<kVec>(a), b = blockIdx.z;
  if (c < 0) return;
  const int64_t t0 = int64_t{blockIdx.y} * a.span, t1 = min(t0 + a.span, a.seqlen);
  Walk<T, W, kVec> walk(a, b, c, t0);
  T* out = static_cast<T*>(a.out) + b * a.out_stride.s0 + c * a.out_stride.s2;
#pragma unroll 4
  for (int64_t t = t0; t < t1; ++t) {
    walk.step(t);
    float v[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = a.silu ? silu(walk.pre(j)) : walk.pre(j);
    store_channels<T, kVec>(out, a.out_stride.s1, t, v);
  }
}

// With d[t] = dout[t] act'(pre[t]): dx[s] = sum_j weight[W - 1 - j] d[s + j] over the tokens s + j of
// s's sequence, and this segment's sums of d x[t - (W - 1) + k] (tap k) and of d. The walk runs W - 1
// tokens past the segment: their d reach its last tokens' dx (their sums are the next segment's).
template <typename T, int W, int kVec>
__global__ void __launch_bounds__(kConvThreads) conv1d_backward_kernel(Conv1dArgs a) {
  const int64_t c = first_channel<kVec>(a), b = blockIdx.z;
  if (c < 0) return;
  const int64_t t0 = int64_t{blockIdx.y} * a.span, t1 = min(t0 + a.span, a.seqlen);
  Walk<T, W, kVec> walk(a, b, c, t0);
  float dw[W][kVec];  // d of the window's tokens (those before t0 are never read: dx starts at t0)
  float sum_dx[W][kVec], sum_d[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    sum_d[j] = 0.0f;
#pragma unroll
    for (int k = 0; k < W; ++k) dw[k][j] = 0.0f, sum_dx[k][j] = 0.0f;
  }
  const T* dout = static_cast<const T*>(a.dout) + b * a.dout_stride.s0 + c * a.dout_stride.s2;
  T* dx = static_cast<T*>(a.out) + b * a.out_stride.s0 + c * a.out_stride.s2;
#pragma unroll 2
  for (int64_t t = t0; t < t1 + (W - 1); ++t) {
    walk.step(t);
    float d[kVec] = {};
    if (t < a.seqlen) {
      load_channels<T, kVec>(dout, a.dout_stride.s1, t, d);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (a.silu) d[j] *= silu_grad(walk.pre(j));
        if (t < t1) {
          sum_d[j] += d[j];
#pragma unroll
          for (int k = 0; k < W; ++k) sum_dx[k][j] += walk.tap(k) ? d[j] * walk.xw[k][j] : 0.0f;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
#pragma unroll
      for (int k = 0; k + 1 < W; ++k) dw[k][j] = dw[k + 1][j];
      dw[W - 1][j] = d[j];
    }
    const int64_t s = t - (W - 1);  // the window's first token: every token that taps it is in the window
    if (s >= t0) {
      float v[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        v[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < W; ++i) v[j] += walk.sw[i] == walk.sw[0] ? walk.w[W - 1 - i][j] * dw[i][j] : 0.0f;
      }
      store_channels<T, kVec>(dx, a.out_stride.s1, s, v);
    }
  }
  float* part = a.partials + (b * a.segments + blockIdx.y) * (W + 1) * a.channels + c;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
#pragma unroll
    for (int k = 0; k < W; ++k) part[k * a.channels + j] = sum_dx[k][j];
    part[W * a.channels + j] = sum_d[j];
  }
}

// dweight[c, k] (k < W) and dbias[c] (k = W): the segments' sums (striped_column_sum).
template <int W>
__global__ void __launch_bounds__(kSumWarps * 32) conv1d_sums_kernel(Conv1dArgs a) {
  const int k = blockIdx.y;
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x % 32;
  const float total = striped_column_sum<kSumWarps>(a.partials + k * a.channels, a.items, (W + 1) * a.channels, c,
                                                    a.channels);
  if (threadIdx.x >= 32 || c >= a.channels) return;
  if (k < W) a.dweight[c * W + k] = total;
  else a.dbias[c] = total;
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

// The backward's workspace for either plan (the vector plan's segments are at least as many), so that
// its size does not depend on the pointers' alignment.
std::size_t partials_bytes(const Conv1dParams& p) {
  const int64_t segments = std::max(plan(p, 1).segments, plan(p, kConvVec).segments);
  return static_cast<std::size_t>(p.batch * segments * (p.width + 1) * p.channels) * sizeof(float);
}

template <typename F>
void dispatch_vec(int vec, F&& f) {
  if (vec == kConvVec) return f(std::integral_constant<int, kConvVec>{});
  return f(std::integral_constant<int, 1>{});
}

}  // namespace
}  // namespace cuda

void conv1d_cuda(const Conv1dParams& p, void* stream) {
  validate(p);
  const cuda::Conv1dPlan pl = cuda::plan(p, {{p.x, p.x_stride}, {p.out, p.out_stride}});
  cuda::Conv1dArgs a = cuda::forward_args(p, pl);
  a.out = p.out, a.out_stride = p.out_stride;
  const dim3 grid(static_cast<unsigned>(pl.channel_blocks), static_cast<unsigned>(pl.segments),
                  static_cast<unsigned>(p.batch));
  cuda::dispatch_dtype(p.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_width(p.width, [&](auto w) {
      cuda::dispatch_vec(pl.vec, [&](auto vec) {
        cuda::launch(cuda::conv1d_kernel<T, decltype(w)::value, decltype(vec)::value>, "conv1d_kernel", grid,
                     cuda::kConvThreads, 0, static_cast<cudaStream_t>(stream), a);
      });
    });
  });
}

std::size_t cuda_conv1d_backward_workspace_bytes(const Conv1dBackwardParams& p) {
  validate(p);
  return cuda::partials_bytes(p.fwd);
}

void conv1d_backward_cuda(const Conv1dBackwardParams& p, void* workspace, std::size_t workspace_bytes,
                          void* stream) {
  validate(p);
  const Conv1dParams& f = p.fwd;
  const cuda::Conv1dPlan pl = cuda::plan(f, {{f.x, f.x_stride}, {p.dout, p.dout_stride}, {p.dx, p.dx_stride}});
  const std::size_t need = cuda::partials_bytes(f);
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
  const dim3 sums_grid(static_cast<unsigned>((f.channels + 31) / 32), static_cast<unsigned>(f.width + (p.dbias ? 1 : 0)));
  cuda::dispatch_dtype(f.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_width(f.width, [&](auto w) {
      constexpr int W = decltype(w)::value;
      cuda::dispatch_vec(pl.vec, [&](auto vec) {
        cuda::launch(cuda::conv1d_backward_kernel<T, W, decltype(vec)::value>, "conv1d_backward_kernel", grid,
                     cuda::kConvThreads, 0, s, a);
      });
      cuda::launch(cuda::conv1d_sums_kernel<W>, "conv1d_sums_kernel", sums_grid, cuda::kSumWarps * 32, 0, s, a);
    });
  });
}

}  // namespace mamba2ssd
