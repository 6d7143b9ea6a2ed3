// The fast CPU forward: the contract's sequential recurrence in fp32, multithreaded over work items
// of (batch, head, 32 head dims; 16 where 32 does not divide the head dim). chunk_size does not
// change the function; it is only validated.
//
// Why the recurrence: the chunked matmul form does 4NP + 2QP + 2QN/(H/G) flops per token and head
// against 4NP here, and with SSE (no FMA, two-operand instructions) a blocked GEMM is not cheaper
// per flop. One (batch, head) of the default problem, one thread, best of several runs on the
// project's 2-core x86-64-v2 machine: a plain chunked form (Q 64) 0.058 s, the plain recurrence
// (h = e*h + u*B; y = h.C, vectorized over N) 0.037 s, the rescaled one below 0.024 s.
//
// Rescaling: keep g = h / s, s the product of decays since the last fold. Then a token is
// g += (d/s) x B^T and y = s (g C): two multiplies and two adds per state element, no decay pass.
// log s is summed in fp64; when it would leave [-kMaxLogScale, kMaxLogScale], or a sequence resets,
// the state is folded once (g *= s, log s = 0), so 1/s stays far from fp32 overflow.
//
// Layout: an item's state block is g[N][32] (16 KiB at N 128, in L1); the inner loop runs over the
// 32 dims, so y's accumulators stay in vector registers. Items are independent: results do not
// depend on the thread count or on scheduling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "api/internal.h"
#include "common/dt.h"
#include "common/host_dtype.h"
#include "cpu/forward_scan.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace mamba2ssd {
namespace {

using cpu::load_row;
using cpu::store_row;

constexpr double kMaxLogScale = 16.0;   // |log s| bound before a fold: 1/s <= e^16 ~ 9e6

// One token on one state block: g[n][k] += u[k] * B[n]; acc[k] = sum_n g[n][k] * C[n].
// g is 16-byte aligned (operator new's alignment), which lets SSE fold its loads into the adds.
template <int64_t kBlock>
void scan_token(float* __restrict g_block, const float* __restrict u, const float* __restrict Bt,
                const float* __restrict Ct, int64_t N, float* __restrict acc_out) {
  static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= 16);
  float* g = static_cast<float*>(__builtin_assume_aligned(g_block, 16));
  float uk[kBlock], acc[kBlock];
  for (int64_t k = 0; k < kBlock; ++k) {  // n = 0 starts the sums (a zero fill becomes a slow rep stos)
    uk[k] = u[k];
    g[k] += uk[k] * Bt[0];
    acc[k] = g[k] * Ct[0];
  }
  for (int64_t n = 1; n < N; ++n) {
    const float b = Bt[n], c = Ct[n];
    float* gn = g + n * kBlock;
    for (int64_t k = 0; k < kBlock; ++k) {
      gn[k] += uk[k] * b;
      acc[k] += gn[k] * c;
    }
  }
  for (int64_t k = 0; k < kBlock; ++k) acc_out[k] = acc[k];
}

// Writes s * g (block [N][kBlock], dims p0 .. p0+kBlock of head h) to entry i0 of a [*, H, P, N]
// tensor of dtype t.
template <int64_t kBlock>
void store_state(const float* g, float s, int64_t N, void* out, DType t, const Strides4& st, int64_t i0,
                 int64_t h, int64_t p0) {
  float row[256];  // N <= 256 (validate)
  for (int64_t k = 0; k < kBlock; ++k) {
    for (int64_t n = 0; n < N; ++n) row[n] = s * g[n * kBlock + k];
    store_row(out, i0 * st.s0 + h * st.s1 + (p0 + k) * st.s2, N, t, row);
  }
}

// The opposite: entry i0 of such a tensor into g (the scale s = 1).
template <int64_t kBlock>
void load_state(float* g, int64_t N, const void* in, DType t, const Strides4& st, int64_t i0, int64_t h,
                int64_t p0) {
  float row[256];
  for (int64_t k = 0; k < kBlock; ++k) {
    load_row(in, i0 * st.s0 + h * st.s1 + (p0 + k) * st.s2, N, t, row);
    for (int64_t n = 0; n < N; ++n) g[n * kBlock + k] = row[n];
  }
}

