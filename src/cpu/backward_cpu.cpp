// The fast CPU backward: the reverse recurrence of ssd-backward.md in fp32 (fp64 for the sums over
// tokens and rows), multithreaded over work items of (batch row, head).
//
// An item walks its tokens forward once, keeping only the state entering each segment of kSegment
// tokens (a checkpoint). Then, segment by segment from the last, it recomputes the segment's states
// from its checkpoint and walks the segment's tokens backwards, carrying the adjoint
// lam_t = dL/dh_t. Each token of the reverse walk is one pass over the [P, N] state that updates lam
// and reads off every gradient of that token (see reverse_token).
// Memory per thread: (ceil(L / kSegment) + kSegment + 2) P N floats (L 16384, P 64, N 128: 10 MiB),
// plus a few floats per token. Work: two forward walks and one reverse walk.
//
// Determinism: an item writes its own rows of dx, ddt, dz and dinitial_states, and its own slots of
// partial buffers: dB and dC per head ([b, L, H, N] floats each) and dA, dD, ddt_bias per (batch row,
// head) in fp64. Once every item is done, the partials are summed in a fixed order (the heads of a
// group in head order; batch rows in order). No atomics: the bits depend neither on the thread count
// nor on scheduling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api/internal.h"
#include "common/dt.h"
#include "common/host_dtype.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"

