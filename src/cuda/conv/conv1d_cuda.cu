// conv1d_cuda and conv1d_backward_cuda: the layer's causal convolution (mamba2ssd.h, Conv1dParams).
// A block takes tiles of kTileChannels channels by kTileTokens tokens. It first stages a tile's
// inputs in shared memory as fp32 (x with the W - 1 tokens before the tile; in the backward also
// those after it, and dout), every thread issuing all its loads before its first store (16 bytes a
// load where the rows allow), so that a tile's bytes are in flight at once; then each warp takes a
// run of consecutive token rows, each lane two channels with the last W rows in registers, and
// silu on the fast exponential (the IEEE forms made these kernels count instructions, not bytes:
// perf-log "Layer l4" to "l6"). The backward's dweight and dbias: each block's sums over its tokens
// go to the workspace, and a second kernel adds them per (channel, tap) in a fixed order (no
// atomics: the same bits every run). No allocation, no synchronization: safe in a CUDA graph.
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
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/math.cuh"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {
namespace cuda {
namespace {

constexpr int kTileChannels = 64;  // a warp's 32 lanes, two channels each
constexpr int kTileTokens = 64;
constexpr int kConvWarps = 8;
constexpr int kConvThreads = kConvWarps * 32;
constexpr int64_t kTargetBlocks = 8192;  // the backward's blocks: enough to fill a GPU several times over
constexpr int kSumWarps = 8;             // the dweight sums kernel: warps a block, each over every 8th segment

// Channels a load (16 bytes of them where every tensor's rows allow one access, else 1), and the
// backward's segments: runs of token tiles a block walks, as many as give about kTargetBlocks
// blocks, so that the workspace (a row of sums a segment) stays a few megabytes at any length.
struct Conv1dPlan {
  int vec = 1;
  int64_t tiles = 0, channel_tiles = 0, tiles_per_segment = 1, segments = 0;
};
Conv1dPlan plan(const Conv1dParams& p, int vec) {
  Conv1dPlan pl;
  pl.vec = vec;
  pl.tiles = (p.seqlen + kTileTokens - 1) / kTileTokens;
  pl.channel_tiles = (p.channels + kTileChannels - 1) / kTileChannels;
  const int64_t want = std::max<int64_t>(1, kTargetBlocks / (p.batch * pl.channel_tiles));
  pl.tiles_per_segment = (pl.tiles + std::min(want, pl.tiles) - 1) / std::min(want, pl.tiles);
  pl.segments = (pl.tiles + pl.tiles_per_segment - 1) / pl.tiles_per_segment;
  return pl;
}

bool channels_aligned(const void* ptr, const Strides3& s, std::size_t es, int vec) {
  return s.s2 == 1 && s.s1 % vec == 0 && s.s0 % vec == 0 && reinterpret_cast<uintptr_t>(ptr) % (vec * es) == 0;
}

// The plan for these tensors (x and out, or x, dout and dx): 16 bytes a load where each allows.
Conv1dPlan plan(const Conv1dParams& p, std::initializer_list<std::pair<const void*, Strides3>> tensors) {
  const int vec = static_cast<int>(16 / dtype_size(p.dtype));
  bool aligned = p.channels % vec == 0;
  for (const auto& [ptr, s] : tensors) aligned = aligned && channels_aligned(ptr, s, dtype_size(p.dtype), vec);
  return plan(p, aligned ? vec : 1);
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
  int64_t seqlen, channels, channel_tiles, tiles_per_segment, segments;
  int64_t items;          // the sums kernel: b * segments
  bool silu;
};

// Rows [first, first + kRows) of the tile's channels c0.. (p points at token 0, channel c0) into
// s as fp32: zeros for tokens outside [0, L) and channels past C. A thread's loads are issued a
// batch at a time (all of them at 16 bytes a load), each batch before its stores to shared memory.
template <typename T, int kVec, int kRows>
__device__ __forceinline__ void stage_rows(float (*s)[kTileChannels], const T* p, int64_t t_step, int64_t first,
                                           int64_t seqlen, int64_t channels_left) {
  constexpr int kPerRow = kTileChannels / kVec, kItems = kRows * kPerRow;
  constexpr int kIters = (kItems + kConvThreads - 1) / kConvThreads;
  constexpr int kBatch = kVec > 1 ? kIters : 8;  // registers: at most 24 floats in flight a thread
#pragma unroll 1
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    float v[kBatch][kVec];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int item = (i0 + i) * kConvThreads + static_cast<int>(threadIdx.x), c = item % kPerRow * kVec;
      const int64_t t = first + item / kPerRow;
      if (i0 + i < kIters && item < kItems && t >= 0 && t < seqlen && c < channels_left) {
        if constexpr (kVec == 1) v[i][0] = tile::to_float(p[t * t_step + c]);
        else tile::load_vec<T, kVec>(p + t * t_step + c, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[i][j] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int item = (i0 + i) * kConvThreads + static_cast<int>(threadIdx.x);
      if (i0 + i >= kIters || item >= kItems) continue;
      float* dst = &s[item / kPerRow][item % kPerRow * kVec];
      if constexpr (kVec % 4 == 0) {
#pragma unroll
        for (int j = 0; j < kVec; j += 4)
          *reinterpret_cast<float4*>(dst + j) = make_float4(v[i][j], v[i][j + 1], v[i][j + 2], v[i][j + 3]);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) dst[j] = v[i][j];
      }
    }
  }
}

// The sequence ids of tokens [first, first + kRows) (0 outside [0, L) or without seq_idx).
template <int kRows>
__device__ __forceinline__ void stage_ids(int32_t* s, const Conv1dArgs& a, int64_t b, int64_t first) {
  for (int r = static_cast<int>(threadIdx.x); r < kRows; r += kConvThreads) {
    const int64_t t = first + r;
    s[r] = a.seq_idx && t >= 0 && t < a.seqlen ? a.seq_idx[b * a.seq_idx_stride.s0 + t * a.seq_idx_stride.s1] : 0;
  }
}

// One lane's two channels c, c + 1: their weights and bias (0 past C).
template <int W>
struct Lane {
  float w[W][2], bias[2];

