// The layer's causal convolution in fp64 (mamba2ssd.h, Conv1dParams), written from its formula:
// tap k of token t reads token t - (W - 1) + k when that token exists and is of t's sequence.
#include <cmath>
#include <string>
#include <vector>

#include "api/internal.h"
#include "common/host_dtype.h"
#include "reference/conv1d.h"

namespace mamba2ssd {
namespace {

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double silu_grad(double v) {
  const double s = 1.0 / (1.0 + std::exp(-v));
  return s * (1.0 + v * (1.0 - s));
}

// Whether token s (of row b) is a tap of token t: it exists and is of t's sequence.
bool tap(const Conv1dParams& p, int64_t b, int64_t s, int64_t t) {
  if (s < 0) return false;
  if (!p.seq_idx) return true;
  const int32_t* row = p.seq_idx + b * p.seq_idx_stride.s0;
  return row[s * p.seq_idx_stride.s1] == row[t * p.seq_idx_stride.s1];
}

double x_at(const Conv1dParams& p, int64_t b, int64_t t, int64_t c) {
  return host::load_double(p.x, b * p.x_stride.s0 + t * p.x_stride.s1 + c * p.x_stride.s2, p.dtype);
}

// pre[b, t, c]: the convolution before its activation.
double pre_at(const Conv1dParams& p, int64_t b, int64_t t, int64_t c) {
  const int64_t W = p.width;
  double v = p.bias ? p.bias[c] : 0.0;
  for (int64_t k = 0; k < W; ++k) {
    const int64_t s = t - (W - 1) + k;
    if (tap(p, b, s, t)) v += static_cast<double>(p.weight[c * W + k]) * x_at(p, b, s, c);
  }
  return v;
}

}  // namespace

namespace reference {

std::vector<double> conv1d64(const Conv1dParams& p) {
  const int64_t L = p.seqlen, C = p.channels;
  std::vector<double> out(p.batch * L * C);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double v = pre_at(p, b, t, c);
        out[(b * L + t) * C + c] = p.silu ? silu(v) : v;
      }
  return out;
}

// With d = dout * act'(pre): dx[s] = sum over the tokens t that tap s of weight[t - s's tap] d[t],
// dweight[k] = sum over (b, t) of d[t] x[t - (W - 1) + k] (a tap only), dbias = sum of d.
Conv1dGrads64 conv1d_backward64(const Conv1dBackwardParams& bp) {
  const Conv1dParams& p = bp.fwd;
  const int64_t L = p.seqlen, C = p.channels, W = p.width;
  Conv1dGrads64 g;
  g.dx.assign(p.batch * L * C, 0.0);
  g.dweight.assign(C * W, 0.0);
  g.dbias.assign(C, 0.0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double d = host::load_double(bp.dout, b * bp.dout_stride.s0 + t * bp.dout_stride.s1 + c * bp.dout_stride.s2,
                                     p.dtype);
        if (p.silu) d *= silu_grad(pre_at(p, b, t, c));
        g.dbias[c] += d;
        for (int64_t k = 0; k < W; ++k) {
          const int64_t s = t - (W - 1) + k;
          if (!tap(p, b, s, t)) continue;
          g.dweight[c * W + k] += d * x_at(p, b, s, c);
          g.dx[(b * L + s) * C + c] += d * p.weight[c * W + k];
        }
      }
  return g;
}

}  // namespace reference

void conv1d_reference(const Conv1dParams& p) {
  validate(p);
  detail::require_host_pointers(
      {{"x", p.x}, {"weight", p.weight}, {"bias", p.bias}, {"seq_idx", p.seq_idx}, {"out", p.out}}, "reference");
  const std::vector<double> out = reference::conv1d64(p);
  const int64_t L = p.seqlen, C = p.channels;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t c = 0; c < C; ++c)
        host::store_double(p.out, b * p.out_stride.s0 + t * p.out_stride.s1 + c * p.out_stride.s2, p.dtype,
                           out[(b * L + t) * C + c]);
}

void conv1d_backward_reference(const Conv1dBackwardParams& bp) {
  validate(bp);
  const Conv1dParams& p = bp.fwd;
  detail::require_host_pointers({{"x", p.x}, {"weight", p.weight}, {"bias", p.bias}, {"seq_idx", p.seq_idx},
                                 {"dout", bp.dout}, {"dx", bp.dx}, {"dweight", bp.dweight}, {"dbias", bp.dbias}},
                                "reference");
  const reference::Conv1dGrads64 g = reference::conv1d_backward64(bp);
  const int64_t L = p.seqlen, C = p.channels;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t c = 0; c < C; ++c)
        host::store_double(bp.dx, b * bp.dx_stride.s0 + t * bp.dx_stride.s1 + c * bp.dx_stride.s2, p.dtype,
                           g.dx[(b * L + t) * C + c]);
  for (int64_t i = 0; i < C * p.width; ++i) bp.dweight[i] = static_cast<float>(g.dweight[i]);
  if (bp.dbias)
    for (int64_t c = 0; c < C; ++c) bp.dbias[c] = static_cast<float>(g.dbias[c]);
}

}  // namespace mamba2ssd
