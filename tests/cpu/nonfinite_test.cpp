// Non-finite inputs (docs/reliability.md): validate() does not read tensor contents, so NaN and inf
// in any input run through. The CPU backend must put them where the fp64 oracle does: every output
// element finite exactly where the oracle's is (and then within the tolerance), and nothing reaches a
// batch row, a head or a packed sequence that the value cannot reach by the contract.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backward_cases.h"
#include "helpers.h"
#include "nonfinite_cases.h"
#include "testing/backward_problem.h"
#include "testing/decode_problem.h"
#include "testing/prefill_problem.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

ProblemConfig config_of(const Poison& c) {
  ProblemConfig p;
  p.batch = c.packed ? 1 : 2, p.seqlen = 70, p.nheads = 4, p.ngroups = 2, p.headdim = 32, p.dstate = 16;
  p.chunk_size = 64, p.dtype = c.dtype, p.dt_dtype = c.dtype;
  p.z = true, p.D_layout = DLayout::kPerHeadDim, p.dt_bias = true, p.initial_states = true;
  if (c.packed) p.seqlens = {30, 40};  // a reset at token 30
  return p;
}

// Token 20 of the first sequence.
void put(HostProblem& problem, const Poison& c) { put_poison(problem, c, 20); }

class NonFinite : public ::testing::TestWithParam<Poison> {};

TEST_P(NonFinite, CpuPutsItWhereTheOracleDoes) {
  const Poison& c = GetParam();
  HostProblem problem(config_of(c));
  put(problem, c);
  const ForwardParams p = problem.params();
  problem.poison_outputs();
  ASSERT_NO_THROW(forward_cpu(p));
  const reference::Result want = reference::run(p);

  const int64_t L = p.seqlen, H = p.nheads, P = p.headdim, N = p.dstate;
  const bool per_head = per_head_input(c.tensor);
  int64_t want_nonfinite = 0, outside = 0;
  // Elements the value cannot reach: another batch row (a per-row input), another head (a per-head
  // input), a token before 20 (inputs at token 20), the second packed sequence (after the reset).
  auto reachable = [&](int64_t b, int64_t t, int64_t h) {
    if (b != 0 && !per_head) return false;
    if (per_head && h != 1) return false;
    if (!per_head && c.tensor != "initial_states" && t >= 0 && t < 20) return false;
    if (c.packed && !per_head && t >= 30) return false;
    return true;
  };
  ComparisonBuilder y("y");
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < P; ++i) {
          const double got = host::load(p.y, b * p.y_stride.s0 + t * p.y_stride.s1 + h * p.y_stride.s2 + i, p.dtype);
          const double ref = want.y[((b * L + t) * H + h) * P + i];
          ASSERT_EQ(std::isfinite(got), std::isfinite(ref)) << "y[" << b << ", " << t << ", " << h << ", " << i
                                                            << "]: cpu " << got << ", oracle " << ref;
          if (!std::isfinite(ref)) {
            ++want_nonfinite;
            outside += !reachable(b, t, h);
          } else {
            y.add(got, ref);
          }
        }
  const Comparison cy = y.done(rel_l2_tolerance(p.dtype));
  EXPECT_LE(cy.rel_l2, cy.tolerance) << "y where finite";
  auto states = [&](const char* name, const float* base, const Strides4& st, const std::vector<double>& ref, int64_t n0,
                    bool last_tokens) {
    ComparisonBuilder acc(name);
    for (int64_t s = 0; s < n0; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < P; ++i)
          for (int64_t k = 0; k < N; ++k) {
            const double got = base[s * st.s0 + h * st.s1 + i * st.s2 + k];
            const double r = ref[((s * H + h) * P + i) * N + k];
            ASSERT_EQ(std::isfinite(got), std::isfinite(r)) << name << "[" << s << ", " << h << ", " << i << ", " << k
                                                            << "]: cpu " << got << ", oracle " << r;
            if (!std::isfinite(r)) {
              ++want_nonfinite;
              // A final state is reachable where its row's last token is; varlen state s ends at
              // token 29 (s = 0) or 69 (s = 1).
              outside += !reachable(last_tokens ? 0 : s, last_tokens ? (s == 0 ? 29 : 69) : L - 1, h);
            } else {
              acc.add(got, r);
            }
          }
    const Comparison cmp = acc.done(rel_l2_tolerance(p.dtype));
    EXPECT_LE(cmp.rel_l2, cmp.tolerance) << name << " where finite";
  };
  states("final_states", p.final_states, p.final_states_stride, want.final_states, p.batch, false);
  if (c.packed) states("varlen_states", p.varlen_states, p.varlen_states_stride, want.varlen_states, p.nseqs, true);
  EXPECT_EQ(outside, 0) << "non-finite values where the contract cannot put them";
  // Only a clamped value leaves every output finite: -inf in dt or dt_bias (the step is clamped to
  // dt_min, 0). -inf in A makes the decay 0 (the state restarts from the token's input), except at a
  // step clamped to 0, where A d = -inf * 0 is NaN: either may happen, as in the oracle.
  if (clamped_poison(c)) EXPECT_EQ(want_nonfinite, 0);
  else if (!minus_inf_A(c)) EXPECT_GT(want_nonfinite, 0);
  std::printf("%s %s %s%s: %lld non-finite outputs\n", c.tensor.c_str(), value_name(c.value).c_str(), to_string(c.dtype),
              c.packed ? " packed" : "", static_cast<long long>(want_nonfinite));
}

