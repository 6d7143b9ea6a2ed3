// The decode step's fp64 oracle: loop for loop the recurrence of the header's "Decode" section.
#include "reference/decode.h"

#include <cmath>

#include "api/internal.h"
#include "common/decode_slots.h"
#include "common/host_dtype.h"

namespace mamba2ssd::reference {
namespace {

DecodeSlice resolve(const DecodeParams& p, DecodeSlice s) {
  if (s.batch_end < 0) s.batch_end = p.batch;
  if (s.head_end < 0) s.head_end = p.nheads;
  if (s.batch_begin < 0 || s.batch_begin > s.batch_end || s.batch_end > p.batch || s.head_begin < 0 ||
      s.head_begin > s.head_end || s.head_end > p.nheads)
    throw Error("reference::run_decode: slice out of range");
  return s;
}

double load4(const void* base, const Strides4& s, DType t, int64_t i, int64_t j, int64_t k, int64_t l) {
  return host::load(base, i * s.s0 + j * s.s1 + k * s.s2 + l * s.s3, t);
}

}  // namespace

DecodeResult run_decode(const DecodeParams& p, DecodeSlice slice) {
  slice = resolve(p, slice);
  const int64_t T = p.ntokens, P = p.headdim, N = p.dstate, heads_per_group = p.nheads / p.ngroups;
  DecodeResult r;
  r.slice = slice;
  r.nb = slice.batch_end - slice.batch_begin, r.nh = slice.head_end - slice.head_begin;
  r.ntokens = T, r.headdim = P, r.dstate = N;
  r.out.assign(r.nb * T * r.nh * P, 0.0);
  r.states.assign(r.nb * T * r.nh * P * N, 0.0);
  r.read.assign(r.nb, -1);
  r.dst.assign(r.nb * T, -1);

  const DecodeSlots slots = decode_slots(p);
  std::vector<double> S(P * N);
  for (int64_t bi = 0; bi < r.nb; ++bi) {
    const int64_t b = slice.batch_begin + bi;
    const int32_t read = read_slot(slots, b);
    r.read[bi] = read;
    if (read < 0) continue;
    for (int64_t t = 0; t < T; ++t) r.dst[bi * T + t] = dst_slot(slots, b, t, read);
    for (int64_t hi = 0; hi < r.nh; ++hi) {
      const int64_t h = slice.head_begin + hi, g = h / heads_per_group;
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < N; ++n) S[i * N + n] = load4(p.state, p.state_stride, p.state_dtype, read, h, i, n);
      for (int64_t t = 0; t < T; ++t) {
        double d = host::load(p.dt, b * p.dt_stride.s0 + t * p.dt_stride.s1 + h * p.dt_stride.s2, p.dt_dtype);
        if (p.dt_bias) d += p.dt_bias[h];
        if (p.dt_softplus && d <= 20.0) d = std::log1p(std::exp(d));  // identity above 20, as the peer
        if (d < p.dt_min) d = p.dt_min;  // comparisons keep NaN as NaN
        if (d > p.dt_max) d = p.dt_max;
        const double decay = std::exp(static_cast<double>(p.A[h]) * d);
        for (int64_t i = 0; i < P; ++i) {
          const double x = load4(p.x, p.x_stride, p.dtype, b, t, h, i);
          double y = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            const double Bn = load4(p.B, p.B_stride, p.dtype, b, t, g, n);
            const double Cn = load4(p.C, p.C_stride, p.dtype, b, t, g, n);
            double& s = S[i * N + n];
            s = decay * s + d * x * Bn;
            y += s * Cn;
          }
          if (p.D_layout == DLayout::kPerHead) y += p.D[h] * x;
          if (p.D_layout == DLayout::kPerHeadDim) y += p.D[h * P + i] * x;
          if (p.z) {
            const double z = load4(p.z, p.z_stride, p.dtype, b, t, h, i);
            y *= z / (1.0 + std::exp(-z));
          }
          r.out[r.out_at(bi, t, hi, i)] = y;
        }
        std::copy(S.begin(), S.end(), r.states.begin() + r.state_at(bi, t, hi));
      }
    }
  }
  return r;
}

}  // namespace mamba2ssd::reference

namespace mamba2ssd {

void decode_reference(const DecodeParams& p) {
  validate(p);
  detail::require_host_pointers(p, "reference");
  detail::check_decode_slots_host(p);
  const reference::DecodeResult r = reference::run_decode(p);
  const int64_t T = p.ntokens, H = p.nheads, P = p.headdim, N = p.dstate;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < P; ++i)
          host::store(p.out, b * p.out_stride.s0 + t * p.out_stride.s1 + h * p.out_stride.s2 + i, p.dtype,
                      static_cast<float>(r.out[r.out_at(b, t, h, i)]));
        const int32_t d = r.dst[b * T + t];
        if (d < 0) continue;
        const double* S = &r.states[r.state_at(b, t, h)];
        const Strides4& s = p.state_stride;
        for (int64_t i = 0; i < P; ++i)
          for (int64_t n = 0; n < N; ++n)
            host::store(p.state, d * s.s0 + h * s.s1 + i * s.s2 + n * s.s3, p.state_dtype,
                        static_cast<float>(S[i * N + n]));
      }
}

}  // namespace mamba2ssd
