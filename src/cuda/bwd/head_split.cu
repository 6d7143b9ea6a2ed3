// Head dim 128 as two heads of 64 on the backward's Hopper kernels (head_split.h): the plan, the
// split call, and its two small kernels (copies of the per-head inputs; sums of the halves'
// gradients). Each is a grid-stride pass over [b, L, heads] (a few megabytes), no atomics.
#include "cuda/bwd/head_split.h"

#include <algorithm>

#include "cuda/common/device.h"
#include "cuda/common/element.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/plan.h"

namespace mamba2ssd::cuda {
namespace {

constexpr int64_t kHalfHeadDim = 64;  // a half's head dim (the Hopper kernels' widest)
constexpr int kSplitThreads = 256;

// Heads P rows apart: a head's rows split into halves that are heads of their own.
bool heads_whole(const Strides4& s, int64_t P) { return s.s2 == P * s.s3; }         // [b, L, H, P]
bool state_heads_whole(const Strides4& s, int64_t P) { return s.s1 == P * s.s2; }   // [b, H, P, N]

// The workspace's sections: q's dt and ddt [b, L, kH] (fp32), then six per-head arrays [kH]:
// A, dt_bias, D, dA, ddt_bias, dD.
std::size_t token_bytes(const ForwardParams& f, int64_t halves) {
  return round_up(sizeof(float) * f.batch * f.seqlen * f.nheads * halves);
}
std::size_t head_bytes(const ForwardParams& f, int64_t halves) { return round_up(sizeof(float) * f.nheads * halves); }

// The split call's half of a [b, L, H, P] stride set, and of a [b, H, P, N] one.
Strides4 half_heads(Strides4 s, int64_t halves) {
  s.s2 /= halves;
  return s;
}
Strides4 half_state_heads(Strides4 s, int64_t halves) {
  s.s1 /= halves;
  return s;
}

struct HeadSplitArgs {
  int64_t halves, batch, seqlen, nheads;  // nheads: the call's (p's)
  const void* dt;  DType dt_dtype;  Strides3 dt_stride;
  const float *A, *dt_bias, *D;           // D: per head only, else null
  void* ddt;  Strides3 ddt_stride;        // dt_dtype
  float *dA, *ddt_bias, *dD;              // dD: per head only, else null
  float *qdt, *qA, *qdt_bias, *qD;        // the split call's copies, contiguous
  const float *qddt, *qdA, *qddt_bias, *qdD;  // its gradients, contiguous
};

// q's dt [b, L, kH] (fp32: every dtype's value exact), A, dt_bias and D [kH]: each half its head's.
__global__ void expand_heads_kernel(const HeadSplitArgs a) {
  const int64_t Hq = a.nheads * a.halves, n = a.batch * a.seqlen * Hq;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t hq = i % Hq, bt = i / Hq, t = bt % a.seqlen, b = bt / a.seqlen, h = hq / a.halves;
    a.qdt[i] = load_float(a.dt, b * a.dt_stride.s0 + t * a.dt_stride.s1 + h * a.dt_stride.s2, a.dt_dtype);
    if (bt == 0) {
      a.qA[hq] = a.A[h];
      if (a.qdt_bias) a.qdt_bias[hq] = a.dt_bias[h];
      if (a.qD) a.qD[hq] = a.D[h];
    }
  }
}

// The halves' sum, first half first.
__device__ __forceinline__ float halves_sum(const float* v, int64_t halves) {
  float s = v[0];
  for (int64_t j = 1; j < halves; ++j) s += v[j];
  return s;
}

// p's ddt (in dt_dtype, at its strides), dA, ddt_bias and dD [H]: the sums of q's halves.
__global__ void fold_heads_kernel(const HeadSplitArgs a) {
  const int64_t H = a.nheads, n = a.batch * a.seqlen * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = i % H, bt = i / H, t = bt % a.seqlen, b = bt / a.seqlen;
    store_float(a.ddt, b * a.ddt_stride.s0 + t * a.ddt_stride.s1 + h * a.ddt_stride.s2, a.dt_dtype,
                halves_sum(a.qddt + i * a.halves, a.halves));
    if (bt == 0) {
      a.dA[h] = halves_sum(a.qdA + h * a.halves, a.halves);
      if (a.ddt_bias) a.ddt_bias[h] = halves_sum(a.qddt_bias + h * a.halves, a.halves);
      if (a.dD) a.dD[h] = halves_sum(a.qdD + h * a.halves, a.halves);
    }
  }
}

