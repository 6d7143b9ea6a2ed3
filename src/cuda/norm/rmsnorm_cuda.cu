// gated_rmsnorm_cuda and gated_rmsnorm_backward_cuda: the layer's gated RMSNorm (mamba2ssd.h,
// GatedRmsNormParams). A block takes one group of one row, each thread kChunks chunks of kVec adjacent
// features (16 bytes of them when every row is aligned for it, else one), held in registers between
// the group's sum and its outputs; the block is as many warps as the group's chunks need (at most
// 1024 threads; the backward's 512). Sums over the group are warp shuffles, then the warps' sums in
// order. The backward's blocks each walk rows (a fixed stride apart) of one group with dweight in
// registers, the next row's inputs on their way into shared memory while a row is summed and
// written, and need one block sum a row (mean(v^2) and mean(dn v) together), and write the forward's
// output again when asked (fwd.out: the layer's out-projection reads it); a second kernel adds the
// blocks' dweight in a fixed order (no atomics: the same bits every run). No allocation, no
// synchronization: safe in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/common/check.h"
#include "cuda/common/column_sums.cuh"
#include "cuda/common/device.h"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/math.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/types.cuh"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {
namespace cuda {
namespace {

// Threads a block at most: the forward's 1024, so that a 16-bit group of up to 8192 features is one
// 16-byte chunk a thread (at 512, a group of 5120 took two chunks a thread, 52 registers, 960
// threads a multiprocessor, and ran at 2.3 of the copy's 3.0 TB/s: docs/perf-log.md, "Layer l8");
// the backward's 512 (it holds more a thread).
constexpr int kMaxNormThreads = 1024, kMaxBackwardThreads = 512;
constexpr int kMaxNormWarps = kMaxNormThreads / 32, kMaxBackwardWarps = kMaxBackwardThreads / 32;
constexpr int kWalkersPerSm = 4;  // the backward's blocks at most, all groups together (its workspace's rows)
constexpr int kSumWarps = 8;      // the dweight sums kernel: warps a block, each over every 8th walker

struct NormArgs {
  const void* y;  Strides2 y_stride;
  const void* z;  Strides2 z_stride;  // or null
  const float* weight;
  void* out;  Strides2 out_stride;    // the forward's out, the backward's dy
  const void* dout;  Strides2 dout_stride;
  void* dz;  Strides2 dz_stride;
  void* recomputed;  Strides2 recomputed_stride;  // the backward's copy of the forward's out, or null
  float* partials;  // [walkers, dim]: each backward block's sums of dweight
  float* dweight;
  int64_t rows, dim, group_size, walkers;
  float eps;
  bool norm_before_gate;
};

// kVec adjacent features of row r from f: one access when kVec > 1 (unit feature stride, aligned:
// plan_of checks), else one element at any stride.
template <typename T, int kVec>
__device__ __forceinline__ void load(const void* base, const Strides2& s, int64_t r, int64_t f, float (&v)[kVec]) {
  const T* p = static_cast<const T*>(base) + r * s.s0;
  if constexpr (kVec == 1) v[0] = tile::to_float(p[f * s.s1]);
  else tile::load_vec<T, kVec>(p + f, v);
}
template <typename T, int kVec>
__device__ __forceinline__ void store(void* base, const Strides2& s, int64_t r, int64_t f, const float (&v)[kVec]) {
  T* p = static_cast<T*>(base) + r * s.s0;
  if constexpr (kVec == 1) p[f * s.s1] = tile::from_float<T>(v[0]);
  else tile::store_vec<T, kVec>(p + f, v);
}

// The block's sums of a and b, the same on every thread, in a fixed order. s_warp: a float2 a warp.
__device__ __forceinline__ float2 block_sum(float a, float b, float2* s_warp) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o), b += __shfl_xor_sync(0xffffffffu, b, o);
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = make_float2(a, b);
  __syncthreads();
  float2 total = make_float2(0.0f, 0.0f);
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total.x += s_warp[w].x, total.y += s_warp[w].y;
  __syncthreads();  // s_warp is reused by the next sum
  return total;
}

