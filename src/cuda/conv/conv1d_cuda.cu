// conv1d_cuda and conv1d_backward_cuda: the layer's causal convolution (mamba2ssd.h, Conv1dParams).
// A block takes tiles of kTileChannels channels by kTileTokens tokens, a run of consecutive token
// tiles of one channel tile (a segment). It stages each tile in shared memory in the input's dtype
// by cp.async (x with the W - 1 tokens before it; in the backward also those after it, and dout),
// the next tile's copies in flight while it computes this one (two stages: with one tile a block,
// its bytes alone, the DRAM idled while blocks computed and stored: perf-log "Layer l7"). Then
// each warp takes a run of consecutive token rows, each lane two channels with the last W rows in
// registers, and silu on the fast exponential (the IEEE forms made these kernels count
// instructions, not bytes: perf-log "Layer l4" to "l6"); without seq_idx the sequence test is
// compiled out. The backward turns dout into d in an fp32 tile, then d into dx; its dweight and
// dbias: each block's sums over its tokens go to the workspace, and a second kernel adds them per
// (channel, tap) in a fixed order (no atomics: the same bits every run). No allocation, no
// synchronization: safe in a CUDA graph.
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
#include "cuda/tile/copy.cuh"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {
namespace cuda {
namespace {

constexpr int kTileChannels = 64;  // a warp's 32 lanes, two channels each
constexpr int kTileTokens = 64;
constexpr int kConvWarps = 8;
constexpr int kConvThreads = kConvWarps * 32;
// Blocks a call aims for: the backward's enough to fill a GPU several times over; the forward's
// fewer, so that each walks several tiles with the next one's copies in flight (a few waves of
// five blocks a multiprocessor).
constexpr int64_t kTargetBlocks = 8192, kForwardTargetBlocks = 4096;
constexpr int kSumWarps = 8;  // the dweight sums kernel: warps a block, each over every 8th segment
// The forward's blocks a multiprocessor the register budget must allow (48 registers a thread, no
// spills at 16-bit inputs): unbounded, ptxas keeps 89 (the staging's addresses across the tiles),
// and two fit.
constexpr int kConvMinBlocks = 5;
// The backward's: three blocks of 16-bit tiles (64 KB of shared memory each) at 80 registers, no
// spills (unbounded, ptxas takes 122, and two fit).
constexpr int kConvBackwardMinBlocks = 3;

// Channels a load (16 bytes of them where every tensor's rows allow one access, else 1), and the
// segments: runs of token tiles a block walks, as many as give about `target` blocks (in the
// backward, so that the workspace, a row of sums a segment, stays a few megabytes at any length).
struct Conv1dPlan {
  int vec = 1;
  int64_t tiles = 0, channel_tiles = 0, tiles_per_segment = 1, segments = 0;
};
Conv1dPlan plan(const Conv1dParams& p, int vec, int64_t target = kTargetBlocks) {
  Conv1dPlan pl;
  pl.vec = vec;
  pl.tiles = (p.seqlen + kTileTokens - 1) / kTileTokens;
  pl.channel_tiles = (p.channels + kTileChannels - 1) / kTileChannels;
  const int64_t want = std::max<int64_t>(1, target / (p.batch * pl.channel_tiles));
  pl.tiles_per_segment = (pl.tiles + std::min(want, pl.tiles) - 1) / std::min(want, pl.tiles);
  pl.segments = (pl.tiles + pl.tiles_per_segment - 1) / pl.tiles_per_segment;
  return pl;
}

bool channels_aligned(const void* ptr, const Strides3& s, std::size_t es, int vec) {
  return s.s2 == 1 && s.s1 % vec == 0 && s.s0 % vec == 0 && reinterpret_cast<uintptr_t>(ptr) % (vec * es) == 0;
}

// The plan for these tensors (x and out, or x, dout and dx): 16 bytes a load where each allows.
Conv1dPlan plan(const Conv1dParams& p, std::initializer_list<std::pair<const void*, Strides3>> tensors,
                int64_t target) {
  const int vec = static_cast<int>(16 / dtype_size(p.dtype));
  bool aligned = p.channels % vec == 0;
  for (const auto& [ptr, s] : tensors) aligned = aligned && channels_aligned(ptr, s, dtype_size(p.dtype), vec);
  return plan(p, aligned ? vec : 1, target);
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

// Rows [first, first + kRows) of channels c0.. (p at token 0, channel c0) into s in
// the input's dtype, zeros for tokens outside [0, L) and channels past C: by cp.async, 16 bytes a
// copy (kVec > 1: the caller commits and waits), else element by element, a thread's loads issued
// eight at a time before their stores.
template <typename T, int kVec, int kRows>
__device__ __forceinline__ void stage_tile(T (*s)[kTileChannels], const T* p, int64_t t_step, int64_t first,
                                           int64_t seqlen, int64_t channels_left) {
  constexpr int kPerRow = kTileChannels / kVec, kItems = kRows * kPerRow;
  if constexpr (kVec > 1) {
    for (int item = threadIdx.x; item < kItems; item += kConvThreads) {
      const int r = item / kPerRow, c = item % kPerRow * kVec;
      const int64_t t = first + r;
      const bool valid = t >= 0 && t < seqlen && c < channels_left;
      tile::cp_async_16(&s[r][c], valid ? p + t * t_step + c : p, valid);
    }
  } else {
    constexpr int kBatch = 8;
#pragma unroll 1
    for (int i0 = threadIdx.x; i0 < kItems; i0 += kBatch * kConvThreads) {
      T v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int item = i0 + i * kConvThreads, r = item / kPerRow, c = item % kPerRow;
        const int64_t t = first + r;
        const bool valid = item < kItems && t >= 0 && t < seqlen && c < channels_left;
        v[i] = valid ? p[t * t_step + c] : tile::from_float<T>(0.0f);
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int item = i0 + i * kConvThreads;
        if (item < kItems) s[item / kPerRow][item % kPerRow] = v[i];
      }
    }
  }
}

// The sequence ids of tokens [first, first + kRows) (0 outside [0, L); the kernels stage them only
// with seq_idx, where kSeq).
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

// Two adjacent elements of a staged row as floats (one shared-memory access).
template <typename E>
__device__ __forceinline__ float2 two(const E* p) {
  float v[2];
  tile::load_pair(p, true, v);
  return make_float2(v[0], v[1]);
}

// A lane's two channels of the last W rows of a tile in shared memory (rows of E: the input's dtype
// or fp32), in registers as fp32: slot k holds row r + k when the window ends at row r + W - 1,
// with its sequence id where kSeq (without seq_idx every token is of one sequence). A warp takes
// consecutive rows, so that each row is read from shared memory once.
template <int W, bool kSeq>
struct Window {
  float2 v[W];
  int32_t id[kSeq ? W : 1];