INSTANTIATE_TEST_SUITE_P(Inputs, NonFinite, ::testing::ValuesIn(poison_cases()),
                         [](const auto& info) { return poison_name(info.param); });

// The backward of the same calls (dout and the cotangents finite): every gradient element finite
// exactly where the oracle's is, and within the backward's tolerance where it is. Writing it found
// the CPU backward's recomputed state at a reset skipping exp(A d) * 0 (a finite dC and dz where
// the contract has NaN), the forward's old bug (fixed in src/cpu/backward_cpu.cpp). Returns the
// oracle's non-finite gradient elements.
int64_t expect_backward_where_the_oracle_is(BackwardProblem& problem, DType dtype) {
  problem.poison_gradients();
  EXPECT_NO_THROW(backward_cpu(problem.params()));
  const reference::Grads64 ref = backward_oracle(problem);
  int64_t nonfinite = 0;
  for (const auto& [name, view] : problem.gradients) {
    const std::vector<double> got = read_gradient(problem, problem.buffers, name);
    const std::vector<double>& want = oracle_gradient(ref, name);
    EXPECT_EQ(got.size(), want.size()) << name;
    ComparisonBuilder acc(name);
    int64_t mismatches = 0;
    for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
      if (std::isfinite(got[i]) != std::isfinite(want[i]) && mismatches++ == 0)
        ADD_FAILURE() << name << "[" << i << "]: cpu " << got[i] << ", oracle " << want[i] << " (the first)";
      if (std::isfinite(want[i])) acc.add(got[i], want[i]);
      nonfinite += !std::isfinite(want[i]);
    }
    EXPECT_EQ(mismatches, 0) << name << ": elements finite in one and not the other";
    const bool sum = name == "dA" || name == "ddt_bias" || name == "dD";
    const Comparison cmp = acc.done(sum ? backward_sum_rel_l2_tolerance(dtype) : backward_rel_l2_tolerance(dtype));
    EXPECT_LE(cmp.rel_l2, cmp.tolerance) << name << " where finite";
  }
  return nonfinite;
}

class NonFiniteBackward : public ::testing::TestWithParam<Poison> {};

TEST_P(NonFiniteBackward, CpuPutsItWhereTheOracleDoes) {
  const Poison& c = GetParam();
  BackwardProblem problem(config_of(c));
  put(problem.forward, c);
  const int64_t nonfinite = expect_backward_where_the_oracle_is(problem, c.dtype);
  if (clamped_poison(c)) EXPECT_EQ(nonfinite, 0);
  else if (!minus_inf_A(c)) EXPECT_GT(nonfinite, 0);
}

INSTANTIATE_TEST_SUITE_P(Inputs, NonFiniteBackward, ::testing::ValuesIn(poison_cases()),
                         [](const auto& info) { return poison_name(info.param); });

// -inf in A meets a step clamped to 0 (-inf in dt) at the packed reset (token 30): A d = -inf * 0 is
// NaN there, and the state of the new sequence NaN from that token on.
TEST(NonFiniteBackward, MinusInfAAtAClampedStepOnTheReset) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(to_string(dtype));
    const float inf = std::numeric_limits<float>::infinity();
    const Poison a{"A", -inf, dtype, true};
    BackwardProblem problem(config_of(a));
    put(problem.forward, a);
    const ForwardParams p = problem.forward.params();
    host::store(problem.forward.buffers.at("dt").data(), 30 * p.dt_stride.s1 + 1, p.dt_dtype, -inf);  // head 1
    EXPECT_GT(expect_backward_where_the_oracle_is(problem, dtype), 0);
  }
}