// A thread's chunk k of a group: features (k * blockDim.x + threadIdx.x) * kVec + j of it.
template <int kVec>
__device__ __forceinline__ int64_t chunk_start(int k) {
  return (int64_t{k} * blockDim.x + threadIdx.x) * kVec;
}

// The gate g = silu(z) and its derivative gd (1 and 0 without z).
struct Gate {
  float g, gd;
};
__device__ __forceinline__ Gate gate_of(const NormArgs& a, float z) {
  if (!a.z) return {1.0f, 0.0f};
  const float s = sigmoid(z);
  return {z * s, silu_grad(z, s)};
}
// What the norm normalizes: v = y, or y g when the gate comes first.
__device__ __forceinline__ float normed(const NormArgs& a, float y, const Gate& gt) {
  return a.z && !a.norm_before_gate ? y * gt.g : y;
}
// dout as it reaches the normalized value: times g when the gate comes after the norm.
__device__ __forceinline__ float through_gate(const NormArgs& a, float d, const Gate& gt) {
  return a.z && a.norm_before_gate ? d * gt.g : d;
}

// One row of a thread's chunks, y and z (0 without z; 0 past the group's end). Registers hold the
// inputs only (the gate is computed again where used).
template <typename T, int kVec, int kChunks>
struct Chunks {
  float y[kChunks][kVec], z[kChunks][kVec];
  __device__ Chunks(const NormArgs& a, int64_t row, int64_t f0) {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) y[k][j] = z[k][j] = 0.0f;
      const int64_t i = chunk_start<kVec>(k);
      if (i >= a.group_size) continue;
      load<T, kVec>(a.y, a.y_stride, row, f0 + i, y[k]);
      if (a.z) load<T, kVec>(a.z, a.z_stride, row, f0 + i, z[k]);
    }
  }
  __device__ float v(const NormArgs& a, int k, int j, const Gate& gt) const { return normed(a, y[k][j], gt); }
};

template <typename T, int kVec, int kChunks>
__global__ void __launch_bounds__(kMaxNormThreads) rmsnorm_kernel(NormArgs a) {
  __shared__ float2 s_warp[kMaxNormWarps];
  const int64_t row = blockIdx.x, f0 = int64_t{blockIdx.y} * a.group_size;
  const Chunks<T, kVec, kChunks> c(a, row, f0);
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k)
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float v = c.v(a, k, j, gate_of(a, c.z[k][j]));
      squares += v * v;
    }
  const float r = rsqrtf(block_sum(squares, 0.0f, s_warp).x / static_cast<float>(a.group_size) + a.eps);
  const bool gate_after = a.z && a.norm_before_gate;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int64_t i = chunk_start<kVec>(k);
    if (i >= a.group_size) continue;
    float w[kVec], out[kVec];
    tile::load_vec<float, kVec>(a.weight + f0 + i, w);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const Gate gt = gate_of(a, c.z[k][j]);
      out[j] = c.v(a, k, j, gt) * r * w[j] * (gate_after ? gt.g : 1.0f);
    }
    store<T, kVec>(a.out, a.out_stride, row, f0 + i, out);
  }
}

