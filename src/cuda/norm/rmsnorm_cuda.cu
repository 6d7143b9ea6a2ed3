// gated_rmsnorm_cuda and gated_rmsnorm_backward_cuda: the layer's gated RMSNorm (mamba2ssd.h,
// GatedRmsNormParams). A block of 256 threads takes one group of one row, each thread kPer of its
// features (the thread's index, then every 256th), held in registers between the group's sum and
// its outputs; sums over the group are warp shuffles, then the warps' sums in order. The backward's
// blocks each walk rows (a fixed stride apart) of one group, keeping their threads' sums of dweight
// in registers; a second kernel adds the blocks' sums in order (no atomics: the same bits every run).
// No allocation, no synchronization: safe in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/check.h"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/tile/types.cuh"
#include "cuda/common/launch.h"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {
namespace cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kNormWarps = kNormThreads / 32;
constexpr int64_t kNormWalkerBlocks = 1024;  // the backward's blocks, all groups together (at most)

struct NormArgs {
  const void* y;  Strides2 y_stride;
  const void* z;  Strides2 z_stride;  // or null
  const float* weight;
  void* out;  Strides2 out_stride;    // the forward's out, the backward's dy
  const void* dout;  Strides2 dout_stride;
  void* dz;  Strides2 dz_stride;
  float* partials;  // [walkers, dim]: each backward block's sums of dweight
  float* dweight;
  int64_t rows, dim, group_size, walkers;
  float eps;
  bool norm_before_gate;
};

template <typename T>
__device__ __forceinline__ float load(const void* base, const Strides2& s, int64_t r, int64_t f) {
  return tile::to_float(static_cast<const T*>(base)[r * s.s0 + f * s.s1]);
}
template <typename T>
__device__ __forceinline__ void store(void* base, const Strides2& s, int64_t r, int64_t f, float v) {
  static_cast<T*>(base)[r * s.s0 + f * s.s1] = tile::from_float<T>(v);
}

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// The block's sum of v, the same on every thread, in a fixed order. s_warp: kNormWarps floats.
__device__ __forceinline__ float block_sum(float v, float* s_warp) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kNormWarps; ++w) total += s_warp[w];
  __syncthreads();  // s_warp is reused by the next sum
  return total;
}

// One group of one row in a thread's registers: feature f0 + threadIdx.x + k * kNormThreads.
template <typename T, int kPer>
struct GroupRow {
  float y[kPer], z[kPer], g[kPer], n[kPer];  // g = silu(z) (1 without z); n = v r
  float r;
  __device__ static bool valid(const NormArgs& a, int k) { return threadIdx.x + k * kNormThreads < a.group_size; }
  __device__ GroupRow(const NormArgs& a, int64_t row, int64_t f0, float* s_warp) {
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      y[k] = z[k] = n[k] = 0.0f, g[k] = 1.0f;
      if (!valid(a, k)) continue;
      const int64_t f = f0 + threadIdx.x + k * kNormThreads;
      y[k] = load<T>(a.y, a.y_stride, row, f);
      if (a.z) z[k] = load<T>(a.z, a.z_stride, row, f), g[k] = z[k] * sigmoid(z[k]);
      n[k] = a.z && !a.norm_before_gate ? y[k] * g[k] : y[k];  // v for now
      squares += n[k] * n[k];
    }
    r = 1.0f / sqrtf(block_sum(squares, s_warp) / static_cast<float>(a.group_size) + a.eps);
#pragma unroll
    for (int k = 0; k < kPer; ++k) n[k] *= r;
  }
};

template <typename T, int kPer>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(NormArgs a) {
  __shared__ float s_warp[kNormWarps];
  const int64_t row = blockIdx.x, f0 = int64_t{blockIdx.y} * a.group_size;
  const GroupRow<T, kPer> gr(a, row, f0, s_warp);
  const bool gate_after = a.z && a.norm_before_gate;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    if (!gr.valid(a, k)) continue;
    const int64_t f = f0 + threadIdx.x + k * kNormThreads;
    store<T>(a.out, a.out_stride, row, f, gr.n[k] * a.weight[f] * (gate_after ? gr.g[k] : 1.0f));
  }
}