  __device__ Lane(const Conv1dArgs& a, int64_t c) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool in = c + j < a.channels;
      bias[j] = in && a.bias ? a.bias[c + j] : 0.0f;
#pragma unroll
      for (int k = 0; k < W; ++k) w[k][j] = in ? a.weight[(c + j) * W + k] : 0.0f;
    }
  }
};

// A lane's two channels of the last W rows of a tile in shared memory, in registers: slot k holds
// row r + k when the window ends at row r + W - 1, with its sequence id. A warp takes consecutive
// rows, so that each row is read from shared memory once.
template <int W>
struct Window {
  float2 v[W];
  int32_t id[W];

  // Rows first .. first + W - 2 into slots 1 .. W - 1 (the first push shifts them down).
  __device__ __forceinline__ void start(const float (*rows)[kTileChannels], const int32_t* ids, int first, int col) {
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) {
      v[k + 1] = *reinterpret_cast<const float2*>(&rows[first + k][col]);
      id[k + 1] = ids[first + k];
    }
  }
  __device__ __forceinline__ void push(const float (*rows)[kTileChannels], const int32_t* ids, int row, int col) {
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) v[k] = v[k + 1], id[k] = id[k + 1];
    v[W - 1] = *reinterpret_cast<const float2*>(&rows[row][col]);
    id[W - 1] = ids[row];
  }
  // Whether slot k is of the same sequence as slot `of`.
  __device__ __forceinline__ bool same(int k, int of) const { return id[k] == id[of]; }
};

