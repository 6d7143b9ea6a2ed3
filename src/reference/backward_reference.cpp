// The fp64 oracle of the backward: the reverse recurrence of ssd-backward.md, token by token per
// (batch row, head), as plainly as the forward's. The finite-difference tests of
// tests/cpu/backward_oracle_test.cpp check it against forward64.
//
// Per (batch row, head): a forward walk keeps every state h_t, then a reverse walk carries the
// adjoint lam_t = dL/dh_t:
//   lam_t = dy_t C_t^T + [no reset at t+1] exp(A d_{t+1}) lam_{t+1} (+ dfinal at L-1, + dvarlen at a
//   sequence's last token), and every gradient of token t is read off h_{t-1}, h_t and lam_t.
#include <algorithm>
#include <cmath>

#include "api/internal.h"
#include "common/host_dtype.h"
#include "reference/reference.h"

namespace mamba2ssd::reference {
namespace {

// For every token: the packed sequence whose last token it is (its varlen state is read there), or -1.
std::vector<int64_t> sequence_ends(const Inputs64& in) {
  std::vector<int64_t> ends(in.seqlen, -1);
  for (int64_t s = 0; s < in.nseqs(); ++s)
    if (in.cu_seqlens[s] < in.cu_seqlens[s + 1]) ends[in.cu_seqlens[s + 1] - 1] = s;
  return ends;
}

// A dense [d0, d1, d2, d3] copy of a strided 4-d tensor of dtype t.
std::vector<double> load4(const void* base, DType t, const Strides4& s, int64_t d0, int64_t d1, int64_t d2,
                          int64_t d3) {
  std::vector<double> out;
  out.reserve(d0 * d1 * d2 * d3);
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j)
      for (int64_t k = 0; k < d2; ++k)
        for (int64_t l = 0; l < d3; ++l) out.push_back(host::load_double(base, i * s.s0 + j * s.s1 + k * s.s2 + l * s.s3, t));
  return out;
}

// Writes a dense [d0, d1, d2, d3] fp64 tensor to a strided one of dtype t (rounded through fp32 unless
// t is fp64).
void store4(void* base, DType t, const Strides4& s, const std::vector<double>& v, int64_t d0, int64_t d1,
            int64_t d2, int64_t d3) {
  for (int64_t i = 0, at = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j)
      for (int64_t k = 0; k < d2; ++k)
        for (int64_t l = 0; l < d3; ++l, ++at)
          host::store_double(base, i * s.s0 + j * s.s1 + k * s.s2 + l * s.s3, t, v[at]);
}

// A contiguous array the API declares float* (doubles in an fp64 call).
void store_flat(float* out, DType t, const std::vector<double>& v) {
  for (std::size_t i = 0; i < v.size(); ++i) host::store_double(out, static_cast<int64_t>(i), t, v[i]);
}

}  // namespace

