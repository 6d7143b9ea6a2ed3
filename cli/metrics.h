// What one forward call must move and compute, counted as in docs/contract.md ("Work" and "The
// floor"). Every place that prints GB/s, FLOP/s or a fraction of the floor uses these two numbers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cli {

struct Work {
  double bytes = 0.0;  // bytes that must move at least once (read or written)
  double flops = 0.0;  // matmul flops of the chunked form
};

// Bytes: every input read once and every output written once, at their dtypes: x, y, z (if any), B,
// C, dt, seq_idx (if any), the small per-head vectors (A, D, dt_bias), and the fp32 states in
// (initial_states) and out (final_states, varlen_states) when present.
// Flops, per chunk of q tokens (q = Q except a shorter last chunk): per (batch, chunk, head)
// C h^T 2qNP + state jump 2qNP + intra-chunk 2q^2P; per (batch, chunk, group) C B^T 2q^2N.
inline Work count_work(const ForwardParams& p) {
  const double b = static_cast<double>(p.batch), L = static_cast<double>(p.seqlen);
  const double H = static_cast<double>(p.nheads), P = static_cast<double>(p.headdim);
  const double G = static_cast<double>(p.ngroups), N = static_cast<double>(p.dstate);
  const double es = static_cast<double>(dtype_size(p.dtype));
  const double state = H * P * N * 4.0;

  Work w;
  w.bytes += 2.0 * b * L * H * P * es;                  // x, y
  if (p.z) w.bytes += b * L * H * P * es;               // z
  w.bytes += 2.0 * b * L * G * N * es;                  // B, C
  w.bytes += b * L * H * static_cast<double>(dtype_size(p.dt_dtype));  // dt
  if (p.seq_idx) w.bytes += b * L * 4.0;
  if (p.cu_seqlens) w.bytes += (static_cast<double>(p.nseqs) + 1.0) * 8.0;
  w.bytes += H * 4.0;                                   // A
  if (p.D) w.bytes += (p.D_layout == DLayout::kPerHeadDim ? H * P : H) * 4.0;
  if (p.dt_bias) w.bytes += H * 4.0;
  if (p.initial_states) w.bytes += b * state;
  if (p.final_states) w.bytes += b * state;
  if (p.varlen_states) w.bytes += static_cast<double>(p.nseqs) * state;

  const int64_t Q = std::max<int64_t>(p.chunk_size, 1);
  const int64_t full = p.seqlen / Q, rest = p.seqlen % Q;
  auto per_chunk = [&](double q) { return H * (4.0 * q * N * P + 2.0 * q * q * P) + G * 2.0 * q * q * N; };
  w.flops = b * (static_cast<double>(full) * per_chunk(static_cast<double>(Q)) +
                 (rest ? per_chunk(static_cast<double>(rest)) : 0.0));
  return w;
}

}  // namespace mamba2ssd::cli
