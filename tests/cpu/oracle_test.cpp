// The oracle against closed forms computed independently here, on inputs edited so that the
// recurrence collapses (no decay, one token, no state readout, a reset at every token, packed
// sequences). Each case also runs the CPU path against the oracle: these are its edge cases too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

// fp64 agreement up to rounding of a short sum.
void expect_close(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-10 * (1.0 + std::abs(want))) << what;
}

ProblemConfig small_f32() {
  ProblemConfig c;
  c.batch = 2, c.seqlen = 37, c.nheads = 4, c.ngroups = 2, c.headdim = 32, c.dstate = 16;
  c.chunk_size = 64;
  c.dtype = DType::kF32;
  return c;
}

// A = 0: no decay, the state is a prefix sum and
// y_t = sum_{s<=t} d_s x_s (B_s . C_t) + D x_t, final = sum_s d_s x_s B_s^T.
TEST(OracleClosedForm, NoDecayIsAPrefixSum) {
  ProblemConfig c = small_f32();
  c.dt_bias = true, c.dt_softplus = true;  // d is still whatever preprocessing makes of dt
  HostProblem problem(c);
  for (int64_t h = 0; h < c.nheads; ++h) buffer<float>(problem, "A")[h] = 0.0f;
  const Inputs in(problem);
  const reference::Result r = oracle(problem);

  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.nheads; ++h) {
      const int64_t g = in.group(h);
      for (int64_t t = 0; t < c.seqlen; ++t)
        for (int64_t i = 0; i < c.headdim; ++i) {
          double want = in.D(h, i) * in.x(b, t, h, i);
          for (int64_t s = 0; s <= t; ++s) {
            double bc = 0.0;
            for (int64_t n = 0; n < c.dstate; ++n) bc += in.B(b, s, g, n) * in.C(b, t, g, n);
            want += in.d(b, s, h) * in.x(b, s, h, i) * bc;
          }
          expect_close(r.y[((b * c.seqlen + t) * c.nheads + h) * c.headdim + i], want, "y");
        }
      for (int64_t i = 0; i < c.headdim; ++i)
        for (int64_t n = 0; n < c.dstate; ++n) {
          double want = 0.0;
          for (int64_t s = 0; s < c.seqlen; ++s) want += in.d(b, s, h) * in.x(b, s, h, i) * in.B(b, s, g, n);
          expect_close(r.final_states[((b * c.nheads + h) * c.headdim + i) * c.dstate + n], want, "final");
        }
    }
  expect_cpu_matches_oracle(problem);
}

// L = 1: h = exp(A d) h0 + d x B^T, y = (h C + D x) * silu(z).
TEST(OracleClosedForm, OneToken) {
  ProblemConfig c = small_f32();
  c.seqlen = 1;
  c.initial_states = true, c.z = true, c.dt_bias = true, c.dt_softplus = true;
  c.D_layout = DLayout::kPerHeadDim;
  HostProblem problem(c);
  const Inputs in(problem);
  const reference::Result r = oracle(problem);

  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.nheads; ++h) {
      const int64_t g = in.group(h);
      const double d = in.d(b, 0, h), decay = std::exp(static_cast<double>(in.p.A[h]) * d);
      for (int64_t i = 0; i < c.headdim; ++i) {
        double y = in.D(h, i) * in.x(b, 0, h, i);
        for (int64_t n = 0; n < c.dstate; ++n) {
          const double state = decay * in.init(b, h, i, n) + d * in.x(b, 0, h, i) * in.B(b, 0, g, n);
          y += state * in.C(b, 0, g, n);
          expect_close(r.final_states[((b * c.nheads + h) * c.headdim + i) * c.dstate + n], state, "final");
        }
        const double z = in.z(b, 0, h, i);
        expect_close(r.y[(b * c.nheads + h) * c.headdim + i], y * z / (1.0 + std::exp(-z)), "y");
      }
    }
  expect_cpu_matches_oracle(problem);
}

// C = 0: nothing of the state reaches y, so y = D x, whatever the state does.
TEST(OracleClosedForm, DOnly) {
  ProblemConfig c = small_f32();
  c.dtype = DType::kBF16;
  c.D_layout = DLayout::kPerHeadDim;
  c.initial_states = true;
  HostProblem problem(c);
  auto& C = problem.buffers.at("C");
  std::memset(C.data(), 0, C.size());  // bf16 zero is all-zero bits
  const Inputs in(problem);
  const reference::Result r = oracle(problem);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t t = 0; t < c.seqlen; ++t)
      for (int64_t h = 0; h < c.nheads; ++h)
        for (int64_t i = 0; i < c.headdim; ++i)
          EXPECT_EQ(r.y[((b * c.seqlen + t) * c.nheads + h) * c.headdim + i], in.D(h, i) * in.x(b, t, h, i));
  expect_cpu_matches_oracle(problem);
}