// The convolution before its activation of the window's last token: a tap of another sequence reads 0.
template <int W>
__device__ __forceinline__ float2 pre(const Lane<W>& ln, const Window<W>& x) {
  float2 v = make_float2(ln.bias[0], ln.bias[1]);
#pragma unroll
  for (int k = 0; k < W; ++k)
    if (x.same(k, W - 1)) v.x += ln.w[k][0] * x.v[k].x, v.y += ln.w[k][1] * x.v[k].y;
  return v;
}

// The rows a warp takes of kRows: a run of consecutive ones, the warps in order.
template <int kRows>
__device__ __forceinline__ int run_start(int warp) {
  return warp * ((kRows + kConvWarps - 1) / kConvWarps);
}
template <int kRows>
__device__ __forceinline__ int run_end(int warp) {
  return min(kRows, run_start<kRows>(warp + 1));
}

// Channels c, c + 1 of token t (p at token 0, channel 0 of the row): one access where the plan
// allows (tile::store_pair), the last channel alone where C is odd.
template <typename T, int kVec>
__device__ __forceinline__ void store_channels(T* p, int64_t t_step, int64_t t, int64_t c, int64_t channels,
                                               float2 v) {
  T* q = p + t * t_step + c;
  if (c + 1 < channels) tile::store_pair(q, kVec > 1, {v.x, v.y});
  else if (c < channels) q[0] = tile::from_float<T>(v.x);
}

template <typename T, int W, int kVec>
__global__ void __launch_bounds__(kConvThreads) conv1d_kernel(Conv1dArgs a) {
  constexpr int kRows = kTileTokens + W - 1;  // tokens t0 - (W - 1) .. t0 + kTileTokens - 1
  __shared__ __align__(16) float xs[kRows][kTileChannels];
  __shared__ int32_t ids[kRows];
  const int64_t b = blockIdx.y, c0 = int64_t{blockIdx.x} % a.channel_tiles * kTileChannels;
  const int64_t t0 = int64_t{blockIdx.x} / a.channel_tiles * kTileTokens;
  stage_rows<T, kVec, kRows>(xs, static_cast<const T*>(a.x) + b * a.x_stride.s0 + c0, a.x_stride.s1, t0 - (W - 1),
                             a.seqlen, a.channels - c0);
  stage_ids<kRows>(ids, a, b, t0 - (W - 1));
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, col = 2 * lane;
  const Lane<W> ln(a, c0 + col);
  T* out = static_cast<T*>(a.out) + b * a.out_stride.s0;
  // Token t0 + r: its taps are rows r .. r + W - 1.
  const int r0 = run_start<kTileTokens>(warp), r1 = run_end<kTileTokens>(warp);
  Window<W> x;
  x.start(xs, ids, r0, col);
  for (int r = r0; r < r1 && t0 + r < a.seqlen; ++r) {
    x.push(xs, ids, r + W - 1, col);
    float2 v = pre(ln, x);
    if (a.silu) v = make_float2(silu(v.x), silu(v.y));
    store_channels<T, kVec>(out, a.out_stride.s1, t0 + r, c0 + col, a.channels, v);
  }
}