  // Rows first .. first + W - 2 into slots 1 .. W - 1 (the first push shifts them down).
  template <typename E>
  __device__ __forceinline__ void start(const E (*rows)[kTileChannels], const int32_t* ids, int first, int col) {
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) {
      v[k + 1] = two(&rows[first + k][col]);
      if constexpr (kSeq) id[k + 1] = ids[first + k];
    }
  }
  template <typename E>
  __device__ __forceinline__ void push(const E (*rows)[kTileChannels], const int32_t* ids, int row, int col) {
#pragma unroll
    for (int k = 0; k + 1 < W; ++k) {
      v[k] = v[k + 1];
      if constexpr (kSeq) id[k] = id[k + 1];
    }
    v[W - 1] = two(&rows[row][col]);
    if constexpr (kSeq) id[W - 1] = ids[row];
  }
  // Whether slot k is of the same sequence as slot `of`.
  __device__ __forceinline__ bool same(int k, int of) const {
    if constexpr (kSeq) return id[k] == id[of];
    return true;
  }
};

// The convolution before its activation of the window's last token: a tap of another sequence reads 0.
template <int W, bool kSeq>
__device__ __forceinline__ float2 pre(const Lane<W>& ln, const Window<W, kSeq>& x) {
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

// A segment's tiles in two stages: tile i + 1's copies are issued before tile i is computed (after
// the barrier that ends tile i - 1, the last reader of that stage).
template <typename T, int W, int kVec, bool kSeq>
__global__ void __launch_bounds__(kConvThreads, kConvMinBlocks) conv1d_kernel(Conv1dArgs a) {
  constexpr int kRows = kTileTokens + W - 1;  // tokens t0 - (W - 1) .. t0 + kTileTokens - 1
  __shared__ __align__(16) T xs[2][kRows][kTileChannels];
  __shared__ int32_t ids[2][kSeq ? kRows : 1];
  const int64_t b = blockIdx.y, c0 = int64_t{blockIdx.x} % a.channel_tiles * kTileChannels;
  const int64_t first_tile = int64_t{blockIdx.x} / a.channel_tiles * a.tiles_per_segment;
  const int64_t end = min(a.seqlen, (first_tile + a.tiles_per_segment) * kTileTokens);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, col = 2 * lane;
  const T* x = static_cast<const T*>(a.x) + b * a.x_stride.s0 + c0;
  const auto stage = [&](int64_t t0, int buf) {
    stage_tile<T, kVec, kRows>(xs[buf], x, a.x_stride.s1, t0 - (W - 1), a.seqlen, a.channels - c0);
    if constexpr (kSeq) stage_ids<kRows>(ids[buf], a, b, t0 - (W - 1));
    tile::cp_async_commit();
  };
  stage(first_tile * kTileTokens, 0);
  const Lane<W> ln(a, c0 + col);  // its loads fly with the first tile's
  T* out = static_cast<T*>(a.out) + b * a.out_stride.s0;
  const int r0 = run_start<kTileTokens>(warp), r1 = run_end<kTileTokens>(warp);
  int buf = 0;
  for (int64_t t0 = first_tile * kTileTokens; t0 < end; t0 += kTileTokens, buf ^= 1) {
    tile::cp_async_wait<0>();
    __syncthreads();  // this tile has landed, and every reader of the other stage (the tile before) is done
    if (t0 + kTileTokens < end) stage(t0 + kTileTokens, buf ^ 1);
    // Token t0 + r: its taps are rows r .. r + W - 1.
    Window<W, kSeq> w;
    w.start(xs[buf], ids[buf], r0, col);
#pragma unroll 1
    for (int r = r0; r < r1 && t0 + r < a.seqlen; ++r) {
      w.push(xs[buf], ids[buf], r + W - 1, col);
      float2 v = pre(ln, w);
      if (a.silu) v = make_float2(silu(v.x), silu(v.y));
      store_channels<T, kVec>(out, a.out_stride.s1, t0 + r, c0 + col, a.channels, v);
    }
  }
}

// The backward's shared memory (dynamic: above the 48 KiB a static allocation may take).
template <typename T, int W, bool kSeq>
struct BackwardTiles {
  static constexpr int kXRows = kTileTokens + 2 * (W - 1);  // tokens t0 - (W - 1) .. t0 + kTileTokens + W - 2
  static constexpr int kDRows = kTileTokens + W - 1;        // tokens t0 .. t0 + kTileTokens + W - 2
  T xs[2][kXRows][kTileChannels];
  T douts[2][kDRows][kTileChannels];
  float ds[kDRows][kTileChannels];
  int32_t ids[2][kSeq ? kXRows : 1];
  float sums[kConvWarps][W + 1][kTileChannels];
};

// With d[t] = dout[t] act'(pre[t]): dx[s] = sum_i weight[W - 1 - i] d[s + i] over the tokens s + i of
// s's sequence, and the segment's sums of d x[t - (W - 1) + k] (tap k) and of d. Each tile stages, in
// the input's dtype and two stages as the forward, x from W - 1 tokens before it to W - 1 after
// (the taps of the d that reach its last tokens' dx) and dout with those W - 1 after; computes d
// into an fp32 tile, then dx from d.
template <typename T, int W, int kVec, bool kSeq>
__global__ void __launch_bounds__(kConvThreads, kConvBackwardMinBlocks) conv1d_backward_kernel(Conv1dArgs a) {
  using Tiles = BackwardTiles<T, W, kSeq>;
  constexpr int kXRows = Tiles::kXRows, kDRows = Tiles::kDRows;
  extern __shared__ __align__(16) unsigned char smem[];
  Tiles& sm = *reinterpret_cast<Tiles*>(smem);
  auto& xs = sm.xs;
  auto& douts = sm.douts;
  auto& ds = sm.ds;
  auto& ids = sm.ids;
  auto& sums = sm.sums;
  const int64_t b = blockIdx.y, c0 = int64_t{blockIdx.x} % a.channel_tiles * kTileChannels;
  const int64_t segment = int64_t{blockIdx.x} / a.channel_tiles;
  const int64_t end = min(a.seqlen, (segment + 1) * a.tiles_per_segment * kTileTokens);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, col = 2 * lane;
  const T* x = static_cast<const T*>(a.x) + b * a.x_stride.s0 + c0;
  const T* dout = static_cast<const T*>(a.dout) + b * a.dout_stride.s0 + c0;
  const auto stage = [&](int64_t t0, int buf) {
    stage_tile<T, kVec, kXRows>(xs[buf], x, a.x_stride.s1, t0 - (W - 1), a.seqlen, a.channels - c0);
    stage_tile<T, kVec, kDRows>(douts[buf], dout, a.dout_stride.s1, t0, a.seqlen, a.channels - c0);
    if constexpr (kSeq) stage_ids<kXRows>(ids[buf], a, b, t0 - (W - 1));
    tile::cp_async_commit();
  };
  stage(segment * a.tiles_per_segment * kTileTokens, 0);
  const Lane<W> ln(a, c0 + col);
  T* dx = static_cast<T*>(a.out) + b * a.out_stride.s0;
  float acc[W + 1][2] = {};  // the segment's sums: taps 0 .. W - 1, then d
  int buf = 0;
  for (int64_t t0 = segment * a.tiles_per_segment * kTileTokens; t0 < end; t0 += kTileTokens, buf ^= 1) {
    tile::cp_async_wait<0>();
    __syncthreads();  // this tile has landed; the tile before is done (its stage and ds are free)
    if (t0 + kTileTokens < end) stage(t0 + kTileTokens, buf ^ 1);
    // d of tokens t0 + r (row r of douts; its taps rows r .. r + W - 1 of xs), and the tile's sums.
    {
      const int r0 = run_start<kDRows>(warp), r1 = run_end<kDRows>(warp);
      Window<W, kSeq> xw;
      xw.start(xs[buf], ids[buf], r0, col);
      for (int r = r0; r < r1; ++r) {
        xw.push(xs[buf], ids[buf], r + W - 1, col);
        float2 d = two(&douts[buf][r][col]);
        if (a.silu) {
          const float2 v = pre(ln, xw);
          d.x *= silu_grad(v.x), d.y *= silu_grad(v.y);
        }
        if (t0 + r >= a.seqlen) d = make_float2(0.0f, 0.0f);
        *reinterpret_cast<float2*>(&ds[r][col]) = d;
        if (r >= kTileTokens || t0 + r >= a.seqlen) continue;
#pragma unroll
        for (int k = 0; k < W; ++k)
          if (xw.same(k, W - 1)) acc[k][0] += d.x * xw.v[k].x, acc[k][1] += d.y * xw.v[k].y;
        acc[W][0] += d.x, acc[W][1] += d.y;
      }
    }
    __syncthreads();
    // dx of tokens s = t0 + r: the d of tokens s .. s + W - 1 (rows r .. r + W - 1 of ds, their
    // ids rows r + W - 1 ..) of s's sequence.
    {
      const int r0 = run_start<kTileTokens>(warp), r1 = run_end<kTileTokens>(warp);
      Window<W, kSeq> dw;
      dw.start(ds, ids[buf] + (W - 1), r0, col);
      for (int r = r0; r < r1 && t0 + r < a.seqlen; ++r) {
        dw.push(ds, ids[buf] + (W - 1), r + W - 1, col);
        float2 v = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < W; ++i)
          if (dw.same(i, 0)) v.x += ln.w[W - 1 - i][0] * dw.v[i].x, v.y += ln.w[W - 1 - i][1] * dw.v[i].y;
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

// The kernels' kVec (16 bytes of channels a load, or one) and kSeq (whether seq_idx is given).
template <typename T, typename F>
void dispatch_layout(int vec, bool seq, F&& f) {
  dispatch_vec<T>(vec, [&](auto v) {
    if (seq) return f(v, std::true_type{});
    return f(v, std::false_type{});
  });
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
  const cuda::Conv1dPlan pl = cuda::plan(p, {{p.x, p.x_stride}, {p.out, p.out_stride}}, cuda::kForwardTargetBlocks);
  const dim3 grid = cuda::grid_of(p, pl, pl.segments);
  cuda::Conv1dArgs a = cuda::forward_args(p, pl);
  a.out = p.out, a.out_stride = p.out_stride;
  cuda::dispatch_dtype(p.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_width(p.width, [&](auto w) {
      cuda::dispatch_layout<T>(pl.vec, p.seq_idx != nullptr, [&](auto vec, auto seq) {
        const auto kernel = cuda::conv1d_kernel<T, decltype(w)::value, decltype(vec)::value, decltype(seq)::value>;
        cuda::allow_smem(kernel, 0, true);  // kConvMinBlocks blocks' tiles (fp32: 35 KB each)
        cuda::launch(kernel, "conv1d_kernel", grid, cuda::kConvThreads, 0, static_cast<cudaStream_t>(stream), a);
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
  const cuda::Conv1dPlan pl =
      cuda::plan(f, {{f.x, f.x_stride}, {p.dout, p.dout_stride}, {p.dx, p.dx_stride}}, cuda::kTargetBlocks);
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
  const dim3 sums_grid(static_cast<unsigned>((f.channels + 31) / 32),
                       static_cast<unsigned>(f.width + (p.dbias ? 1 : 0)));
  cuda::dispatch_dtype(f.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_width(f.width, [&](auto w) {
      constexpr int W = decltype(w)::value;
      cuda::dispatch_layout<T>(pl.vec, f.seq_idx != nullptr, [&](auto vec, auto seq) {
        constexpr bool kSeq = decltype(seq)::value;
        const auto kernel = cuda::conv1d_backward_kernel<T, W, decltype(vec)::value, kSeq>;
        constexpr int smem = sizeof(cuda::BackwardTiles<T, W, kSeq>);
        cuda::allow_smem(kernel, smem, true);  // kConvBackwardMinBlocks blocks' tiles
        cuda::launch(kernel, "conv1d_backward_kernel", grid, cuda::kConvThreads, smem, s, a);
      });
      cuda::launch(cuda::conv1d_sums_kernel<W>, "conv1d_sums_kernel", sums_grid, cuda::kSumWarps * 32, 0, s, a);
    });
  });
}

}  // namespace mamba2ssd