// NaN and inf in dout run through (no exception) and reach the same gradients as in the oracle: the
// poisoned token's head and group, not the other batch row.
TEST(NonFiniteBackward, DoutPropagates) {
  ProblemConfig c = backward_base(2, 70, 4, 2, 32, 16, DType::kF32);
  c.z = true, c.initial_states = true, c.dt_bias = true;
  BackwardProblem problem(c);
  const GradView& dout = problem.cotangents.at("dout");
  float* g = reinterpret_cast<float*>(problem.buffers.at("dout").data());
  g[30 * dout.stride[1] + 1 * dout.stride[2] + 5] = std::numeric_limits<float>::quiet_NaN();  // b 0, t 30, h 1
  g[50 * dout.stride[1] + 1 * dout.stride[2] + 7] = std::numeric_limits<float>::infinity();
  EXPECT_GT(expect_backward_where_the_oracle_is(problem, c.dtype), 0);
  const std::vector<double> dx = read_gradient(problem, problem.buffers, "dx");  // batch row 1 is untouched
  for (std::size_t i = dx.size() / 2; i < dx.size(); ++i) ASSERT_TRUE(std::isfinite(dx[i])) << i;
}

// The decode step and the packed prefill take the same inputs: the host backends must also put a
// non-finite value where their oracles do (the cache included). Finiteness is compared element by
// element (nonfinite_cases.h); the values where finite are the matrices' business (decode_test,
// prefill_test).
TEST(NonFiniteServing, DecodeCpuPutsItWhereTheOracleDoes) {
  for (const char* tensor : kServingInputs)
    for (float value : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(std::string(tensor) + " " + value_name(value));
      DecodeConfig c;
      c.batch = 3, c.ntokens = 2, c.nheads = 4, c.headdim = 32, c.dstate = 16, c.dtype = DType::kF32;
      c.z = c.dt_bias = c.dst_indices = true;
      HostDecodeProblem cpu(c), ref(c);
      for (HostDecodeProblem* p : {&cpu, &ref}) put_serving(p->buffers.at(tensor), tensor, value);
      ASSERT_NO_THROW(decode_cpu(cpu.params()));
      ASSERT_NO_THROW(decode_reference(ref.params()));
      EXPECT_EQ(finiteness_mismatches(cpu.buffers.at("out"), ref.buffers.at("out"), c.dtype), 0) << "out";
      EXPECT_EQ(finiteness_mismatches(cpu.buffers.at("state"), ref.buffers.at("state"), c.state_dtype), 0) << "state";
    }
}

// With every step negative too (dt_min 0 clamps it to 0), so that -inf in A meets A d = -inf * 0.
TEST(NonFiniteServing, PrefillCpuPutsItWhereTheOracleDoes) {
  for (const char* tensor : kServingInputs)
    for (float value : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()})
      for (bool negative_steps : {false, true}) {
        SCOPED_TRACE(std::string(tensor) + " " + value_name(value) + (negative_steps ? " negative steps" : ""));
        PrefillConfig c;  // requests {37, 0, 1, 70, 5}, half of them reading their slot
        c.dtype = DType::kF32, c.z = c.dt_bias = true, c.state_every = 64;
        HostPrefillProblem cpu(c), ref(c);
        for (HostPrefillProblem* p : {&cpu, &ref}) {
          if (negative_steps)
            for (std::size_t i = 0; i < p->fwd.buffers.at("dt").size() / 4; ++i)
              host::store(p->fwd.buffers.at("dt").data(), i, DType::kF32, -5.0f);
          put_serving(p->fwd.buffers.at(tensor), tensor, value);
        }
        ASSERT_NO_THROW(prefill_cpu(cpu.params()));
        ASSERT_NO_THROW(prefill_reference(ref.params()));
        EXPECT_EQ(finiteness_mismatches(cpu.fwd.buffers.at("y"), ref.fwd.buffers.at("y"), c.dtype), 0) << "y";
        EXPECT_EQ(finiteness_mismatches(cpu.state, ref.state, c.state_dtype), 0) << "the cache";
      }
}

}  // namespace
}  // namespace mamba2ssd::testing
