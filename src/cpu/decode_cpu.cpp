// The CPU decode step: one work item per (request, head), the state in fp32 for all of the
// request's tokens, rounded to the cache's dtype where it is stored.
#include <cmath>
#include <vector>

#include "api/internal.h"
#include "common/decode_slots.h"
#include "common/dt.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace mamba2ssd {

void decode_cpu(const DecodeParams& p, int num_threads) {
  validate(p);
  detail::require_host_pointers(p, "cpu");
  detail::check_decode_slots_host(p);  // from here on no two items touch one slot, but to read it
  const int64_t T = p.ntokens, H = p.nheads, P = p.headdim, N = p.dstate, heads_per_group = p.nheads / p.ngroups;
  const DecodeSlots slots = decode_slots(p);
  const Strides4& ss = p.state_stride;

  cpu::parallel_for(p.batch * H, num_threads, [&] {
    // Per thread: the state, one row of B, C, x, z and y.
    return [&, S = std::vector<float>(P * N), B = std::vector<float>(N), C = std::vector<float>(N),
            x = std::vector<float>(P), z = std::vector<float>(P), y = std::vector<float>(P)](int64_t item) mutable {
      const int64_t b = item / H, h = item % H, g = h / heads_per_group;
      const int32_t read = read_slot(slots, b);
      auto out_row = [&](int64_t t) { return b * p.out_stride.s0 + t * p.out_stride.s1 + h * p.out_stride.s2; };
      if (read < 0) {  // a pad: zero output, nothing stored
        std::fill(y.begin(), y.end(), 0.0f);
        for (int64_t t = 0; t < T; ++t) cpu::store_row(p.out, out_row(t), P, p.dtype, y.data());
        return;
      }
      for (int64_t i = 0; i < P; ++i) cpu::load_row(p.state, read * ss.s0 + h * ss.s1 + i * ss.s2, N, p.state_dtype, &S[i * N]);
      for (int64_t t = 0; t < T; ++t) {
        const float raw = host::load(p.dt, b * p.dt_stride.s0 + t * p.dt_stride.s1 + h * p.dt_stride.s2, p.dt_dtype);
        const float d = preprocess_dt(raw, p.dt_bias ? p.dt_bias[h] : 0.0f, p.dt_softplus, p.dt_min, p.dt_max);
        const float decay = std::exp(p.A[h] * d);
        cpu::load_row(p.B, b * p.B_stride.s0 + t * p.B_stride.s1 + g * p.B_stride.s2, N, p.dtype, B.data());
        cpu::load_row(p.C, b * p.C_stride.s0 + t * p.C_stride.s1 + g * p.C_stride.s2, N, p.dtype, C.data());
        cpu::load_row(p.x, b * p.x_stride.s0 + t * p.x_stride.s1 + h * p.x_stride.s2, P, p.dtype, x.data());
        if (p.z) cpu::load_row(p.z, b * p.z_stride.s0 + t * p.z_stride.s1 + h * p.z_stride.s2, P, p.dtype, z.data());
        for (int64_t i = 0; i < P; ++i) {
          float* s = &S[i * N];
          const float dx = d * x[i];
          float acc = 0.0f;
          for (int64_t n = 0; n < N; ++n) {
            s[n] = decay * s[n] + dx * B[n];
            acc += s[n] * C[n];
          }
          if (p.D_layout == DLayout::kPerHead) acc += p.D[h] * x[i];
          if (p.D_layout == DLayout::kPerHeadDim) acc += p.D[h * P + i] * x[i];
          if (p.z) acc *= z[i] / (1.0f + std::exp(-z[i]));
          y[i] = acc;
        }
        cpu::store_row(p.out, out_row(t), P, p.dtype, y.data());
        const int32_t dst = dst_slot(slots, b, t, read);
        if (dst >= 0)
          for (int64_t i = 0; i < P; ++i)
            cpu::store_row(p.state, dst * ss.s0 + h * ss.s1 + i * ss.s2, N, p.state_dtype, &S[i * N]);
      }
    };
  });
}

}  // namespace mamba2ssd