// With d[t] = dout[t] act'(pre[t]): dx[s] = sum_i weight[W - 1 - i] d[s + i] over the tokens s + i of
// s's sequence, and the segment's sums of d x[t - (W - 1) + k] (tap k) and of d. Each tile stages x
// from W - 1 tokens before it to W - 1 after (the taps of the d that reach its last tokens' dx)
// and dout with those W - 1 after, turns dout into d in place, then computes dx from d.
template <typename T, int W, int kVec>
__global__ void __launch_bounds__(kConvThreads) conv1d_backward_kernel(Conv1dArgs a) {
  constexpr int kXRows = kTileTokens + 2 * (W - 1);  // tokens t0 - (W - 1) .. t0 + kTileTokens + W - 2
  constexpr int kDRows = kTileTokens + W - 1;        // tokens t0 .. t0 + kTileTokens + W - 2
  __shared__ __align__(16) float xs[kXRows][kTileChannels];
  __shared__ __align__(16) float ds[kDRows][kTileChannels];
  __shared__ int32_t ids[kXRows];
  __shared__ float sums[kConvWarps][W + 1][kTileChannels];
  const int64_t b = blockIdx.y, c0 = int64_t{blockIdx.x} % a.channel_tiles * kTileChannels;
  const int64_t segment = int64_t{blockIdx.x} / a.channel_tiles;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, col = 2 * lane;
  const Lane<W> ln(a, c0 + col);
  const T* x = static_cast<const T*>(a.x) + b * a.x_stride.s0 + c0;
  const T* dout = static_cast<const T*>(a.dout) + b * a.dout_stride.s0 + c0;
  T* dx = static_cast<T*>(a.out) + b * a.out_stride.s0;
  float acc[W + 1][2] = {};  // the segment's sums: taps 0 .. W - 1, then d
  const int64_t first_tile = segment * a.tiles_per_segment;
  for (int64_t tile = first_tile; tile < first_tile + a.tiles_per_segment; ++tile) {
    const int64_t t0 = tile * kTileTokens;
    if (t0 >= a.seqlen) break;
    if (tile > first_tile) __syncthreads();  // the previous tile's reads are done
    stage_rows<T, kVec, kXRows>(xs, x, a.x_stride.s1, t0 - (W - 1), a.seqlen, a.channels - c0);
    stage_rows<T, kVec, kDRows>(ds, dout, a.dout_stride.s1, t0, a.seqlen, a.channels - c0);
    stage_ids<kXRows>(ids, a, b, t0 - (W - 1));
    __syncthreads();
    // d of tokens t0 + r (row r of ds; its taps rows r .. r + W - 1 of xs), and the tile's sums.
    {
      const int r0 = run_start<kDRows>(warp), r1 = run_end<kDRows>(warp);
      Window<W> x;
      x.start(xs, ids, r0, col);
      for (int r = r0; r < r1; ++r) {
        x.push(xs, ids, r + W - 1, col);
        float2 d = *reinterpret_cast<const float2*>(&ds[r][col]);
        if (a.silu) {
          const float2 v = pre(ln, x);
          d.x *= silu_grad(v.x), d.y *= silu_grad(v.y);
        }
        if (t0 + r >= a.seqlen) d = make_float2(0.0f, 0.0f);
        *reinterpret_cast<float2*>(&ds[r][col]) = d;
        if (r >= kTileTokens || t0 + r >= a.seqlen) continue;
#pragma unroll
        for (int k = 0; k < W; ++k)
          if (x.same(k, W - 1)) acc[k][0] += d.x * x.v[k].x, acc[k][1] += d.y * x.v[k].y;
        acc[W][0] += d.x, acc[W][1] += d.y;
      }
    }
    __syncthreads();
    // dx of tokens s = t0 + r: the d of tokens s .. s + W - 1 (rows r .. r + W - 1 of ds, their
    // ids rows r + W - 1 ..) of s's sequence.
    {
      const int r0 = run_start<kTileTokens>(warp), r1 = run_end<kTileTokens>(warp);
      Window<W> d;
      d.start(ds, ids + (W - 1), r0, col);
      for (int r = r0; r < r1 && t0 + r < a.seqlen; ++r) {
        d.push(ds, ids + (W - 1), r + W - 1, col);
        float2 v = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < W; ++i)
          if (d.same(i, 0)) v.x += ln.w[W - 1 - i][0] * d.v[i].x, v.y += ln.w[W - 1 - i][1] * d.v[i].y;
        store_channels<T, kVec>(dx, a.out_stride.s1, t0 + r, c0 + col, a.channels, v);
      }
    }
  }
  // The warps' sums, added in warp order, to the segment's row of the workspace.
