// The fp64 oracle. Loop for loop the recurrence of docs/contract.md; no chunking, no cleverness.
// The inputs are first loaded into fp64 arrays (Inputs64), so that the backward and its
// finite-difference tests run on exactly the same recurrence.
#include "reference/reference.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "api/internal.h"
#include "common/host_dtype.h"

namespace mamba2ssd::reference {
namespace {

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

// Indices [first, first + count) of one dimension.
struct Range {
  int64_t first, count;
};

// The box `r` of a strided 4-d tensor of dtype t, as fp64 in row-major order.
std::vector<double> load_box(const void* base, DType t, const std::array<int64_t, 4>& stride,
                             const std::array<Range, 4>& r) {
  std::vector<double> out;
  out.reserve(r[0].count * r[1].count * r[2].count * r[3].count);
  for (int64_t i = r[0].first; i < r[0].first + r[0].count; ++i)
    for (int64_t j = r[1].first; j < r[1].first + r[1].count; ++j)
      for (int64_t k = r[2].first; k < r[2].first + r[2].count; ++k)
        for (int64_t l = r[3].first; l < r[3].first + r[3].count; ++l)
          out.push_back(host::load_double(base, i * stride[0] + j * stride[1] + k * stride[2] + l * stride[3], t));
  return out;
}

std::array<int64_t, 4> strides(const Strides4& s) { return {s.s0, s.s1, s.s2, s.s3}; }

// Elements [first, first + count) of a contiguous array the API declares float* (doubles in an fp64
// call: float_tensor_dtype).
std::vector<double> load_span(const float* base, DType t, int64_t first, int64_t count) {
  std::vector<double> out(count);
  for (int64_t i = 0; i < count; ++i) out[i] = host::load_double(base, first + i, t);
  return out;
}

Slice resolve(const ForwardParams& p, Slice s) {
  if (s.batch_end < 0) s.batch_end = p.batch;
  if (s.head_end < 0) s.head_end = p.nheads;
  if (s.token_end < 0) s.token_end = p.seqlen;
  if (s.batch_begin < 0 || s.batch_begin > s.batch_end || s.batch_end > p.batch || s.head_begin < 0 ||
      s.head_begin > s.head_end || s.head_end > p.nheads || s.token_begin < 0 || s.token_begin > s.token_end ||
      s.token_end > p.seqlen)
    throw Error("reference::run: slice out of range");
  return s;
}

}  // namespace

Inputs64 load_inputs(const ForwardParams& p, const Slice& slice) {
  const Slice s = resolve(p, slice);
  detail::validate_contents_host(p);
  const int64_t L = p.seqlen, P = p.headdim, N = p.dstate, heads_per_group = p.nheads / p.ngroups;
  const Range rb = {s.batch_begin, s.batch_end - s.batch_begin}, rh = {s.head_begin, s.head_end - s.head_begin};
  const Range rt = {0, L}, rp = {0, P}, rn = {0, N}, one = {0, 1};
  const int64_t g0 = s.head_begin / heads_per_group;
  const Range rg = {g0, rh.count == 0 ? 0 : (s.head_end - 1) / heads_per_group + 1 - g0};

  Inputs64 in;
  in.batch = rb.count, in.seqlen = L, in.nheads = rh.count, in.headdim = P, in.ngroups = rg.count, in.dstate = N;
  for (int64_t h = s.head_begin; h < s.head_end; ++h) in.group.push_back(h / heads_per_group - g0);
  in.x = load_box(p.x, p.dtype, strides(p.x_stride), {rb, rt, rh, rp});
  in.dt = load_box(p.dt, p.dt_dtype, {p.dt_stride.s0, p.dt_stride.s1, p.dt_stride.s2, 0}, {rb, rt, rh, one});
  const DType ft = detail::float_tensor_dtype(p);
  in.A = load_span(p.A, ft, rh.first, rh.count);
  in.B = load_box(p.B, p.dtype, strides(p.B_stride), {rb, rt, rg, rn});
  in.C = load_box(p.C, p.dtype, strides(p.C_stride), {rb, rt, rg, rn});
  in.D_layout = p.D_layout;
  if (p.D_layout == DLayout::kPerHead) in.D = load_span(p.D, ft, rh.first, rh.count);
  if (p.D_layout == DLayout::kPerHeadDim) in.D = load_span(p.D, ft, rh.first * P, rh.count * P);
  if (p.z) in.z = load_box(p.z, p.dtype, strides(p.z_stride), {rb, rt, rh, rp});
  if (p.dt_bias) in.dt_bias = load_span(p.dt_bias, ft, rh.first, rh.count);
  in.dt_softplus = p.dt_softplus;
  in.dt_min = p.dt_min, in.dt_max = p.dt_max;
  if (p.initial_states)
    in.initial_states = load_box(p.initial_states, ft, strides(p.initial_states_stride), {rb, rh, rp, rn});
  for (int64_t b = s.batch_begin; b < s.batch_end; ++b) {
    const std::vector<int64_t> ids = seq_ids(p, b);
    in.seq.insert(in.seq.end(), ids.begin(), ids.end());
  }
  if (p.cu_seqlens) in.cu_seqlens.assign(p.cu_seqlens, p.cu_seqlens + p.nseqs + 1);
  return in;
}

Step dt_step(const Inputs64& in, int64_t b, int64_t t, int64_t h) {
  Step s;
  s.d = in.dt[in.token_head(b, t, h)];
  s.dd_ddt = 1.0;
  if (!in.dt_bias.empty()) s.d += in.dt_bias[h];
  if (in.dt_softplus && s.d <= 20.0) {  // softplus' = sigmoid; identity above 20, as the peer does
    s.dd_ddt = 1.0 / (1.0 + std::exp(-s.d));
    s.d = std::log1p(std::exp(s.d));
  }
  if (s.d < in.dt_min) s.d = in.dt_min, s.dd_ddt = 0.0;  // comparisons keep NaN as NaN
  if (s.d > in.dt_max) s.d = in.dt_max, s.dd_ddt = 0.0;
  return s;
}

Outputs64 forward64(const Inputs64& in, int64_t token_begin, int64_t token_end) {
  const int64_t L = in.seqlen, H = in.nheads, P = in.headdim, N = in.dstate, S = in.nseqs();
  if (token_end < 0) token_end = L;
  Outputs64 out;
  out.token_begin = token_begin, out.ntokens = token_end - token_begin;
  out.y.assign(in.batch * out.ntokens * H * P, 0.0);
  out.final_states.assign(in.batch * H * P * N, 0.0);
  out.varlen_states.assign(S * H * P * N, 0.0);

  std::vector<double> state(P * N);
  for (int64_t b = 0; b < in.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < P * N; ++i)
        state[i] = in.initial_states.empty() ? 0.0 : in.initial_states[in.state_at(b, h) + i];
      const int64_t* seq = &in.seq[b * L];
      int64_t next_end = 0;  // the next packed sequence whose end is still ahead
      for (int64_t t = 0; t < L; ++t) {
        if (seq[t] != (t == 0 ? 0 : seq[t - 1]))  // a new sequence starts
          std::fill(state.begin(), state.end(), 0.0);

        const double d = dt_step(in, b, t, h).d;
        const double decay = std::exp(in.A[h] * d);
        const double* x = &in.x[in.x_row(b, t, h)];
        const double* Bt = &in.B[in.BC_row(b, t, h)];
        const double* Ct = &in.C[in.BC_row(b, t, h)];

        // h = exp(A d) h + d outer(x, B);  y = h C + D x;  out = y * silu(z)
        for (int64_t i = 0; i < P; ++i) {
          double* hrow = &state[i * N];
          double yi = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            hrow[n] = decay * hrow[n] + d * x[i] * Bt[n];
            yi += hrow[n] * Ct[n];
          }
          if (in.D_layout != DLayout::kNone) yi += in.D_at(h, i) * x[i];
          if (!in.z.empty()) {
            const double zi = in.z[in.x_row(b, t, h) + i];
            yi *= zi / (1.0 + std::exp(-zi));
          }
          if (t >= token_begin && t < token_end)
            out.y[((b * out.ntokens + t - token_begin) * H + h) * P + i] = yi;
        }

        // With packed sequences, the state at each sequence's last token is its varlen state
        // (an empty sequence keeps zeros).
        for (; next_end < S && in.cu_seqlens[next_end + 1] <= t + 1; ++next_end)
          if (in.cu_seqlens[next_end] < in.cu_seqlens[next_end + 1])
            std::copy(state.begin(), state.end(), &out.varlen_states[in.state_at(next_end, h)]);
      }
      std::copy(state.begin(), state.end(), &out.final_states[in.state_at(b, h)]);
    }
  }
  return out;
}