namespace mamba2ssd {
namespace {

using cpu::load_row;
using cpu::store_row;

constexpr int64_t kSegment = 64;  // tokens between two checkpoints of the forward state

// What every item reads, and the partial buffers the items write (each item its own slots).
struct Shared {
  const BackwardParams& p;
  std::vector<int64_t> sequence_end;  // [L]: the packed sequence whose last token t is, or -1
  std::vector<float> dB_heads, dC_heads;               // [b, L, H, N]
  std::vector<double> dA_part, ddt_bias_part, dD_part;  // [b, H], [b, H], [b, H, P]
};

// Per-token values of one (batch row, head), from dt and the sequence ids.
struct Tokens {
  std::vector<float> d, dd_ddt, decay;  // step, its derivative w.r.t. the raw dt, exp(A d)
  std::vector<uint8_t> reset;           // token t starts a new sequence: the state before it is zero
};

// One thread's memory, reused by every item it runs.
struct Scratch {
  std::vector<float> checkpoints;  // [ceil(L / kSegment), P, N]: the state before each segment's first token
  std::vector<float> states;       // [kSegment, P, N]: h_t of the segment's tokens
  std::vector<float> lam, zero;    // [P, N]
  std::vector<float> x, B, C, dout, z, dy, dx, dz, dB, dC;  // one token's rows
  Tokens tokens;
};

Scratch make_scratch(const ForwardParams& f) {
  const int64_t L = f.seqlen, P = f.headdim, N = f.dstate, PN = P * N;
  Scratch s;
  s.checkpoints.resize((L + kSegment - 1) / kSegment * PN);
  s.states.resize(kSegment * PN);
  s.lam.resize(PN);
  s.zero.assign(PN, 0.0f);
  for (auto* row : {&s.x, &s.dout, &s.z, &s.dy, &s.dx, &s.dz}) row->resize(P);
  for (auto* row : {&s.B, &s.C, &s.dB, &s.dC}) row->resize(N);
  for (auto* v : {&s.tokens.d, &s.tokens.dd_ddt, &s.tokens.decay}) v->resize(L);
  s.tokens.reset.resize(L);
  return s;
}

void prepare_tokens(const ForwardParams& f, int64_t b, int64_t h, Tokens& tk) {
  const float bias = f.dt_bias ? f.dt_bias[h] : 0.0f;
  int64_t prev_id = 0, seq = 0;  // sequence id of the previous token (0 before token 0); packed sequence
  for (int64_t t = 0; t < f.seqlen; ++t) {
    if (f.cu_seqlens)
      while (f.cu_seqlens[seq + 1] <= t) ++seq;
    const int64_t id = f.seq_idx ? f.seq_idx[b * f.seq_idx_stride.s0 + t * f.seq_idx_stride.s1]
                     : f.cu_seqlens ? seq : 0;
    tk.reset[t] = id != prev_id;
    prev_id = id;
    const float dt = host::load(f.dt, b * f.dt_stride.s0 + t * f.dt_stride.s1 + h * f.dt_stride.s2, f.dt_dtype);
    const DtStep step = preprocess_dt_step(dt, bias, f.dt_softplus, f.dt_min, f.dt_max);
    tk.d[t] = step.d;
    tk.dd_ddt[t] = step.dd_ddt;
    tk.decay[t] = static_cast<float>(std::exp(static_cast<double>(f.A[h]) * step.d));
  }
}

// h_t = exp(A d_t) h_{t-1} + d_t x_t B_t^T (h_{t-1} taken as zero at a reset), into `out`.
void forward_token(const ForwardParams& f, int64_t b, int64_t t, int64_t h, const Tokens& tk, const float* prev,
                   float* out, Scratch& s) {
  const int64_t P = f.headdim, N = f.dstate, g = h / (f.nheads / f.ngroups);
  load_row(f.x, b * f.x_stride.s0 + t * f.x_stride.s1 + h * f.x_stride.s2, P, f.dtype, s.x.data());
  load_row(f.B, b * f.B_stride.s0 + t * f.B_stride.s1 + g * f.B_stride.s2, N, f.dtype, s.B.data());
  const float decay = tk.decay[t];
  // At a reset exp(A d) times a zero state, as in the oracle and the forward: NaN where exp(A d) is inf
  // or NaN (docs/reliability.md), while the old state's own NaN or inf stays behind.
  if (tk.reset[t]) prev = s.zero.data();
  for (int64_t i = 0; i < P; ++i) {
    const float u = tk.d[t] * s.x[i];
    const float* hp = prev + i * N;
    float* ho = out + i * N;
    for (int64_t n = 0; n < N; ++n) ho[n] = decay * hp[n] + u * s.B[n];
  }
}

// Four fp32 lanes (a GCC/Clang vector extension). The reverse pass keeps its sums over the state
// size in four partial sums, added up in a fixed order: plain loops did not keep those in registers
// (15% slower), and the order does not depend on the compiler's choices. dstate is a multiple of 16.
using F4 = float __attribute__((vector_size(16)));
F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store4(float* p, F4 v) { std::memcpy(p, &v, sizeof v); }
float sum_lanes(F4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

// Token t's rows of x, B, C, dout (and z), as fp32; dy = dout silu(z) (or dout), the gradient of y
// before the gate.
void load_token(const BackwardParams& p, int64_t b, int64_t t, int64_t h, Scratch& s) {
  const ForwardParams& f = p.fwd;
  const int64_t P = f.headdim, N = f.dstate, g = h / (f.nheads / f.ngroups);
  load_row(f.x, b * f.x_stride.s0 + t * f.x_stride.s1 + h * f.x_stride.s2, P, f.dtype, s.x.data());
  load_row(f.B, b * f.B_stride.s0 + t * f.B_stride.s1 + g * f.B_stride.s2, N, f.dtype, s.B.data());
  load_row(f.C, b * f.C_stride.s0 + t * f.C_stride.s1 + g * f.C_stride.s2, N, f.dtype, s.C.data());
  load_row(p.dout, b * p.dout_stride.s0 + t * p.dout_stride.s1 + h * p.dout_stride.s2, P, f.dtype, s.dout.data());
  if (f.z) {
    load_row(f.z, b * f.z_stride.s0 + t * f.z_stride.s1 + h * f.z_stride.s2, P, f.dtype, s.z.data());
    for (int64_t i = 0; i < P; ++i) s.dy[i] = s.dout[i] * s.z[i] / (1.0f + std::exp(-s.z[i]));
  } else {
    std::copy(s.dout.begin(), s.dout.end(), s.dy.begin());
  }
}

// One token of the reverse walk. On entry carry * lam is what reaches h_t from later tokens (and the
// final / varlen state cotangents; the carry is folded in here to save a pass over lam); on exit
// lam = lam_t = that + dy_t C_t^T. One pass over the [P, N] state computes, besides lam_t, every
// gradient of token t: dx, dz and dB, dC (this head's part) into the scratch rows, the returned
// derivative dL/dd_t, and the item's fp64 sums of dA and dD. h_t is `hcur`, h_{t-1} is `prev`
// (zeros at a reset).
double reverse_token(Shared& sh, int64_t b, int64_t t, int64_t h, const Tokens& tk, const float* hcur,
                     const float* prev, float carry, Scratch& s) {
  const ForwardParams& f = sh.p.fwd;
  const int64_t H = f.nheads, P = f.headdim, N = f.dstate;
  const float d = tk.d[t];
  std::fill(s.dB.begin(), s.dB.end(), 0.0f);
  std::fill(s.dC.begin(), s.dC.end(), 0.0f);
  double dd = 0.0, lam_prev = 0.0;  // d's input path sum_i x_i (lam B)_i; <h_{t-1}, lam_t>
  double* dD = &sh.dD_part[(b * H + h) * P];
  const float* __restrict Bt = s.B.data();
  const float* __restrict Ct = s.C.data();
  float* __restrict dBt = s.dB.data();
  float* __restrict dCt = s.dC.data();
  for (int64_t i = 0; i < P; ++i) {
    const float dyi = s.dy[i], xi = s.x[i];
    float* __restrict lr = &s.lam[i * N];
    const float* __restrict hr = hcur + i * N;
    const float* __restrict pr = prev + i * N;
    F4 y_acc = {}, lb_acc = {}, q_acc = {};
    for (int64_t n = 0; n < N; n += 4) {
      const F4 c = load4(Ct + n), hv = load4(hr + n);
      const F4 l = carry * load4(lr + n) + dyi * c;  // lam_t = carried + dy C^T
      store4(lr + n, l);
      y_acc += hv * c;                               // (h_t C)_i, for dz
      lb_acc += l * load4(Bt + n);                   // (lam_t B)_i
      q_acc += load4(pr + n) * l;                    // <h_{t-1}, lam_t>, row i
      store4(dCt + n, load4(dCt + n) + hv * dyi);    // h_t^T dy
      store4(dBt + n, load4(dBt + n) + l * xi);      // lam_t^T x (times d below)
    }
    const float Di = f.D_layout == DLayout::kPerHead ? f.D[h] : f.D_layout == DLayout::kPerHeadDim ? f.D[h * P + i] : 0.0f;
    const float lb = sum_lanes(lb_acc);
    s.dx[i] = d * lb + Di * dyi;
    if (f.z) {  // out = y silu(z): dz = dout y silu'(z)
      const float zi = s.z[i], sg = 1.0f / (1.0f + std::exp(-zi)), y = sum_lanes(y_acc) + Di * xi;
      s.dz[i] = s.dout[i] * y * sg * (1.0f + zi * (1.0f - sg));
    }
    dd += static_cast<double>(xi) * lb;
    lam_prev += sum_lanes(q_acc);
    dD[i] += static_cast<double>(dyi) * xi;
  }
  for (float& v : s.dB) v *= d;
  // d's decay path, and dA.
  const double A = f.A[h], decay = tk.decay[t];
  sh.dA_part[b * H + h] += d * decay * lam_prev;
  return dd + A * decay * lam_prev;
}

// Token t's gradient rows: dx, dz, ddt (dd back through clamp and softplus; ddt_bias sums it) to the
// caller's buffers, this head's dB and dC rows to the partial buffers.
void write_token(Shared& sh, int64_t b, int64_t t, int64_t h, double dd, const Tokens& tk, const Scratch& s) {
  const BackwardParams& p = sh.p;
  const ForwardParams& f = p.fwd;
  const int64_t L = f.seqlen, H = f.nheads, P = f.headdim, N = f.dstate;
  const float ddt = static_cast<float>(dd * tk.dd_ddt[t]);
  sh.ddt_bias_part[b * H + h] += ddt;
  host::store(p.ddt, b * p.ddt_stride.s0 + t * p.ddt_stride.s1 + h * p.ddt_stride.s2, f.dt_dtype, ddt);
  store_row(p.dx, b * p.dx_stride.s0 + t * p.dx_stride.s1 + h * p.dx_stride.s2, P, f.dtype, s.dx.data());
  if (f.z) store_row(p.dz, b * p.dz_stride.s0 + t * p.dz_stride.s1 + h * p.dz_stride.s2, P, f.dtype, s.dz.data());
  const int64_t row = ((b * L + t) * H + h) * N;
  std::copy(s.dB.begin(), s.dB.end(), &sh.dB_heads[row]);
  std::copy(s.dC.begin(), s.dC.end(), &sh.dC_heads[row]);
}

// Adds a [*, H, P, N] fp32 cotangent's (i, h) block to lam.
void add_state(std::vector<float>& lam, const float* src, const Strides4& st, int64_t i, int64_t h, int64_t P,
               int64_t N) {
  for (int64_t k = 0; k < P; ++k)
    for (int64_t n = 0; n < N; ++n) lam[k * N + n] += src[i * st.s0 + h * st.s1 + k * st.s2 + n * st.s3];
}

// The whole backward of (batch row b, head h).
void run_item(Shared& sh, int64_t b, int64_t h, Scratch& s) {
  const BackwardParams& p = sh.p;
  const ForwardParams& f = p.fwd;
  const int64_t L = f.seqlen, P = f.headdim, N = f.dstate, PN = P * N;
  const int64_t nseg = (L + kSegment - 1) / kSegment;
  Tokens& tk = s.tokens;
  prepare_tokens(f, b, h, tk);

  // Forward walk: the state entering each segment. The last segment's own states come later.
  float* cp = s.checkpoints.data();
  if (f.initial_states) {
    const Strides4& st = f.initial_states_stride;
    for (int64_t k = 0; k < P; ++k)
      for (int64_t n = 0; n < N; ++n) cp[k * N + n] = f.initial_states[b * st.s0 + h * st.s1 + k * st.s2 + n * st.s3];
  } else {
    std::fill(cp, cp + PN, 0.0f);
  }
  for (int64_t seg = 0; seg + 1 < nseg; ++seg) {
    const float* prev = cp + seg * PN;
    for (int64_t t = seg * kSegment; t < (seg + 1) * kSegment; ++t) {
      float* out = t + 1 == (seg + 1) * kSegment ? cp + (seg + 1) * PN : &s.states[(t % kSegment) * PN];
      forward_token(f, b, t, h, tk, prev, out, s);
      prev = out;
    }
  }

  // Reverse walk, a segment at a time: recompute its states, then its tokens last to first. lam
  // times `carry` is what reaches the current token's state from the later ones.
  std::fill(s.lam.begin(), s.lam.end(), 0.0f);
  float carry = 1.0f;
  for (int64_t seg = nseg - 1; seg >= 0; --seg) {
    const int64_t t0 = seg * kSegment, t1 = std::min(L, t0 + kSegment);
    const float* entry = cp + seg * PN;
    for (int64_t t = t0; t < t1; ++t)
      forward_token(f, b, t, h, tk, t == t0 ? entry : &s.states[(t - t0 - 1) * PN], &s.states[(t - t0) * PN], s);
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const bool final = t == L - 1 && p.dfinal_states, varlen = p.dvarlen_states && sh.sequence_end[t] >= 0;
      if (final || varlen) {  // the state cotangents add to the carried part: apply the carry first
        for (float& v : s.lam) v *= carry;
        carry = 1.0f;
      }
      if (final) add_state(s.lam, p.dfinal_states, p.dfinal_states_stride, b, h, P, N);
      if (varlen) add_state(s.lam, p.dvarlen_states, p.dvarlen_states_stride, sh.sequence_end[t], h, P, N);
      const float* prev = tk.reset[t] ? s.zero.data() : t == t0 ? entry : &s.states[(t - t0 - 1) * PN];
      load_token(p, b, t, h, s);
      const double dd = reverse_token(sh, b, t, h, tk, &s.states[(t - t0) * PN], prev, carry, s);
      write_token(sh, b, t, h, dd, tk, s);
      // Carry exp(A d_t) lam_t to the state before token t (to token t - 1, or out to the initial
      // state, which reaches only sequence 0), cut where token t starts a sequence. The cut writes
      // zeros rather than multiplying by 0, which would keep a NaN or inf.
      carry = tk.decay[t];
      if (t > 0 && tk.reset[t]) {
        std::fill(s.lam.begin(), s.lam.end(), 0.0f);
        carry = 1.0f;
      } else if (t == 0 && p.dinitial_states) {
        const Strides4& st = p.dinitial_states_stride;
        for (int64_t k = 0; k < P; ++k)
          for (int64_t n = 0; n < N; ++n)
            p.dinitial_states[b * st.s0 + h * st.s1 + k * st.s2 + n * st.s3] =
                tk.reset[0] ? 0.0f : carry * s.lam[k * N + n];
      }
    }
  }
}

// dB or dC row (b, t) of every group: the heads of the group summed in head order. sum: [N] scratch.
void reduce_group_rows(const ForwardParams& f, const std::vector<float>& heads, void* out, const Strides4& st,
                       int64_t b, int64_t t, std::vector<float>& sum) {
  const int64_t L = f.seqlen, H = f.nheads, N = f.dstate, heads_per_group = H / f.ngroups;
  for (int64_t g = 0; g < f.ngroups; ++g) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int64_t h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
      const float* row = &heads[((b * L + t) * H + h) * N];
      for (int64_t n = 0; n < N; ++n) sum[n] += row[n];
    }
    store_row(out, b * st.s0 + t * st.s1 + g * st.s2, N, f.dtype, sum.data());
  }
}