Grads64 backward64(const Inputs64& in, const std::vector<double>& dout, const std::vector<double>& dfinal_states,
                   const std::vector<double>& dvarlen_states) {
  const int64_t L = in.seqlen, H = in.nheads, P = in.headdim, N = in.dstate, PN = P * N;
  Grads64 g;
  g.dx.assign(in.x.size(), 0.0);
  g.ddt.assign(in.dt.size(), 0.0);
  g.dA.assign(in.A.size(), 0.0);
  g.dB.assign(in.B.size(), 0.0);
  g.dC.assign(in.C.size(), 0.0);
  g.dD.assign(in.D.size(), 0.0);
  g.dz.assign(in.z.size(), 0.0);
  g.ddt_bias.assign(in.dt_bias.size(), 0.0);
  g.dinitial_states.assign(in.initial_states.size(), 0.0);
  g.dA_terms.assign(g.dA.size(), 0.0);  // sums of squares until the end
  g.ddt_bias_terms.assign(g.ddt_bias.size(), 0.0);
  g.dD_terms.assign(g.dD.size(), 0.0);
  g.ddt_terms.assign(g.ddt.size(), 0.0);
  // A sum's element and the square of its term.
  auto add = [](double& sum, double& squares, double term) { sum += term, squares += term * term; };
  const std::vector<int64_t> ends = sequence_ends(in);

  std::vector<double> states((L + 1) * PN);  // states[t + 1] = h_t; states[0] = the state before token 0
  std::vector<double> lam(PN), dy(P), lamB(P);
  for (int64_t b = 0; b < in.batch; ++b) {
    const int64_t* seq = &in.seq[b * L];
    auto resets = [&](int64_t t) { return seq[t] != (t == 0 ? 0 : seq[t - 1]); };  // a new sequence starts
    for (int64_t h = 0; h < H; ++h) {
      // Forward: h_t = exp(A d_t) h_{t-1} + d_t x_t B_t^T, with h_{t-1} = 0 at a reset.
      for (int64_t i = 0; i < PN; ++i)
        states[i] = in.initial_states.empty() ? 0.0 : in.initial_states[in.state_at(b, h) + i];
      for (int64_t t = 0; t < L; ++t) {
        const double d = dt_step(in, b, t, h).d, decay = std::exp(in.A[h] * d);
        const double* x = &in.x[in.x_row(b, t, h)];
        const double* Bt = &in.B[in.BC_row(b, t, h)];
        const double* prev = &states[t * PN];
        double* next = &states[(t + 1) * PN];
        for (int64_t i = 0; i < P; ++i)
          for (int64_t n = 0; n < N; ++n)
            next[i * N + n] = decay * (resets(t) ? 0.0 : prev[i * N + n]) + d * x[i] * Bt[n];
      }

      // Reverse: lam enters token t holding the carried term exp(A d_{t+1}) lam_{t+1} (or zero).
      std::fill(lam.begin(), lam.end(), 0.0);
      for (int64_t t = L - 1; t >= 0; --t) {
        if (t == L - 1 && !dfinal_states.empty())
          for (int64_t i = 0; i < PN; ++i) lam[i] += dfinal_states[in.state_at(b, h) + i];
        if (ends[t] >= 0 && !dvarlen_states.empty())
          for (int64_t i = 0; i < PN; ++i) lam[i] += dvarlen_states[in.state_at(ends[t], h) + i];

        const Step step = dt_step(in, b, t, h);
        const double d = step.d, A = in.A[h], decay = std::exp(A * d);
        const int64_t xr = in.x_row(b, t, h), bc = in.BC_row(b, t, h);
        const double* x = &in.x[xr];
        const double* Bt = &in.B[bc];
        const double* Ct = &in.C[bc];
        const double* h_t = &states[(t + 1) * PN];
        const double* h_prev = resets(t) ? nullptr : &states[t * PN];  // nullptr: the zero state

        // The gate: out = y silu(z), so dy = dout silu(z) and dz = dout y silu'(z).
        for (int64_t i = 0; i < P; ++i) {
          const double g_out = dout[xr + i];
          if (in.z.empty()) {
            dy[i] = g_out;
            continue;
          }
          const double z = in.z[xr + i], s = 1.0 / (1.0 + std::exp(-z));
          double y = in.D_at(h, i) * x[i];
          for (int64_t n = 0; n < N; ++n) y += h_t[i * N + n] * Ct[n];
          dy[i] = g_out * z * s;
          g.dz[xr + i] = g_out * y * s * (1.0 + z * (1.0 - s));
        }
        // y_t = h_t C_t + D x_t: lam_t = carried + dy_t C_t^T, dC_t += h_t^T dy_t, dD += dy_t x_t.
        for (int64_t i = 0; i < P; ++i) {
          for (int64_t n = 0; n < N; ++n) {
            lam[i * N + n] += dy[i] * Ct[n];
            g.dC[bc + n] += h_t[i * N + n] * dy[i];
          }
          if (in.D_layout == DLayout::kPerHead) add(g.dD[h], g.dD_terms[h], dy[i] * x[i]);
          if (in.D_layout == DLayout::kPerHeadDim) add(g.dD[h * P + i], g.dD_terms[h * P + i], dy[i] * x[i]);
        }
        // h_t = exp(A d) h_{t-1} + d x B^T: dx, dB, and d's two paths (the input term and the decay).
        double dd = 0.0, dd_squares = 0.0, lam_prev = 0.0;  // lam_prev = <h_{t-1}, lam_t>
        for (int64_t i = 0; i < P; ++i) {
          lamB[i] = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            lamB[i] += lam[i * N + n] * Bt[n];
            g.dB[bc + n] += d * lam[i * N + n] * x[i];
            if (h_prev) lam_prev += h_prev[i * N + n] * lam[i * N + n];
          }
          g.dx[xr + i] = d * lamB[i] + in.D_at(h, i) * dy[i];
          add(dd, dd_squares, x[i] * lamB[i]);
        }
        add(dd, dd_squares, A * decay * lam_prev);
        add(g.dA[h], g.dA_terms[h], d * decay * lam_prev);
        const double ddt = dd * step.dd_ddt;  // back through clamp and softplus
        const double ddt_terms = std::abs(step.dd_ddt) * std::sqrt(dd_squares);
        g.ddt[in.token_head(b, t, h)] = ddt;
        g.ddt_terms[in.token_head(b, t, h)] = ddt_terms;
        // ddt_bias's terms are the ddt, each off by the larger of itself and its own terms' scale.
        if (!in.dt_bias.empty()) {
          g.ddt_bias[h] += ddt;
          g.ddt_bias_terms[h] += std::max(ddt * ddt, ddt_terms * ddt_terms);
        }

        // Carry to token t - 1 (cut where token t starts a sequence), or out to the initial state.
        if (t > 0) {
          for (double& v : lam) v = resets(t) ? 0.0 : decay * v;
        } else if (!in.initial_states.empty() && !resets(0)) {
          for (int64_t i = 0; i < PN; ++i) g.dinitial_states[in.state_at(b, h) + i] = decay * lam[i];
        }
      }
    }
  }
  for (std::vector<double>* v : {&g.dA_terms, &g.ddt_bias_terms, &g.dD_terms})
    for (double& s : *v) s = std::sqrt(s);
  return g;
}