// One chunk of a row for the backward: y, z (0 without z), dout and the weights; from global
// memory, or from the 16-byte pieces a thread staged (StagedRows).
template <typename T, int kVec>
struct ChunkIn {
  float y[kVec], z[kVec], d[kVec], w[kVec];
  __device__ ChunkIn(const NormArgs& a, int64_t row, int64_t f) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) z[j] = 0.0f;
    load<T, kVec>(a.y, a.y_stride, row, f, y);
    if (a.z) load<T, kVec>(a.z, a.z_stride, row, f, z);
    load<T, kVec>(a.dout, a.dout_stride, row, f, d);
    tile::load_vec<float, kVec>(a.weight + f, w);
  }
  __device__ ChunkIn(const NormArgs& a, const uint4* ys, const uint4* zs, const uint4* ds, int64_t f) {
    static_assert(kVec * sizeof(T) == 16, "a staged chunk is one 16-byte piece");
#pragma unroll
    for (int j = 0; j < kVec; ++j) z[j] = 0.0f;
    tile::load_vec<T, kVec>(reinterpret_cast<const T*>(ys), y);
    if (a.z) tile::load_vec<T, kVec>(reinterpret_cast<const T*>(zs), z);
    tile::load_vec<T, kVec>(reinterpret_cast<const T*>(ds), d);
    tile::load_vec<float, kVec>(a.weight + f, w);
  }
};

// The backward's rows in shared memory, two in turn (16-byte chunks only): each thread copies its
// own chunks of y, dout and z by cp.async, the next row's as soon as this row's have landed, so
// that they are in flight while this row is summed and written; no barrier guards a stage (a thread
// reads only what it copied, after its own wait). Layout [stage][tensor][chunk][thread], 16 bytes
// a piece: a warp's pieces are adjacent.
template <typename T, int kVec, int kChunks>
struct StagedRows {
  uint4* smem;
  int tensors;  // y, dout and, with a gate, z
  static int bytes(int threads, bool gated) { return 2 * (gated ? 3 : 2) * kChunks * threads * 16; }
  __device__ uint4* at(int stage, int tensor, int k) const {
    return smem + ((stage * tensors + tensor) * kChunks + k) * blockDim.x + threadIdx.x;
  }
  __device__ void issue(const NormArgs& a, int stage, int64_t row, int64_t f0) const {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t i = chunk_start<kVec>(k);
      if (i >= a.group_size) continue;
      auto copy = [&](int tensor, const void* base, const Strides2& st) {
        const T* src = static_cast<const T*>(base) + row * st.s0 + f0 + i;
        tile::cp_async_16(at(stage, tensor, k), src, true);
      };
      copy(0, a.y, a.y_stride);
      copy(1, a.dout, a.dout_stride);
      if (a.z) copy(2, a.z, a.z_stride);
    }
    tile::cp_async_commit();
  }
  __device__ ChunkIn<T, kVec> chunk(const NormArgs& a, int stage, int k, int64_t f) const {
    return ChunkIn<T, kVec>(a, at(stage, 0, k), at(stage, 2, k), at(stage, 1, k), f);
  }
};