// dA, ddt_bias and dD: the per-(batch row, head) sums added in batch-row order.
void reduce_head_sums(const Shared& sh) {
  const BackwardParams& p = sh.p;
  const ForwardParams& f = p.fwd;
  const int64_t H = f.nheads, P = f.headdim;
  for (int64_t h = 0; h < H; ++h) {
    double dA = 0.0, ddt_bias = 0.0, dD = 0.0;
    for (int64_t b = 0; b < f.batch; ++b) {
      dA += sh.dA_part[b * H + h];
      ddt_bias += sh.ddt_bias_part[b * H + h];
    }
    p.dA[h] = static_cast<float>(dA);
    if (p.ddt_bias) p.ddt_bias[h] = static_cast<float>(ddt_bias);
    for (int64_t i = 0; i < P; ++i) {
      double dDi = 0.0;
      for (int64_t b = 0; b < f.batch; ++b) dDi += sh.dD_part[(b * H + h) * P + i];
      if (f.D_layout == DLayout::kPerHeadDim) p.dD[h * P + i] = static_cast<float>(dDi);
      dD += dDi;
    }
    if (f.D_layout == DLayout::kPerHead) p.dD[h] = static_cast<float>(dD);
  }
}

}  // namespace

void backward_cpu(const BackwardParams& p, int num_threads) {
  detail::refuse_f64(p.fwd, "cpu");  // before validate(), whose refusal cannot name the backend
  validate(p);
  detail::require_host_pointers(p, "cpu");
  detail::validate_contents_host(p.fwd);  // cu_seqlens always; seq_idx too in checked mode
  const ForwardParams& f = p.fwd;
  const int64_t b = f.batch, L = f.seqlen, H = f.nheads, P = f.headdim, N = f.dstate;

  Shared sh{p, std::vector<int64_t>(L, -1), {}, {}, {}, {}, {}};
  for (int64_t s = 0; f.cu_seqlens && s < f.nseqs; ++s)
    if (f.cu_seqlens[s] < f.cu_seqlens[s + 1]) sh.sequence_end[f.cu_seqlens[s + 1] - 1] = s;
  sh.dB_heads.resize(b * L * H * N);
  sh.dC_heads.resize(b * L * H * N);
  sh.dA_part.assign(b * H, 0.0);
  sh.ddt_bias_part.assign(b * H, 0.0);
  sh.dD_part.assign(b * H * P, 0.0);

  cpu::parallel_for(b * H, num_threads, [&] {
    return [&, s = make_scratch(f)](int64_t i) mutable { run_item(sh, i / H, i % H, s); };
  });
  cpu::parallel_for(b * L, num_threads, [&] {
    return [&, sum = std::vector<float>(N)](int64_t i) mutable {
      reduce_group_rows(f, sh.dB_heads, p.dB, p.dB_stride, i / L, i % L, sum);
      reduce_group_rows(f, sh.dC_heads, p.dC, p.dC_stride, i / L, i % L, sum);
    };
  });
  reduce_head_sums(sh);
}

}  // namespace mamba2ssd