#pragma unroll
  for (int k = 0; k <= W; ++k) sums[warp][k][col] = acc[k][0], sums[warp][k][col + 1] = acc[k][1];
  __syncthreads();
  float* part = a.partials + (b * a.segments + segment) * (W + 1) * a.channels + c0;
  for (int i = threadIdx.x; i < (W + 1) * kTileChannels; i += kConvThreads) {
    const int k = i / kTileChannels, ch = i % kTileChannels;
    if (c0 + ch >= a.channels) continue;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kConvWarps; ++w) total += sums[w][k][ch];
    part[k * a.channels + ch] = total;
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

template <typename T, typename F>
void dispatch_vec(int vec, F&& f) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  if (vec == kVec) return f(std::integral_constant<int, kVec>{});
  return f(std::integral_constant<int, 1>{});
}

Conv1dArgs forward_args(const Conv1dParams& p, const Conv1dPlan& pl) {
  Conv1dArgs a{};
  a.x = p.x, a.x_stride = p.x_stride, a.weight = p.weight, a.bias = p.bias;
  a.seq_idx = p.seq_idx, a.seq_idx_stride = p.seq_idx_stride;
  a.seqlen = p.seqlen, a.channels = p.channels, a.silu = p.silu;
  a.channel_tiles = pl.channel_tiles, a.tiles_per_segment = pl.tiles_per_segment, a.segments = pl.segments;
  return a;
}

// The grid: x the (token tile or segment, channel tile) pairs, channel tiles fastest, so that the
// blocks running at once read whole rows; y the batch rows. x is at most 2^31 - 1, y 65535.
dim3 grid_of(const Conv1dParams& p, const Conv1dPlan& pl, int64_t token_blocks) {
  if (p.batch > 65535) throw Error("batch must be at most 65535 on CUDA, got " + std::to_string(p.batch));
  if (token_blocks * pl.channel_tiles > 2147483647)
    throw Error("seqlen * channels = " + std::to_string(p.seqlen) + " * " + std::to_string(p.channels) +
                " is too large for one CUDA launch");
  return dim3(static_cast<unsigned>(token_blocks * pl.channel_tiles), static_cast<unsigned>(p.batch));
}

// The backward's workspace: a row of sums a segment (the plan's segments do not depend on the
// pointers' alignment).
std::size_t partials_bytes(const Conv1dParams& p) {
  return static_cast<std::size_t>(p.batch * plan(p, 1).segments * (p.width + 1) * p.channels) * sizeof(float);
}

}  // namespace
}  // namespace cuda

void conv1d_cuda(const Conv1dParams& p, void* stream) {
  validate(p);
  const cuda::Conv1dPlan pl = cuda::plan(p, {{p.x, p.x_stride}, {p.out, p.out_stride}});
  const dim3 grid = cuda::grid_of(p, pl, pl.tiles);
  cuda::Conv1dArgs a = cuda::forward_args(p, pl);
  a.out = p.out, a.out_stride = p.out_stride;
  cuda::dispatch_dtype(p.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_width(p.width, [&](auto w) {
      cuda::dispatch_vec<T>(pl.vec, [&](auto vec) {
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
  const dim3 grid = cuda::grid_of(f, pl, pl.segments);
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
  const dim3 sums_grid(static_cast<unsigned>((f.channels + 31) / 32), static_cast<unsigned>(f.width + (p.dbias ? 1 : 0)));
  cuda::dispatch_dtype(f.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_width(f.width, [&](auto w) {
      constexpr int W = decltype(w)::value;
      cuda::dispatch_vec<T>(pl.vec, [&](auto vec) {
        cuda::launch(cuda::conv1d_backward_kernel<T, W, decltype(vec)::value>, "conv1d_backward_kernel", grid,
                     cuda::kConvThreads, 0, s, a);
      });
      cuda::launch(cuda::conv1d_sums_kernel<W>, "conv1d_sums_kernel", sums_grid, cuda::kSumWarps * 32, 0, s, a);
    });
  });
}

}  // namespace mamba2ssd