// With d = dout (times g = silu(z) when the gate comes after the norm), n = v r: dweight += d n,
// dn = d w, dv = r (dn - n mean(dn n)), where mean(dn n) = r mean(dn v) comes from the same block
// sum as mean(v^2); dy = dv (times g when the gate comes first), and dz from dout or dv; with
// a.recomputed, the forward's out = n w (times g after) too. A row's inputs are read twice, for
// its sums and for its outputs: with 16-byte chunks from the stages (StagedRows), else from global
// memory (the second time from L1 or L2; held in registers across the block sum, they left room
// for one block a multiprocessor).
template <typename T, int kVec, int kChunks>
__global__ void __launch_bounds__(kMaxBackwardThreads) rmsnorm_backward_kernel(NormArgs a) {
  constexpr bool kStaged = kVec > 1;
  __shared__ float2 s_warp[kMaxBackwardWarps];
  extern __shared__ uint4 s_rows[];
  const StagedRows<T, kVec, kChunks> rows{s_rows, a.z ? 3 : 2};
  const int64_t f0 = int64_t{blockIdx.y} * a.group_size;
  const bool gate_after = a.z && a.norm_before_gate, gate_before = a.z && !a.norm_before_gate;
  float dw[kChunks][kVec];
#pragma unroll
  for (int k = 0; k < kChunks; ++k)
#pragma unroll
    for (int j = 0; j < kVec; ++j) dw[k][j] = 0.0f;
  if (kStaged) rows.issue(a, 0, blockIdx.x, f0);
  int stage = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += a.walkers, stage ^= 1) {
    if (kStaged) {
      if (row + a.walkers < a.rows) {
        rows.issue(a, stage ^ 1, row + a.walkers, f0);
        tile::cp_async_wait<1>();
      } else {
        tile::cp_async_wait<0>();
      }
    }
    auto chunk = [&](int k, int64_t i) {
      if constexpr (kStaged) return rows.chunk(a, stage, k, f0 + i);
      else return ChunkIn<T, kVec>(a, row, f0 + i);
    };
    float squares = 0.0f, dnv = 0.0f;
    constexpr int kAhead = kVec > 1 ? kChunks : 4;  // chunks whose loads are issued together
#pragma unroll kAhead
    for (int k = 0; k < kChunks; ++k) {
      const int64_t i = chunk_start<kVec>(k);
      if (i >= a.group_size) continue;
      const ChunkIn<T, kVec> c = chunk(k, i);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const Gate gt = gate_of(a, c.z[j]);
        const float v = normed(a, c.y[j], gt);
        squares += v * v, dnv += through_gate(a, c.d[j], gt) * c.w[j] * v;
      }
    }
    const float2 sums = block_sum(squares, dnv, s_warp);
    const float inv_gs = 1.0f / static_cast<float>(a.group_size);
    // r by the forward's formula (its out is written again here; in the last bits the forward's
    // where both split the group alike: the forward's blocks take up to 1024 threads, these 512)
    const float r = rsqrtf(sums.x / static_cast<float>(a.group_size) + a.eps), mean = r * sums.y * inv_gs;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t i = chunk_start<kVec>(k);
      if (i >= a.group_size) continue;
      const ChunkIn<T, kVec> c = chunk(k, i);
      float dy[kVec], dz[kVec], out[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const Gate gt = gate_of(a, c.z[j]);
        const float n = normed(a, c.y[j], gt) * r;
        out[j] = n * c.w[j] * (gate_after ? gt.g : 1.0f);
        if (gate_after) dz[j] = c.d[j] * n * c.w[j] * gt.gd;  // out = n w silu(z)
        const float dk = through_gate(a, c.d[j], gt);
        dw[k][j] += dk * n;
        float dv = r * (dk * c.w[j] - n * mean);
        if (gate_before) dz[j] = dv * c.y[j] * gt.gd, dv *= gt.g;  // v = y silu(z)
        dy[j] = dv;
      }
      store<T, kVec>(a.out, a.out_stride, row, f0 + i, dy);
      if (a.z) store<T, kVec>(a.dz, a.dz_stride, row, f0 + i, dz);
      if (a.recomputed) store<T, kVec>(a.recomputed, a.recomputed_stride, row, f0 + i, out);
    }
  }
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int64_t i = chunk_start<kVec>(k);
    if (i < a.group_size) tile::store_vec<float, kVec>(a.partials + int64_t{blockIdx.x} * a.dim + f0 + i, dw[k]);
  }
}

// dweight[f]: the walkers' sums (striped_column_sum).
__global__ void __launch_bounds__(kSumWarps * 32) rmsnorm_sums_kernel(NormArgs a) {
  const int64_t f = int64_t{blockIdx.x} * 32 + threadIdx.x % 32;
  const float total = striped_column_sum<kSumWarps>(a.partials, a.walkers, a.dim, f, a.dim);
  if (threadIdx.x < 32 && f < a.dim) a.dweight[f] = total;
}

// How a group spreads over a block: kVec features a chunk (16 bytes of them where every tensor's
// rows allow one access, else 1), kChunks chunks a thread (the fewest that keep the block within
// max_threads), and the block's threads (whole warps covering the group's chunks).
struct NormPlan {
  int vec = 1, chunks = 1, threads = 32;
};

bool rows_aligned(const void* p, const Strides2& s, int64_t vec, std::size_t es) {
  return !p || (s.s1 == 1 && s.s0 % vec == 0 && reinterpret_cast<uintptr_t>(p) % (vec * es) == 0);
}