HeadSplitArgs split_args(const BackwardParams& p, const BackwardParams& q) {
  const ForwardParams& f = p.fwd;
  const bool D_head = f.D_layout == DLayout::kPerHead;
  HeadSplitArgs a{};
  a.halves = q.fwd.nheads / f.nheads, a.batch = f.batch, a.seqlen = f.seqlen, a.nheads = f.nheads;
  a.dt = f.dt, a.dt_dtype = f.dt_dtype, a.dt_stride = f.dt_stride;
  a.A = f.A, a.dt_bias = f.dt_bias, a.D = D_head ? f.D : nullptr;
  a.ddt = p.ddt, a.ddt_stride = p.ddt_stride;
  a.dA = p.dA, a.ddt_bias = p.ddt_bias, a.dD = D_head ? p.dD : nullptr;
  a.qdt = const_cast<float*>(static_cast<const float*>(q.fwd.dt)), a.qA = const_cast<float*>(q.fwd.A);
  a.qdt_bias = f.dt_bias ? const_cast<float*>(q.fwd.dt_bias) : nullptr;
  a.qD = D_head ? const_cast<float*>(q.fwd.D) : nullptr;
  a.qddt = static_cast<const float*>(q.ddt), a.qdA = q.dA, a.qddt_bias = q.ddt_bias, a.qdD = D_head ? q.dD : nullptr;
  return a;
}

void launch_split_kernel(void (*kernel)(HeadSplitArgs), const char* name, const BackwardParams& p,
                         const BackwardParams& q, void* stream, int64_t elements) {
  const int64_t blocks = std::clamp<int64_t>((elements + kSplitThreads - 1) / kSplitThreads, 1,
                                             int64_t{current_device().sm_count} * 8);
  launch(kernel, name, dim3(static_cast<unsigned>(blocks)), kSplitThreads, 0, static_cast<cudaStream_t>(stream),
         split_args(p, q));
}

}  // namespace

BackwardParams split_heads(const BackwardParams& p, const HeadSplit& s, void* workspace) {
  const ForwardParams& f = p.fwd;
  const int64_t k = s.halves, Hq = f.nheads * k;
  BackwardParams q = p;
  ForwardParams& g = q.fwd;
  g.nheads = Hq, g.headdim = f.headdim / k;
  g.y = nullptr, g.final_states = nullptr, g.varlen_states = nullptr;  // (the backward reads none)
  g.x_stride = half_heads(f.x_stride, k);
  g.z_stride = half_heads(f.z_stride, k);
  g.initial_states_stride = half_state_heads(f.initial_states_stride, k);
  q.dout_stride = half_heads(p.dout_stride, k);
  q.dx_stride = half_heads(p.dx_stride, k);
  q.dz_stride = half_heads(p.dz_stride, k);
  q.dfinal_states_stride = half_state_heads(p.dfinal_states_stride, k);
  q.dinitial_states_stride = half_state_heads(p.dinitial_states_stride, k);
  // (saved_states [b, chunks, H, P, N] and D [H, P] are contiguous: the same memory as 2H heads.)
  // (Planning: the sections at a stand-in address, never read, so that no pointer is null.)
  char* w = static_cast<char*>(workspace ? workspace : reinterpret_cast<void*>(uintptr_t{1} << 20));
  const std::size_t tokens = token_bytes(f, k), heads = head_bytes(f, k);
  auto at = [&](std::size_t offset) { return reinterpret_cast<float*>(w + offset); };
  const Strides3 token_strides{f.seqlen * Hq, Hq, 1};
  g.dt = at(0), g.dt_dtype = DType::kF32, g.dt_stride = token_strides;
  q.ddt = at(tokens), q.ddt_stride = token_strides;
  g.A = at(2 * tokens);
  q.dA = at(2 * tokens + heads);
  if (f.dt_bias) g.dt_bias = at(2 * tokens + 2 * heads), q.ddt_bias = at(2 * tokens + 3 * heads);
  if (f.D_layout == DLayout::kPerHead) g.D = at(2 * tokens + 4 * heads), q.dD = at(2 * tokens + 5 * heads);
  return q;
}

HeadSplit head_split_of(const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  const int64_t P = f.headdim;
  if (P != 2 * kHalfHeadDim) return {};
  if (!heads_whole(f.x_stride, P) || !heads_whole(p.dout_stride, P) || !heads_whole(p.dx_stride, P) ||
      (f.z && (!heads_whole(f.z_stride, P) || !heads_whole(p.dz_stride, P))) ||
      (f.initial_states && !state_heads_whole(f.initial_states_stride, P)) ||
      (p.dinitial_states && !state_heads_whole(p.dinitial_states_stride, P)) ||
      (p.dfinal_states && !state_heads_whole(p.dfinal_states_stride, P)))
    return {};
  HeadSplit s{P / kHalfHeadDim, 0};
  s.bytes = 2 * token_bytes(f, s.halves) + 6 * head_bytes(f, s.halves);
  return s;
}

void launch_expand_heads(const BackwardParams& p, const BackwardParams& q, void* stream) {
  launch_split_kernel(expand_heads_kernel, "expand_heads_kernel", p, q, stream, q.fwd.batch * q.fwd.seqlen * q.fwd.nheads);
}

void launch_fold_heads(const BackwardParams& p, const BackwardParams& q, void* stream) {
  launch_split_kernel(fold_heads_kernel, "fold_heads_kernel", p, q, stream, p.fwd.batch * p.fwd.seqlen * p.fwd.nheads);
}

}  // namespace mamba2ssd::cuda
