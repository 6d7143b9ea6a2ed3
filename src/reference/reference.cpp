// The fp64 oracle. Loop for loop the recurrence of docs/contract.md; no chunking, no cleverness.
#include "reference/reference.h"

#include <cmath>

#include "api/internal.h"
#include "common/host_dtype.h"

namespace mamba2ssd::reference {
namespace {

double dt_at(const ForwardParams& p, int64_t b, int64_t t, int64_t h) {
  const int64_t i = b * p.dt_stride.s0 + t * p.dt_stride.s1 + h * p.dt_stride.s2;
  double d = host::load(p.dt, i, p.dt_dtype);
  if (p.dt_bias) d += p.dt_bias[h];
  if (p.dt_softplus) d = d <= 20.0 ? std::log1p(std::exp(d)) : d;
  if (d < p.dt_min) d = p.dt_min;  // comparisons keep NaN as NaN
  if (d > p.dt_max) d = p.dt_max;
  return d;
}

// Sequence id of every token of batch row b: seq_idx, else derived from cu_seqlens, else all 0.
std::vector<int64_t> seq_ids(const ForwardParams& p, int64_t b) {
  std::vector<int64_t> ids(p.seqlen, 0);
  for (int64_t t = 0, s = 0; t < p.seqlen; ++t) {
    if (p.seq_idx) {
      ids[t] = p.seq_idx[b * p.seq_idx_stride.s0 + t * p.seq_idx_stride.s1];
    } else if (p.cu_seqlens) {
      while (p.cu_seqlens[s + 1] <= t) ++s;
      ids[t] = s;
    }
  }
  return ids;
}

}  // namespace

Result run(const ForwardParams& p, Slice slice) {
  const int64_t L = p.seqlen, H = p.nheads, P = p.headdim, N = p.dstate;
  if (slice.batch_end < 0) slice.batch_end = p.batch;
  if (slice.head_end < 0) slice.head_end = H;
  if (slice.token_end < 0) slice.token_end = L;
  if (slice.batch_begin < 0 || slice.batch_begin > slice.batch_end || slice.batch_end > p.batch ||
      slice.head_begin < 0 || slice.head_begin > slice.head_end || slice.head_end > H ||
      slice.token_begin < 0 || slice.token_begin > slice.token_end || slice.token_end > L)
    throw Error("reference::run: slice out of range");
  detail::validate_cu_seqlens_host(p);

  Result r;
  r.slice = slice;
  r.nb = slice.batch_end - slice.batch_begin;
  r.nh = slice.head_end - slice.head_begin;
  r.nt = slice.token_end - slice.token_begin;
  r.headdim = P;
  r.dstate = N;
  r.nseqs = p.cu_seqlens ? p.nseqs : 0;
  r.y.assign(r.nb * r.nt * r.nh * P, 0.0);
  r.final_states.assign(r.nb * r.nh * P * N, 0.0);
  r.varlen_states.assign(r.nseqs * r.nh * P * N, 0.0);

  const int64_t heads_per_group = H / p.ngroups;
  std::vector<double> state(P * N), x(P), Bt(N), Ct(N);
  for (int64_t b = slice.batch_begin; b < slice.batch_end; ++b) {
    for (int64_t h = slice.head_begin; h < slice.head_end; ++h) {
      const int64_t g = h / heads_per_group, bi = b - slice.batch_begin, hi = h - slice.head_begin;
      for (int64_t i = 0; i < P * N; ++i) {
        const Strides4& s = p.initial_states_stride;
        state[i] = p.initial_states ? p.initial_states[b * s.s0 + h * s.s1 + (i / N) * s.s2 + (i % N) * s.s3] : 0.0;
      }
      const std::vector<int64_t> seq = seq_ids(p, b);
      int64_t next_end = 0;  // the next packed sequence whose end is still ahead
      for (int64_t t = 0; t < L; ++t) {
        if (seq[t] != (t == 0 ? 0 : seq[t - 1]))  // a new sequence starts
          std::fill(state.begin(), state.end(), 0.0);

        const double d = dt_at(p, b, t, h);
        const double decay = std::exp(static_cast<double>(p.A[h]) * d);
        for (int64_t i = 0; i < P; ++i)
          x[i] = host::load(p.x, b * p.x_stride.s0 + t * p.x_stride.s1 + h * p.x_stride.s2 + i, p.dtype);
        for (int64_t n = 0; n < N; ++n) {
          Bt[n] = host::load(p.B, b * p.B_stride.s0 + t * p.B_stride.s1 + g * p.B_stride.s2 + n, p.dtype);
          Ct[n] = host::load(p.C, b * p.C_stride.s0 + t * p.C_stride.s1 + g * p.C_stride.s2 + n, p.dtype);
        }

        // h = exp(A d) h + d outer(x, B);  y = h C + D x;  out = y * silu(z)
        for (int64_t i = 0; i < P; ++i) {
          double* hrow = &state[i * N];
          double yi = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            hrow[n] = decay * hrow[n] + d * x[i] * Bt[n];
            yi += hrow[n] * Ct[n];
          }
          if (p.D_layout == DLayout::kPerHead) yi += p.D[h] * x[i];
          if (p.D_layout == DLayout::kPerHeadDim) yi += p.D[h * P + i] * x[i];
          if (p.z) {
            const double zi =
                host::load(p.z, b * p.z_stride.s0 + t * p.z_stride.s1 + h * p.z_stride.s2 + i, p.dtype);
            yi *= zi / (1.0 + std::exp(-zi));
          }
          if (t >= slice.token_begin && t < slice.token_end) r.y_at(bi, t - slice.token_begin, hi, i) = yi;
        }

        // With packed sequences, the state at each sequence's last token is its varlen state
        // (an empty sequence keeps zeros).
        for (; p.cu_seqlens && next_end < p.nseqs && p.cu_seqlens[next_end + 1] <= t + 1; ++next_end)
          if (p.cu_seqlens[next_end] < p.cu_seqlens[next_end + 1])
            for (int64_t i = 0; i < P * N; ++i) r.state_at(r.varlen_states, next_end, hi, i / N, i % N) = state[i];
      }
      for (int64_t i = 0; i < P * N; ++i) r.state_at(r.final_states, bi, hi, i / N, i % N) = state[i];
    }
  }
  return r;
}

}  // namespace mamba2ssd::reference

namespace mamba2ssd {

void forward_reference(const ForwardParams& p) {
  validate(p);
  detail::require_host_pointers(p, "reference");
  const reference::Result r = reference::run(p);
  const int64_t L = p.seqlen, H = p.nheads, P = p.headdim, N = p.dstate;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < P; ++i)
          host::store(p.y, b * p.y_stride.s0 + t * p.y_stride.s1 + h * p.y_stride.s2 + i, p.dtype,
                      static_cast<float>(r.y[((b * L + t) * H + h) * P + i]));
  auto put_states = [&](float* out, const Strides4& s, const std::vector<double>& src, int64_t n0) {
    for (int64_t i = 0; i < n0; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t pi = 0; pi < P; ++pi)
          for (int64_t n = 0; n < N; ++n)
            out[i * s.s0 + h * s.s1 + pi * s.s2 + n * s.s3] = static_cast<float>(src[((i * H + h) * P + pi) * N + n]);
  };
  if (p.final_states) put_states(p.final_states, p.final_states_stride, r.final_states, p.batch);
  if (p.varlen_states) put_states(p.varlen_states, p.varlen_states_stride, r.varlen_states, p.nseqs);
}

}  // namespace mamba2ssd