Result run(const ForwardParams& p, Slice slice) {
  slice = resolve(p, slice);
  Outputs64 out = forward64(load_inputs(p, slice), slice.token_begin, slice.token_end);
  Result r;
  r.slice = slice;
  r.nb = slice.batch_end - slice.batch_begin;
  r.nh = slice.head_end - slice.head_begin;
  r.nt = slice.token_end - slice.token_begin;
  r.headdim = p.headdim;
  r.dstate = p.dstate;
  r.nseqs = p.cu_seqlens ? p.nseqs : 0;
  r.y = std::move(out.y);
  r.final_states = std::move(out.final_states);
  r.varlen_states = std::move(out.varlen_states);
  return r;
}

}  // namespace mamba2ssd::reference

namespace mamba2ssd {

void forward_reference(const ForwardParams& p) {
  detail::validate_reference(p);  // validate() with fp64 allowed
  detail::require_host_pointers(p, "reference");
  const reference::Result r = reference::run(p);
  const int64_t L = p.seqlen, H = p.nheads, P = p.headdim, N = p.dstate;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < P; ++i)
          host::store_double(p.y, b * p.y_stride.s0 + t * p.y_stride.s1 + h * p.y_stride.s2 + i, p.dtype,
                             r.y[((b * L + t) * H + h) * P + i]);
  auto put_states = [&](float* out, const Strides4& s, const std::vector<double>& src, int64_t n0) {
    for (int64_t i = 0; i < n0; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t pi = 0; pi < P; ++pi)
          for (int64_t n = 0; n < N; ++n)
            host::store_double(out, i * s.s0 + h * s.s1 + pi * s.s2 + n * s.s3, detail::float_tensor_dtype(p),
                               src[((i * H + h) * P + pi) * N + n]);
  };
  if (p.final_states) put_states(p.final_states, p.final_states_stride, r.final_states, p.batch);
  if (p.varlen_states) put_states(p.varlen_states, p.varlen_states_stride, r.varlen_states, p.nseqs);
}

}  // namespace mamba2ssd