Grads64 run_backward(const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  const int64_t H = f.nheads, P = f.headdim, N = f.dstate;
  const Inputs64 in = load_inputs(f);
  const std::vector<double> dout = load4(p.dout, f.dtype, p.dout_stride, f.batch, f.seqlen, H, P);
  std::vector<double> dfinal, dvarlen;
  const DType ft = detail::float_tensor_dtype(f);
  if (p.dfinal_states) dfinal = load4(p.dfinal_states, ft, p.dfinal_states_stride, f.batch, H, P, N);
  if (p.dvarlen_states) dvarlen = load4(p.dvarlen_states, ft, p.dvarlen_states_stride, f.nseqs, H, P, N);
  return backward64(in, dout, dfinal, dvarlen);
}

}  // namespace mamba2ssd::reference

namespace mamba2ssd {

void backward_reference(const BackwardParams& p) {
  using reference::store4, reference::store_flat;
  detail::validate_reference(p);  // validate() with fp64 allowed
  detail::require_host_pointers(p, "reference");
  const reference::Grads64 g = reference::run_backward(p);
  const ForwardParams& f = p.fwd;
  const int64_t b = f.batch, L = f.seqlen, H = f.nheads, P = f.headdim, G = f.ngroups, N = f.dstate;
  const DType ft = detail::float_tensor_dtype(f);
  store4(p.dx, f.dtype, p.dx_stride, g.dx, b, L, H, P);
  store4(p.ddt, f.dt_dtype, {p.ddt_stride.s0, p.ddt_stride.s1, p.ddt_stride.s2, 0}, g.ddt, b, L, H, 1);
  store_flat(p.dA, ft, g.dA);
  store4(p.dB, f.dtype, p.dB_stride, g.dB, b, L, G, N);
  store4(p.dC, f.dtype, p.dC_stride, g.dC, b, L, G, N);
  if (p.dD) store_flat(p.dD, ft, g.dD);
  if (p.dz) store4(p.dz, f.dtype, p.dz_stride, g.dz, b, L, H, P);
  if (p.ddt_bias) store_flat(p.ddt_bias, ft, g.ddt_bias);
  if (p.dinitial_states) store4(p.dinitial_states, ft, p.dinitial_states_stride, g.dinitial_states, b, H, P, N);
}

}  // namespace mamba2ssd
