// The layer's gated RMSNorm in fp64 (mamba2ssd.h, GatedRmsNormParams), from its formula, group by
// group: v = y or y silu(z), r = 1 / sqrt(mean(v^2) + eps), n = v r, out = n w (times silu(z) when
// the norm comes before the gate). The backward: with d = dout (times silu(z) there),
// dweight = sum over rows of d n, dn = d w, dv = r (dn - n mean(dn n)), and dy, dz from dv and d.
#include <cmath>
#include <string>
#include <vector>

#include "api/internal.h"
#include "common/host_dtype.h"
#include "reference/rmsnorm.h"

namespace mamba2ssd {
namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double silu_grad(double v) {
  const double s = sigmoid(v);
  return s * (1.0 + v * (1.0 - s));
}

double at(const void* base, const Strides2& s, int64_t r, int64_t f, DType t) {
  return host::load_double(base, r * s.s0 + f * s.s1, t);
}

// One group of one row: its v, n, r and the gate g = silu(z) (1 without z).
struct Group {
  std::vector<double> v, n, g, y, z;
  double r = 0.0;
  Group(const GatedRmsNormParams& p, int64_t row, int64_t f0) {
    const int64_t gs = p.group_size;
    v.resize(gs), n.resize(gs), g.assign(gs, 1.0), y.resize(gs), z.assign(gs, 0.0);
    double squares = 0.0;
    for (int64_t i = 0; i < gs; ++i) {
      y[i] = at(p.y, p.y_stride, row, f0 + i, p.dtype);
      if (p.z) z[i] = at(p.z, p.z_stride, row, f0 + i, p.dtype), g[i] = z[i] * sigmoid(z[i]);
      v[i] = p.z && !p.norm_before_gate ? y[i] * g[i] : y[i];
      squares += v[i] * v[i];
    }
    r = 1.0 / std::sqrt(squares / static_cast<double>(gs) + static_cast<double>(p.eps));
    for (int64_t i = 0; i < gs; ++i) n[i] = v[i] * r;
  }
};

}  // namespace

namespace reference {

std::vector<double> gated_rmsnorm64(const GatedRmsNormParams& p) {
  std::vector<double> out(p.rows * p.dim);
  const bool gate_after = p.z && p.norm_before_gate;
  for (int64_t row = 0; row < p.rows; ++row)
    for (int64_t f0 = 0; f0 < p.dim; f0 += p.group_size) {
      const Group grp(p, row, f0);
      for (int64_t i = 0; i < p.group_size; ++i)
        out[row * p.dim + f0 + i] = grp.n[i] * p.weight[f0 + i] * (gate_after ? grp.g[i] : 1.0);
    }
  return out;
}

RmsNormGrads64 gated_rmsnorm_backward64(const GatedRmsNormBackwardParams& bp) {
  const GatedRmsNormParams& p = bp.fwd;
  const int64_t gs = p.group_size;
  RmsNormGrads64 g;
  g.dy.assign(p.rows * p.dim, 0.0), g.dy_terms.assign(p.rows * p.dim, 0.0);
  if (p.z) g.dz.assign(p.rows * p.dim, 0.0), g.dz_terms.assign(p.rows * p.dim, 0.0);
  g.dweight.assign(p.dim, 0.0);
  std::vector<double> d(gs), dn(gs);
  for (int64_t row = 0; row < p.rows; ++row)
    for (int64_t f0 = 0; f0 < p.dim; f0 += gs) {
      const Group grp(p, row, f0);
      double dot = 0.0;  // sum over the group of dn n
      for (int64_t i = 0; i < gs; ++i) {
        const int64_t f = f0 + i, o = row * p.dim + f;
        d[i] = at(bp.dout, bp.dout_stride, row, f, p.dtype);
        if (p.z && p.norm_before_gate) {  // out = n w silu(z)
          g.dz[o] = d[i] * grp.n[i] * p.weight[f] * silu_grad(grp.z[i]);
          g.dz_terms[o] = std::abs(g.dz[o]);
          d[i] *= grp.g[i];
        }
        g.dweight[f] += d[i] * grp.n[i];
        dn[i] = d[i] * p.weight[f];
        dot += dn[i] * grp.n[i];
      }
      const double mean = dot / static_cast<double>(gs);
      for (int64_t i = 0; i < gs; ++i) {
        const int64_t o = row * p.dim + f0 + i;
        double dv = grp.r * (dn[i] - grp.n[i] * mean);
        double terms = grp.r * std::hypot(dn[i], grp.n[i] * mean);
        if (p.z && !p.norm_before_gate) {  // v = y silu(z)
          const double factor = grp.y[i] * silu_grad(grp.z[i]);
          g.dz[o] = dv * factor, g.dz_terms[o] = terms * std::abs(factor);
          dv *= grp.g[i], terms *= std::abs(grp.g[i]);
        }
        g.dy[o] = dv, g.dy_terms[o] = terms;
      }
    }
  return g;
}

}  // namespace reference

void gated_rmsnorm_reference(const GatedRmsNormParams& p) {
  validate(p);
  detail::require_host_pointers({{"y", p.y}, {"z", p.z}, {"weight", p.weight}, {"out", p.out}}, "reference");
  const std::vector<double> out = reference::gated_rmsnorm64(p);
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t f = 0; f < p.dim; ++f)
      host::store_double(p.out, r * p.out_stride.s0 + f * p.out_stride.s1, p.dtype, out[r * p.dim + f]);
}

void gated_rmsnorm_backward_reference(const GatedRmsNormBackwardParams& bp) {
  validate(bp);
  const GatedRmsNormParams& p = bp.fwd;
  detail::require_host_pointers({{"y", p.y}, {"z", p.z}, {"weight", p.weight}, {"out", p.out}, {"dout", bp.dout},
                                 {"dy", bp.dy}, {"dz", bp.dz}, {"dweight", bp.dweight}},
                                "reference");
  if (p.out) gated_rmsnorm_reference(p);  // the forward's output again (fwd.out)
  const reference::RmsNormGrads64 g = reference::gated_rmsnorm_backward64(bp);
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t f = 0; f < p.dim; ++f) {
      host::store_double(bp.dy, r * bp.dy_stride.s0 + f * bp.dy_stride.s1, p.dtype, g.dy[r * p.dim + f]);
      if (bp.dz) host::store_double(bp.dz, r * bp.dz_stride.s0 + f * bp.dz_stride.s1, p.dtype, g.dz[r * p.dim + f]);
    }
  for (int64_t f = 0; f < p.dim; ++f) bp.dweight[f] = static_cast<float>(g.dweight[f]);
}

}  // namespace mamba2ssd