NormPlan plan_of(const GatedRmsNormParams& p, int max_threads,
                 std::initializer_list<std::pair<const void*, Strides2>> rows) {
  const std::size_t es = dtype_size(p.dtype);
  NormPlan pl;
  const int vec = static_cast<int>(16 / es);
  bool aligned = p.group_size % vec == 0 && reinterpret_cast<uintptr_t>(p.weight) % 16 == 0;
  for (const auto& [ptr, s] : rows) aligned = aligned && rows_aligned(ptr, s, vec, es);
  if (aligned) pl.vec = vec;
  const int64_t chunks = p.group_size / pl.vec + (p.group_size % pl.vec != 0);
  while ((chunks + pl.chunks - 1) / pl.chunks > max_threads) pl.chunks *= 2;
  const int64_t threads = (chunks + pl.chunks - 1) / pl.chunks;
  pl.threads = static_cast<int>((threads + 31) / 32 * 32);
  return pl;
}

// The kernel instantiation for a plan made with max_threads kMaxThreads: kVec 16 bytes of T or 1;
// kChunks a power of two up to kMaxRmsNormGroup / (kMaxThreads kVec) (validate's bound on the group).
template <typename T, int kMaxThreads, typename F>
void dispatch_plan(const NormPlan& pl, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  static_assert(kMaxRmsNormGroup <= kMaxThreads * 16, "a thread holds at most 16 features");
  auto chunks = [&](auto vec) {
    constexpr int kMost = kMaxRmsNormGroup / (kMaxThreads * decltype(vec)::value);
    switch (pl.chunks) {
      case 1: return f(vec, std::integral_constant<int, 1>{});
      case 2: if constexpr (kMost >= 2) return f(vec, std::integral_constant<int, 2>{}); break;
      case 4: if constexpr (kMost >= 4) return f(vec, std::integral_constant<int, 4>{}); break;
      case 8: if constexpr (kMost >= 8) return f(vec, std::integral_constant<int, 8>{}); break;
      case 16: if constexpr (kMost >= 16) return f(vec, std::integral_constant<int, 16>{}); break;
    }
    throw Error("group_size must be at most " + std::to_string(kMaxRmsNormGroup));
  };
  if (pl.vec == kVec) return chunks(std::integral_constant<int, kVec>{});
  return chunks(std::integral_constant<int, 1>{});
}

NormArgs forward_args(const GatedRmsNormParams& p) {
  NormArgs a{};
  a.y = p.y, a.y_stride = p.y_stride, a.z = p.z, a.z_stride = p.z_stride, a.weight = p.weight;
  a.rows = p.rows, a.dim = p.dim, a.group_size = p.group_size, a.eps = p.eps;
  a.norm_before_gate = p.norm_before_gate;
  return a;
}

// The backward's blocks a group at most (the workspace's rows of dweight sums).
int64_t walkers(const GatedRmsNormParams& p) {
  const int64_t groups = p.dim / p.group_size, blocks = int64_t{kWalkersPerSm} * current_device().sm_count;
  return std::min(p.rows, std::max<int64_t>(1, blocks / groups));
}

// The backward's blocks a group for a launch: no more than walkers(p) and than run at once (all
// groups together, with `smem` bytes of stages a block), each with the same number of rows (the last
// fewer), so that no second wave of blocks trails the first.
template <typename Kernel>
int64_t resident_walkers(const GatedRmsNormParams& p, Kernel kernel, int threads, int smem) {
  int per_sm = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(rmsnorm_backward_kernel)");
  const int64_t groups = p.dim / p.group_size;
  const int64_t slots = std::clamp<int64_t>(int64_t{per_sm} * current_device().sm_count / groups, 1, walkers(p));
  const int64_t rows_each = (p.rows + slots - 1) / slots;
  return (p.rows + rows_each - 1) / rows_each;
}

}  // namespace
}  // namespace cuda