// The whole recurrence for dims [p0, p0 + kBlock) of (batch b, head h); seqs: see SequenceStates.
template <int64_t kBlock>
void run_item(const ForwardParams& p, const cpu::SequenceStates* seqs, int64_t b, int64_t h, int64_t p0) {
  const int64_t L = p.seqlen, N = p.dstate;
  const int64_t g_idx = h / (p.nheads / p.ngroups);
  const float A = p.A[h];
  const float bias = p.dt_bias ? p.dt_bias[h] : 0.0f;

  float Dk[kBlock] = {};
  if (p.D)
    for (int64_t k = 0; k < kBlock; ++k)
      Dk[k] = p.D_layout == DLayout::kPerHead ? p.D[h] : p.D[h * p.headdim + p0 + k];

  std::vector<float> g(N * kBlock, 0.0f), Bt(N), Ct(N);
  float x[kBlock], u[kBlock], acc[kBlock], z[kBlock], y[kBlock];
  // Empty packed sequences have no last token: their varlen state is zero (g is still zero here),
  // and their slot gets their starting state (written only when that is zero).
  for (int64_t s = 0; p.cu_seqlens && s < p.nseqs; ++s) {
    if (p.cu_seqlens[s] != p.cu_seqlens[s + 1]) continue;
    if (p.varlen_states)
      store_state<kBlock>(g.data(), 1.0f, N, p.varlen_states, DType::kF32, p.varlen_states_stride, s, h, p0);
    if (seqs && seqs->write[s] >= 0 && seqs->read[s] < 0)
      store_state<kBlock>(g.data(), 1.0f, N, seqs->cache, seqs->dtype, seqs->stride, seqs->write[s], h, p0);
  }
  if (p.initial_states) {
    const Strides4& st = p.initial_states_stride;
    for (int64_t k = 0; k < kBlock; ++k)
      for (int64_t n = 0; n < N; ++n)
        g[n * kBlock + k] = p.initial_states[b * st.s0 + h * st.s1 + (p0 + k) * st.s2 + n * st.s3];
  }

  double log_s = 0.0;       // log of the scale s: true state = s * g
  int64_t prev_id = 0;      // sequence id of the previous token (0 before token 0)
  int64_t seq = 0;          // with cu_seqlens: the packed sequence holding token t
  for (int64_t t = 0; t < L; ++t) {
    // Sequence bookkeeping: the id of token t (seq_idx, else from cu_seqlens, else 0).
    if (p.cu_seqlens)
      while (p.cu_seqlens[seq + 1] <= t) ++seq;
    const int64_t id = p.seq_idx ? p.seq_idx[b * p.seq_idx_stride.s0 + t * p.seq_idx_stride.s1]
                     : p.cu_seqlens ? seq : 0;
    const bool reset = id != prev_id;
    prev_id = id;
    // A sequence with a slot to start from: its state, which then decays as any state does.
    const bool loads = seqs && (t == 0 || reset) && seqs->read[seq] >= 0;

    const float dt_raw = host::load(p.dt, b * p.dt_stride.s0 + t * p.dt_stride.s1 + h * p.dt_stride.s2, p.dt_dtype);
    const float d = preprocess_dt(dt_raw, bias, p.dt_softplus, p.dt_min, p.dt_max);
    if (loads) {
      load_state<kBlock>(g.data(), N, seqs->cache, seqs->dtype, seqs->stride, seqs->read[seq], h, p0);
      log_s = 0.0;
    }
    const double next = log_s + static_cast<double>(A) * d;
    if (reset && !loads) {  // h = 0, then h = exp(A d) h + ...: the product is NaN when exp(A d) is inf or NaN
      std::fill(g.begin(), g.end(), static_cast<float>(0.0 * std::exp(static_cast<double>(A) * d)));
      log_s = 0.0;
    } else if (!(std::abs(next) <= kMaxLogScale)) {  // fold (also on NaN, which then propagates)
      const float f = static_cast<float>(std::exp(next));
      for (float& v : g) v *= f;
      log_s = 0.0;
    } else {
      log_s = next;
    }
    const double s64 = std::exp(log_s);
    const float s = static_cast<float>(s64), w = static_cast<float>(d / s64);

    const int64_t xo = b * p.x_stride.s0 + t * p.x_stride.s1 + h * p.x_stride.s2 + p0;
    load_row(p.x, xo, kBlock, p.dtype, x);
    load_row(p.B, b * p.B_stride.s0 + t * p.B_stride.s1 + g_idx * p.B_stride.s2, N, p.dtype, Bt.data());
    load_row(p.C, b * p.C_stride.s0 + t * p.C_stride.s1 + g_idx * p.C_stride.s2, N, p.dtype, Ct.data());
    for (int64_t k = 0; k < kBlock; ++k) u[k] = w * x[k];
    scan_token<kBlock>(g.data(), u, Bt.data(), Ct.data(), N, acc);

    for (int64_t k = 0; k < kBlock; ++k) y[k] = s * acc[k];
    if (p.D)
      for (int64_t k = 0; k < kBlock; ++k) y[k] += Dk[k] * x[k];
    if (p.z) {
      load_row(p.z, b * p.z_stride.s0 + t * p.z_stride.s1 + h * p.z_stride.s2 + p0, kBlock, p.dtype, z);
      for (int64_t k = 0; k < kBlock; ++k) y[k] *= z[k] / (1.0f + std::exp(-z[k]));
    }
    store_row(p.y, b * p.y_stride.s0 + t * p.y_stride.s1 + h * p.y_stride.s2 + p0, kBlock, p.dtype, y);

    if (seqs && seqs->every > 0) {  // an intermediate state after every `every` tokens of sequence `seq`
      const int64_t done = t + 1 - p.cu_seqlens[seq], m = done / seqs->every;
      if (done % seqs->every == 0 && m <= seqs->max_boundaries) {
        const int32_t slot = seqs->boundary[seq * seqs->max_boundaries + m - 1];
        if (slot >= 0) store_state<kBlock>(g.data(), s, N, seqs->cache, seqs->dtype, seqs->stride, slot, h, p0);
      }
    }
    if (p.cu_seqlens && p.cu_seqlens[seq + 1] == t + 1) {  // last token of packed sequence `seq`
      if (p.varlen_states)
        store_state<kBlock>(g.data(), s, N, p.varlen_states, DType::kF32, p.varlen_states_stride, seq, h, p0);
      if (seqs && seqs->write[seq] >= 0)
        store_state<kBlock>(g.data(), s, N, seqs->cache, seqs->dtype, seqs->stride, seqs->write[seq], h, p0);
    }
  }
  if (p.final_states)
    store_state<kBlock>(g.data(), static_cast<float>(std::exp(log_s)), N, p.final_states, DType::kF32,
                p.final_states_stride, b, h, p0);
}

}  // namespace

void cpu::scan_forward(const ForwardParams& p, const SequenceStates* seqs, int num_threads) {
  // kBlock head dims a work item: 32, or 16 where 32 does not divide the head dim (a multiple of 16).
  auto run = [&](auto block) {
    constexpr int64_t kBlock = decltype(block)::value;
    const int64_t blocks = p.headdim / kBlock;
    cpu::parallel_for(p.batch * p.nheads * blocks, num_threads, [&] {
      return [&](int64_t i) {
        run_item<kBlock>(p, seqs, i / (p.nheads * blocks), (i / blocks) % p.nheads, (i % blocks) * kBlock);
      };
    });
  };
  p.headdim % 32 == 0 ? run(std::integral_constant<int64_t, 32>{}) : run(std::integral_constant<int64_t, 16>{});
}

void forward_cpu(const ForwardParams& p, int num_threads) {
  detail::refuse_f64(p, "cpu");  // before validate(), whose refusal cannot name the backend
  validate(p);
  detail::require_host_pointers(p, "cpu");
  detail::validate_contents_host(p);
  cpu::scan_forward(p, nullptr, num_threads);
}

}  // namespace mamba2ssd