// With d = dout (times g when the gate comes after the norm): dweight += d n, dn = d w,
// dv = r (dn - n mean(dn n)); dy = dv (times g when the gate comes first), and dz from d or dv.
template <typename T, int kPer>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_backward_kernel(NormArgs a) {
  __shared__ float s_warp[kNormWarps];
  const int64_t f0 = int64_t{blockIdx.y} * a.group_size;
  float w[kPer], dw[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + k * kNormThreads;
    w[k] = i < a.group_size ? a.weight[f0 + i] : 0.0f, dw[k] = 0.0f;
  }
  for (int64_t row = blockIdx.x; row < a.rows; row += a.walkers) {
    const GroupRow<T, kPer> gr(a, row, f0, s_warp);
    float dn[kPer], dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      dn[k] = 0.0f;
      if (!gr.valid(a, k)) continue;
      const int64_t f = f0 + threadIdx.x + k * kNormThreads;
      float d = load<T>(a.dout, a.dout_stride, row, f);
      if (a.z && a.norm_before_gate) {  // out = n w silu(z)
        const float s = sigmoid(gr.z[k]);
        store<T>(a.dz, a.dz_stride, row, f, d * gr.n[k] * w[k] * s * (1.0f + gr.z[k] * (1.0f - s)));
        d *= gr.g[k];
      }
      dw[k] += d * gr.n[k];
      dn[k] = d * w[k];
      dot += dn[k] * gr.n[k];
    }
    const float mean = block_sum(dot, s_warp) / static_cast<float>(a.group_size);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (!gr.valid(a, k)) continue;
      const int64_t f = f0 + threadIdx.x + k * kNormThreads;
      float dv = gr.r * (dn[k] - gr.n[k] * mean);
      if (a.z && !a.norm_before_gate) {  // v = y silu(z)
        const float s = sigmoid(gr.z[k]);
        store<T>(a.dz, a.dz_stride, row, f, dv * gr.y[k] * s * (1.0f + gr.z[k] * (1.0f - s)));
        dv *= gr.g[k];
      }
      store<T>(a.out, a.out_stride, row, f, dv);
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + k * kNormThreads;
    if (i < a.group_size) a.partials[int64_t{blockIdx.x} * a.dim + f0 + i] = dw[k];
  }
}

// dweight[f]: the walkers' sums added in order.
__global__ void __launch_bounds__(kNormThreads) rmsnorm_sums_kernel(NormArgs a) {
  const int64_t f = int64_t{blockIdx.x} * kNormThreads + threadIdx.x;
  if (f >= a.dim) return;
  float s = 0.0f;
  for (int64_t w = 0; w < a.walkers; ++w) s += a.partials[w * a.dim + f];
  a.dweight[f] = s;
}

// kPer: features a thread, the power of two that covers a group (group_size <= 256 * 32: validate).
template <typename F>
void dispatch_per_thread(int64_t group_size, F&& f) {
  const int64_t per = (group_size + kNormThreads - 1) / kNormThreads;
  if (per <= 1) return f(std::integral_constant<int, 1>{});
  if (per <= 2) return f(std::integral_constant<int, 2>{});
  if (per <= 4) return f(std::integral_constant<int, 4>{});
  if (per <= 8) return f(std::integral_constant<int, 8>{});
  if (per <= 16) return f(std::integral_constant<int, 16>{});
  if (per <= 32) return f(std::integral_constant<int, 32>{});
  throw Error("group_size must be at most " + std::to_string(kMaxRmsNormGroup) + ", got " + std::to_string(group_size));
}

NormArgs forward_args(const GatedRmsNormParams& p) {
  NormArgs a{};
  a.y = p.y, a.y_stride = p.y_stride, a.z = p.z, a.z_stride = p.z_stride, a.weight = p.weight;
  a.rows = p.rows, a.dim = p.dim, a.group_size = p.group_size, a.eps = p.eps;
  a.norm_before_gate = p.norm_before_gate;
  return a;
}

int64_t walkers(const GatedRmsNormParams& p) {
  const int64_t groups = p.dim / p.group_size;
  return std::min(p.rows, std::max<int64_t>(1, kNormWalkerBlocks / groups));
}

}  // namespace
}  // namespace cuda

void gated_rmsnorm_cuda(const GatedRmsNormParams& p, void* stream) {
  validate(p);
  cuda::NormArgs a = cuda::forward_args(p);
  a.out = p.out, a.out_stride = p.out_stride;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.dim / p.group_size));
  cuda::dispatch_dtype(p.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_per_thread(p.group_size, [&](auto per) {
      cuda::launch(cuda::rmsnorm_kernel<T, decltype(per)::value>, "rmsnorm_kernel", grid, cuda::kNormThreads, 0,
                   static_cast<cudaStream_t>(stream), a);
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
  a.walkers = cuda::walkers(f);
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(a.walkers), static_cast<unsigned>(f.dim / f.group_size));
  const dim3 sums_grid(static_cast<unsigned>((f.dim + cuda::kNormThreads - 1) / cuda::kNormThreads));
  cuda::dispatch_dtype(f.dtype, [&](auto t) {
    using T = decltype(t);
    cuda::dispatch_per_thread(f.group_size, [&](auto per) {
      cuda::launch(cuda::rmsnorm_backward_kernel<T, decltype(per)::value>, "rmsnorm_backward_kernel", grid,
                   cuda::kNormThreads, 0, s, a);
    });
  });
  cuda::launch(cuda::rmsnorm_sums_kernel, "rmsnorm_sums_kernel", sums_grid, cuda::kNormThreads, 0, s, a);
}

}  // namespace mamba2ssd