void gated_rmsnorm_cuda(const GatedRmsNormParams& p, void* stream) {
  validate(p);
  cuda::NormArgs a = cuda::forward_args(p);
  a.out = p.out, a.out_stride = p.out_stride;
  const cuda::NormPlan pl =
      cuda::plan_of(p, cuda::kMaxNormThreads, {{p.y, p.y_stride}, {p.z, p.z_stride}, {p.out, p.out_stride}});
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.dim / p.group_size));
  cuda::dispatch_dtype(p.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_plan<T, cuda::kMaxNormThreads>(pl, [&](auto vec, auto chunks) {
      cuda::launch(cuda::rmsnorm_kernel<T, decltype(vec)::value, decltype(chunks)::value>, "rmsnorm_kernel", grid,
                   pl.threads, 0, static_cast<cudaStream_t>(stream), a);
    });
  });
}

std::size_t cuda_gated_rmsnorm_backward_workspace_bytes(const GatedRmsNormBackwardParams& p) {
  validate(p);
  return static_cast<std::size_t>(cuda::walkers(p.fwd) * p.fwd.dim) * sizeof(float);
}

void gated_rmsnorm_backward_cuda(const GatedRmsNormBackwardParams& p, void* workspace, std::size_t workspace_bytes,
                                 void* stream) {
  validate(p);
  const GatedRmsNormParams& f = p.fwd;
  const std::size_t need = static_cast<std::size_t>(cuda::walkers(f) * f.dim) * sizeof(float);
  if (!workspace || workspace_bytes < need)
    throw Error("workspace: the norm's backward needs " + std::to_string(need) + " bytes, got " +
                (workspace ? std::to_string(workspace_bytes) + " bytes" : std::string("null")) +
                " (cuda_gated_rmsnorm_backward_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) throw Error("workspace: not 256-byte aligned");
  cuda::NormArgs a = cuda::forward_args(f);
  a.out = p.dy, a.out_stride = p.dy_stride, a.dout = p.dout, a.dout_stride = p.dout_stride;
  a.dz = p.dz, a.dz_stride = p.dz_stride, a.partials = static_cast<float*>(workspace), a.dweight = p.dweight;
  a.recomputed = f.out, a.recomputed_stride = f.out_stride;
  const cuda::NormPlan pl =
      cuda::plan_of(f, cuda::kMaxBackwardThreads,
                    {{f.y, f.y_stride}, {f.z, f.z_stride}, {f.out, f.out_stride}, {p.dout, p.dout_stride},
                     {p.dy, p.dy_stride}, {p.dz, p.dz_stride}});
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 sums_grid(static_cast<unsigned>((f.dim + 31) / 32));
  cuda::dispatch_dtype(f.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_plan<T, cuda::kMaxBackwardThreads>(pl, [&](auto vec, auto chunks) {
      constexpr int kVec = decltype(vec)::value, kChunks = decltype(chunks)::value;
      auto kernel = cuda::rmsnorm_backward_kernel<T, kVec, kChunks>;
      using Staged = cuda::StagedRows<T, kVec, kChunks>;
      const int smem = kVec > 1 ? Staged::bytes(pl.threads, f.z != nullptr) : 0;
      // (the instance's largest stages: the limit then never shrinks under another thread's launch)
      if (kVec > 1) cuda::allow_smem(kernel, Staged::bytes(cuda::kMaxBackwardThreads, true), true);
      a.walkers = cuda::resident_walkers(f, kernel, pl.threads, smem);
      const dim3 grid(static_cast<unsigned>(a.walkers), static_cast<unsigned>(f.dim / f.group_size));
      cuda::launch(kernel, "rmsnorm_backward_kernel", grid, pl.threads, smem, s, a);
    });
  });
  cuda::launch(cuda::rmsnorm_sums_kernel, "rmsnorm_sums_kernel", sums_grid, cuda::kSumWarps * 32, 0, s, a);
}

}  // namespace mamba2ssd