// seq_idx[t] = t + 1: every token starts a new sequence (token 0 too, so initial_states never
// reach), hence y_t = d_t x_t (B_t . C_t) + D x_t and final = d_{L-1} x_{L-1} B_{L-1}^T.
TEST(OracleClosedForm, ResetAtEveryToken) {
  ProblemConfig c = small_f32();
  c.initial_states = true;
  HostProblem problem(c);
  std::vector<uint8_t> seq(c.batch * c.seqlen * sizeof(int32_t));
  for (int64_t i = 0; i < c.batch * c.seqlen; ++i)
    reinterpret_cast<int32_t*>(seq.data())[i] = static_cast<int32_t>(i % c.seqlen + 1);
  problem.buffers["seq_idx"] = seq;  // laid out [b, L] as params() expects
  const Inputs in(problem);
  ASSERT_NE(in.p.seq_idx, nullptr);
  const reference::Result r = oracle(problem);

  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.nheads; ++h) {
      const int64_t g = in.group(h);
      for (int64_t t = 0; t < c.seqlen; ++t) {
        double bc = 0.0;
        for (int64_t n = 0; n < c.dstate; ++n) bc += in.B(b, t, g, n) * in.C(b, t, g, n);
        for (int64_t i = 0; i < c.headdim; ++i)
          expect_close(r.y[((b * c.seqlen + t) * c.nheads + h) * c.headdim + i],
                       in.d(b, t, h) * in.x(b, t, h, i) * bc + in.D(h, i) * in.x(b, t, h, i), "y");
      }
      const int64_t t = c.seqlen - 1;
      for (int64_t i = 0; i < c.headdim; ++i)
        for (int64_t n = 0; n < c.dstate; ++n)
          expect_close(r.final_states[((b * c.nheads + h) * c.headdim + i) * c.dstate + n],
                       in.d(b, t, h) * in.x(b, t, h, i) * in.B(b, t, g, n), "final");
    }
  expect_cpu_matches_oracle(problem);
}

// Packed sequences, with seq_idx given or derived from cu_seqlens.
class OraclePacked : public ::testing::TestWithParam<bool> {};

// initial_states reach only sequence 0: the difference they make is exp(A sum_{s<=t} d_s) (h0 C_t)
// on its tokens and nothing after; the varlen state of sequence 0 moves by exp(A sum d) h0.
TEST_P(OraclePacked, InitialStatesReachOnlySequenceZero) {
  ProblemConfig c = small_f32();
  c.batch = 1, c.seqlen = 30, c.seqlens = {9, 12, 9}, c.seq_idx = GetParam();
  c.initial_states = true;
  HostProblem with(c);
  HostProblem without = with;
  auto& init = without.buffers.at("initial_states");
  std::memset(init.data(), 0, init.size());
  const Inputs in(with);
  const reference::Result r1 = oracle(with), r0 = oracle(without);

  const int64_t H = c.nheads, P = c.headdim, N = c.dstate;
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = in.group(h);
    double cum = 0.0;  // sum of d over sequence 0 so far
    for (int64_t t = 0; t < c.seqlen; ++t) {
      cum += in.d(0, t, h);
      const double decay = std::exp(static_cast<double>(in.p.A[h]) * cum);
      for (int64_t i = 0; i < P; ++i) {
        double want = 0.0;
        if (t < 9)
          for (int64_t n = 0; n < N; ++n) want += decay * in.init(0, h, i, n) * in.C(0, t, g, n);
        const int64_t at = (t * H + h) * P + i;
        expect_close(r1.y[at] - r0.y[at], want, "y difference");
      }
      if (t == 8)
        for (int64_t i = 0; i < P * N; ++i) {
          const int64_t at = (0 * H + h) * P * N + i;
          expect_close(r1.varlen_states[at] - r0.varlen_states[at], decay * in.init(0, h, i / N, i % N),
                       "varlen state 0 difference");
        }
    }
  }
  for (int64_t i = H * P * N; i < 3 * H * P * N; ++i) EXPECT_EQ(r1.varlen_states[i], r0.varlen_states[i]);
  EXPECT_EQ(r1.final_states, r0.final_states);
  expect_cpu_matches_oracle(with);
}

// The varlen state of each packed sequence is the final state of that sequence run alone, and so
// are its outputs; an empty sequence's varlen state is zero.
TEST_P(OraclePacked, VarlenStatesAreFinalStatesOfEachSequenceAlone) {
  ProblemConfig c = small_f32();
  c.batch = 1, c.seqlens = {0, 7, 1, 12, 0, 5, 0}, c.seqlen = 25, c.seq_idx = GetParam();
  c.z = true, c.dt_softplus = true;
  HostProblem packed(c);
  const reference::Result rp = oracle(packed);
  const int64_t H = c.nheads, P = c.headdim, N = c.dstate;

  int64_t start = 0;
  for (std::size_t s = 0; s < c.seqlens.size(); ++s) {
    const int64_t len = c.seqlens[s];
    const double* varlen = &rp.varlen_states[s * H * P * N];
    if (len == 0) {
      for (int64_t i = 0; i < H * P * N; ++i) EXPECT_EQ(varlen[i], 0.0) << "empty sequence " << s;
      continue;
    }
    ProblemConfig ca = c;
    ca.seqlen = len, ca.seqlens = {}, ca.seq_idx = false;
    HostProblem alone(ca);
    // Same tokens: copy the packed rows (contiguous layouts, batch 1) and the per-head parameters.
    for (const char* name : {"x", "z", "B", "C", "dt"}) {
      auto& dst = alone.buffers.at(name);
      const auto& src = packed.buffers.at(name);
      const std::size_t row = src.size() / c.seqlen;
      std::memcpy(dst.data(), src.data() + start * row, len * row);
    }
    for (const char* name : {"A", "D"}) alone.buffers.at(name) = packed.buffers.at(name);
    const reference::Result ra = oracle(alone);
    for (int64_t i = 0; i < H * P * N; ++i) expect_close(varlen[i], ra.final_states[i], "varlen state");
    for (int64_t i = 0; i < len * H * P; ++i) expect_close(rp.y[start * H * P + i], ra.y[i], "y");
    start += len;
  }
  expect_cpu_matches_oracle(packed);
}

INSTANTIATE_TEST_SUITE_P(SeqIdx, OraclePacked, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "WithSeqIdx" : "FromCuSeqlens"; });

}  // namespace
}  // namespace mamba2ssd::testing
