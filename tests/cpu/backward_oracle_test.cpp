// The backward oracle against central finite differences of the fp64 forward, for every element of
// every input of small problems, feature by feature; then backward_reference as a backend (the
// oracle's gradients rounded to each gradient's dtype).
//
// The problems are built directly as reference::Inputs64, with sizes the API would refuse (head dim 4,
// state size 3), so that perturbing every element stays cheap. The loss is
// sum(dout * y) + sum(dfinal * final_states) + sum(dvarlen * varlen_states) with random cotangents.
// Inputs are drawn away from the points where the function is not differentiable (the clamp's
// bounds) and from the softplus threshold, by far more than the perturbation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backward_helpers.h"
#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

using reference::Grads64;
using reference::Inputs64;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kStep = 1e-3;         // finite-difference step (4th-order stencil below)
constexpr double kEdgeMargin = 0.02;   // how far a drawn d stays from a clamp bound (>> 2 kStep)
// |fd - grad| <= kRelTolerance * (|grad| + rms of the tensor). Measured agreement: about 1e-10 (at
// 1e-11, a hundred-odd elements fail); 1e-9 leaves a margin of ten.
constexpr double kRelTolerance = 1e-9;

struct FdCase {
  std::string name;
  int64_t batch = 2, seqlen = 11, nheads = 4, headdim = 4, dstate = 3, ngroups = 2;
  bool z = false;
  DLayout D_layout = DLayout::kNone;
  bool dt_bias = false, dt_softplus = false;
  double dt_min = 0.0, dt_max = kInf;
  bool initial_states = false, dfinal = false, dvarlen = false;
  std::vector<int64_t> seq;         // [b, L] sequence ids; empty: all 0, or from cu_seqlens
  std::vector<int64_t> cu_seqlens;  // packed sequences (batch 1)
  int64_t big_dt_tokens = 0;        // tokens whose dt + bias is pushed above softplus' threshold 20
  uint64_t seed = 1;
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

struct FdProblem {
  Inputs64 in;
  std::vector<double> dout, dfinal, dvarlen;
};

// d before the clamp, for a raw dt of head h.
double unclamped(const Inputs64& in, double dt, int64_t h) {
  double u = dt + (in.dt_bias.empty() ? 0.0 : in.dt_bias[h]);
  return in.dt_softplus && u <= 20.0 ? std::log1p(std::exp(u)) : u;
}

FdProblem make_problem(const FdCase& c) {
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto gauss = [&](int64_t n) {
    std::vector<double> v(n);
    for (double& e : v) e = normal(rng);
    return v;
  };
  const int64_t b = c.batch, L = c.seqlen, H = c.nheads, P = c.headdim, N = c.dstate, G = c.ngroups;
  FdProblem f;
  Inputs64& in = f.in;
  in.batch = b, in.seqlen = L, in.nheads = H, in.headdim = P, in.ngroups = G, in.dstate = N;
  for (int64_t h = 0; h < H; ++h) in.group.push_back(h / (H / G));
  in.x = gauss(b * L * H * P);
  in.B = gauss(b * L * G * N);
  in.C = gauss(b * L * G * N);
  for (int64_t h = 0; h < H; ++h) in.A.push_back(-uniform(0.3, 1.5));
  in.D_layout = c.D_layout;
  if (c.D_layout != DLayout::kNone)
    for (int64_t i = 0; i < (c.D_layout == DLayout::kPerHead ? H : H * P); ++i) in.D.push_back(uniform(0.5, 1.5));
  if (c.z) in.z = gauss(b * L * H * P);
  if (c.dt_bias)
    for (int64_t h = 0; h < H; ++h) in.dt_bias.push_back(uniform(-0.3, 0.3));
  in.dt_softplus = c.dt_softplus;
  in.dt_min = c.dt_min, in.dt_max = c.dt_max;
  if (c.initial_states) in.initial_states = gauss(b * H * P * N);
  in.seq = c.seq.empty() ? std::vector<int64_t>(b * L, 0) : c.seq;
  in.cu_seqlens = c.cu_seqlens;
  if (c.seq.empty())  // ids from cu_seqlens, as the API derives them without seq_idx
    for (int64_t s = 0; s + 1 < static_cast<int64_t>(c.cu_seqlens.size()); ++s)
      for (int64_t t = c.cu_seqlens[s]; t < c.cu_seqlens[s + 1]; ++t) in.seq[t] = s;

  // dt: steps around 0.02 .. 0.7, redrawn until d is clear of both clamp bounds.
  in.dt.resize(b * L * H);
  for (int64_t i = 0; i < b * L * H; ++i) {
    const int64_t h = i % H;
    double dt, d;
    do {
      dt = c.dt_softplus ? uniform(-4.0, 0.3) : uniform(0.02, 0.7);
      d = unclamped(in, dt, h);
    } while (std::abs(d - c.dt_min) < kEdgeMargin || std::abs(d - c.dt_max) < kEdgeMargin);
    in.dt[i] = dt;
  }
  for (int64_t k = 0; k < c.big_dt_tokens; ++k) in.dt.at((3 + 5 * k) % L * H + k % H) = 21.0 + k;  // softplus is identity

  f.dout = gauss(b * L * H * P);
  if (c.dfinal) f.dfinal = gauss(b * H * P * N);
  if (c.dvarlen) f.dvarlen = gauss(in.nseqs() * H * P * N);
  return f;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

double loss(const FdProblem& f, const Inputs64& in) {
  const reference::Outputs64 out = reference::forward64(in);
  return dot(f.dout, out.y) + dot(f.dfinal, out.final_states) + dot(f.dvarlen, out.varlen_states);
}

// Every differentiable input with its gradient.
struct Tensor {
  const char* name;
  std::vector<double> Inputs64::*input;
  std::vector<double> Grads64::*grad;
};
const Tensor kTensors[] = {
    {"x", &Inputs64::x, &Grads64::dx},
    {"dt", &Inputs64::dt, &Grads64::ddt},
    {"A", &Inputs64::A, &Grads64::dA},
    {"B", &Inputs64::B, &Grads64::dB},
    {"C", &Inputs64::C, &Grads64::dC},
    {"D", &Inputs64::D, &Grads64::dD},
    {"z", &Inputs64::z, &Grads64::dz},
    {"dt_bias", &Inputs64::dt_bias, &Grads64::ddt_bias},
    {"initial_states", &Inputs64::initial_states, &Grads64::dinitial_states},
};

// The derivative of the loss along element i of one input: the 4th-order central stencil
// (8 (f(+h) - f(-h)) - (f(+2h) - f(-2h))) / 12h, error O(h^4) + O(eps |f| / h).
double finite_difference(const FdProblem& f, std::vector<double> Inputs64::*input, std::size_t i) {
  Inputs64 in = f.in;
  const double v = (in.*input)[i];
  auto at = [&](double delta) {
    (in.*input)[i] = v + delta;
    return loss(f, in);
  };
  return (8.0 * (at(kStep) - at(-kStep)) - (at(2 * kStep) - at(-2 * kStep))) / (12.0 * kStep);
}

double rms(const std::vector<double>& v) {
  double s = 0.0;
  for (double e : v) s += e * e;
  return v.empty() ? 0.0 : std::sqrt(s / v.size());
}

// Every element where the analytic gradient and the finite difference disagree, as readable lines.
std::vector<std::string> mismatches(const FdProblem& f, const Grads64& g) {
  std::vector<std::string> bad;
  for (const Tensor& t : kTensors) {
    const std::vector<double>& input = f.in.*t.input;
    const std::vector<double>& grad = g.*t.grad;
    if (grad.size() != input.size()) {
      bad.push_back(std::string(t.name) + ": gradient has " + std::to_string(grad.size()) + " elements, input " +
                    std::to_string(input.size()));
      continue;
    }
    const double scale = rms(grad);
    for (std::size_t i = 0; i < input.size(); ++i) {
      const double fd = finite_difference(f, t.input, i);
      if (!(std::abs(fd - grad[i]) <= kRelTolerance * (std::abs(grad[i]) + scale)))
        bad.push_back(std::string(t.name) + "[" + std::to_string(i) + "]: gradient " + std::to_string(grad[i]) +
                      ", finite difference " + std::to_string(fd) + " (rms " + std::to_string(scale) + ")");
    }
  }
  return bad;
}

Grads64 backward(const FdProblem& f) { return reference::backward64(f.in, f.dout, f.dfinal, f.dvarlen); }

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> v;
  FdCase c;
  c.name = "Plain";
  v.push_back(c);

  c = {};
  c.name = "GateSkipBiasSoftplusStates";
  c.z = true, c.D_layout = DLayout::kPerHead, c.dt_bias = true, c.dt_softplus = true;
  c.initial_states = true, c.dfinal = true, c.big_dt_tokens = 2, c.seed = 2;
  v.push_back(c);
  for (int64_t groups : {1, 4}) {  // one group for all heads, one per head
    c.name = "GateSkipBiasSoftplusStatesGroups" + std::to_string(groups);
    c.ngroups = groups, c.seed += 10;
    v.push_back(c);
  }

  c = {};
  c.name = "ClampBothSidesSoftplusDPerDim";
  c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.dt_min = 0.15, c.dt_max = 0.5;
  c.z = true, c.dfinal = true, c.seed = 3;
  v.push_back(c);
  c.name = "ClampBothSidesNoSoftplus";
  c.dt_softplus = false, c.dt_min = 0.1, c.dt_max = 0.4, c.z = false, c.seed = 4;
  v.push_back(c);

  c = {};
  c.name = "SeqIdxResets";  // row 1 starts at id 1: the initial state reaches nothing there
  c.seq = {0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, /**/ 1, 1, 2, 2, 2, 2, 2, 5, 5, 5, 5};
  c.initial_states = true, c.dfinal = true, c.z = true, c.D_layout = DLayout::kPerHead, c.seed = 5;
  v.push_back(c);

  c = {};
  c.name = "PackedVarlen";  // empty sequences first, in the middle and a length-1 one
  c.batch = 1, c.cu_seqlens = {0, 0, 4, 5, 5, 11};
  c.dvarlen = true, c.dfinal = true, c.initial_states = true;
  c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.seed = 6;
  v.push_back(c);
  c.name = "PackedVarlenWithoutResets";  // seq_idx all 0: the varlen states are running states
  c.seq = std::vector<int64_t>(c.seqlen, 0), c.seed = 7;
  v.push_back(c);
  return v;
}

FdCase fd_case(const std::string& name) {
  for (const FdCase& c : fd_cases())
    if (c.name == name) return c;
  throw std::invalid_argument("no finite-difference case " + name);
}

class BackwardFiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(BackwardFiniteDifferences, EveryInputElement) {
  const FdProblem f = make_problem(GetParam());
  for (const std::string& line : mismatches(f, backward(f))) ADD_FAILURE() << GetParam().name << ": " << line;
}

INSTANTIATE_TEST_SUITE_P(Features, BackwardFiniteDifferences, ::testing::ValuesIn(fd_cases()),
                         [](const auto& info) { return info.param.name; });

// The cases cover what they claim: clamped tokens on both sides next to free ones, tokens past the
// softplus threshold, resets that cut the initial state off a batch row.
TEST(BackwardFiniteDifferencesCoverage, CasesReachEveryBranch) {
  for (const FdCase& c : fd_cases()) {
    const FdProblem f = make_problem(c);
    const Inputs64& in = f.in;
    int64_t low = 0, high = 0, free = 0, big = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(in.dt.size()); ++i) {
      const double d = unclamped(in, in.dt[i], i % in.nheads);
      low += d < in.dt_min, high += d > in.dt_max, free += d > in.dt_min && d < in.dt_max;
      big += in.dt_softplus && in.dt[i] + (in.dt_bias.empty() ? 0.0 : in.dt_bias[i % in.nheads]) > 20.0;
    }
    EXPECT_GT(free, in.dt.size() / 4) << c.name;
    if (c.dt_min > 0.0) EXPECT_GT(low, 0) << c.name;
    if (c.dt_max < kInf) EXPECT_GT(high, 0) << c.name;
    EXPECT_EQ(big, c.big_dt_tokens) << c.name;
  }
  const FdProblem resets = make_problem(fd_case("SeqIdxResets"));
  const Grads64 g = backward(resets);
  const int64_t row = resets.in.nheads * resets.in.headdim * resets.in.dstate;
  EXPECT_GT(rms({g.dinitial_states.begin(), g.dinitial_states.begin() + row}), 0.0);
  for (int64_t i = row; i < 2 * row; ++i) EXPECT_EQ(g.dinitial_states[i], 0.0);
}

// The comparison can fail: a gradient off by a part in 10^6 in one element, or a missing one, is seen.
TEST(BackwardFiniteDifferencesCoverage, WrongGradientsAreCaught) {
  FdCase c = fd_case("GateSkipBiasSoftplusStates");
  c.batch = 1, c.seqlen = 4;
  const FdProblem f = make_problem(c);
  Grads64 g = backward(f);
  ASSERT_TRUE(mismatches(f, g).empty());
  for (auto member : {&Grads64::dx, &Grads64::ddt, &Grads64::dA, &Grads64::dB, &Grads64::dD, &Grads64::dz,
                      &Grads64::ddt_bias, &Grads64::dinitial_states}) {
    Grads64 wrong = g;
    (wrong.*member)[1 % (wrong.*member).size()] *= 1.0 + 1e-6;
    EXPECT_EQ(mismatches(f, wrong).size(), 1u);
  }
  Grads64 missing = g;
  missing.dz.clear();
  EXPECT_EQ(mismatches(f, missing).size(), 1u);
}

// backward_reference as a backend: each gradient element is the oracle's fp64 value rounded to fp32
// and then to the gradient's dtype (bit for bit), every view written, nothing outside them.
class ReferenceBackward : public ::testing::TestWithParam<int> {};

BackwardProblem reference_case(int i) {
  ProblemConfig c;
  c.batch = 2, c.seqlen = 70, c.nheads = 4, c.ngroups = 2, c.headdim = 32, c.dstate = 16, c.chunk_size = 64;
  c.z = true, c.dt_bias = true, c.dt_softplus = true, c.initial_states = true, c.seed = 40 + i;
  switch (i) {
    case 0: c.dtype = DType::kF32, c.D_layout = DLayout::kPerHeadDim; return BackwardProblem(c);
    case 1:
      c.dtype = DType::kBF16, c.batch = 1, c.seqlens = {20, 0, 50}, c.seq_idx = true, c.strided = true;
      return BackwardProblem(c, GradLayout::kPadded);
    case 2: c.dtype = c.dt_dtype = DType::kF16, c.dt_min = 0.01f, c.dt_max = 0.05f; return BackwardProblem(c, GradLayout::kFused);
    default: c.dtype = DType::kBF16, c.dt_dtype = DType::kF16, c.D_layout = DLayout::kNone; return BackwardProblem(c);
  }
}

TEST_P(ReferenceBackward, GradientsAreTheOracleRoundedToTheirDtype) {
  BackwardProblem problem = reference_case(GetParam());
  expect_backward_matches_oracle(problem, [](const BackwardParams& p) { backward_reference(p); });
  const reference::Grads64 ref = backward_oracle(problem);
  for (const auto& [name, v] : problem.gradients) {
    const std::vector<double> got = read_gradient(problem, problem.buffers, name);
    const std::vector<double>& want = oracle_gradient(ref, name);
    ASSERT_EQ(got.size(), want.size()) << name;
    int64_t wrong = 0;
    for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != host::round_to(v.dtype, static_cast<float>(want[i]));
    EXPECT_EQ(wrong, 0) << problem.describe() << ": " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ReferenceBackward, ::testing::Values(0, 1, 2, 3));

// n standard normal draws from seed: the tests' cotangents.
std::vector<double> normal_draws(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> v(n);
  for (double& e : v) e = normal(rng);
  return v;
}

// The sums' terms, where they are the oracle's other outputs: ddt_bias sums ddt over the tokens, and
// without z, dD (per head and dim) sums dout x. And every sum within Cauchy-Schwarz of its terms.
TEST(OracleSumTerms, AreTheRootSumOfSquaresOfEachSumsTerms) {
  ProblemConfig c;
  c.batch = 2, c.seqlen = 70, c.nheads = 3, c.ngroups = 1, c.headdim = 32, c.dstate = 16, c.chunk_size = 64;
  c.dt_bias = true, c.dt_softplus = true, c.D_layout = DLayout::kPerHeadDim, c.dtype = DType::kF32, c.seed = 7;
  const BackwardProblem problem(c);
  const Inputs64 in = reference::load_inputs(problem.params().fwd);
  const std::vector<double> dout = normal_draws(in.x.size(), 3);
  const Grads64 g = reference::backward64(in, dout, {}, {});
  const int64_t H = c.nheads, P = c.headdim, tokens = c.batch * c.seqlen;
  ASSERT_EQ(g.ddt_bias_terms.size(), static_cast<std::size_t>(H));
  ASSERT_EQ(g.dD_terms.size(), static_cast<std::size_t>(H * P));
  ASSERT_EQ(g.dA_terms.size(), static_cast<std::size_t>(H));
  for (int64_t h = 0; h < H; ++h) {
    double ddt2 = 0.0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t t = 0; t < c.seqlen; ++t) {
        const int64_t i = in.token_head(b, t, h);
        ddt2 += std::max(std::pow(g.ddt[i], 2), std::pow(g.ddt_terms[i], 2));
      }
    EXPECT_NEAR(g.ddt_bias_terms[h], std::sqrt(ddt2), 1e-12 * std::sqrt(ddt2)) << h;
    for (int64_t p = 0; p < P; ++p) {
      double dD2 = 0.0;
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t t = 0; t < c.seqlen; ++t) {
          const int64_t i = in.x_row(b, t, h) + p;
          dD2 += std::pow(dout[i] * in.x[i], 2);
        }
      EXPECT_NEAR(g.dD_terms[h * P + p], std::sqrt(dD2), 1e-12 * std::sqrt(dD2)) << h << " " << p;
    }
    for (const auto* sum : {&g.dA, &g.ddt_bias}) {
      const std::vector<double>& terms = sum == &g.dA ? g.dA_terms : g.ddt_bias_terms;
      EXPECT_GT(terms[h], 0.0);
      EXPECT_LE(std::abs((*sum)[h]), std::sqrt(static_cast<double>(tokens)) * terms[h] * (1 + 1e-12));
    }
  }
}

// ddt's terms: at a batch row's first token (no state before it, so no decay term) and without D,
// x_p lamB_p = x_p dx_p / d over the head dim, times d'(dt) (softplus's); everywhere within
// Cauchy-Schwarz of ddt (P + 1 terms).
TEST(OracleSumTerms, DdtTermsAreItsHeadDimTerms) {
  ProblemConfig c;
  c.batch = 3, c.seqlen = 20, c.nheads = 2, c.ngroups = 1, c.headdim = 32, c.dstate = 16, c.chunk_size = 64;
  c.dt_bias = true, c.dt_softplus = true, c.D_layout = DLayout::kNone, c.dtype = DType::kF32, c.seed = 11;
  const BackwardProblem problem(c);
  const Inputs64 in = reference::load_inputs(problem.params().fwd);
  const Grads64 g = reference::backward64(in, normal_draws(in.x.size(), 5),
                                          normal_draws(c.batch * c.nheads * c.headdim * c.dstate, 6), {});
  ASSERT_EQ(g.ddt_terms.size(), g.ddt.size());
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.nheads; ++h) {
      const reference::Step step = reference::dt_step(in, b, 0, h);
      double squares = 0.0;
      for (int64_t p = 0; p < c.headdim; ++p) {
        const int64_t i = in.x_row(b, 0, h) + p;
        squares += std::pow(in.x[i] * g.dx[i] / step.d, 2);
      }
      const double want = step.dd_ddt * std::sqrt(squares), got = g.ddt_terms[in.token_head(b, 0, h)];
      EXPECT_GT(want, 0.0);
      EXPECT_NEAR(got, want, 1e-10 * want) << b << " " << h;
      for (int64_t t = 0; t < c.seqlen; ++t) {
        const int64_t i = in.token_head(b, t, h);
        EXPECT_LE(std::abs(g.ddt[i]), std::sqrt(c.headdim + 1.0) * g.ddt_terms[i] * (1 + 1e-12)) << b << " " << t;
      }
    }
}

// A sum's error counts against the larger of the sum and its terms' scale; elsewhere as before.
TEST(OracleSumTerms, ScaleTheComparisonOfASumThatCancels) {
  ComparisonBuilder cancelled("dA");
  cancelled.add(1e-3, 0.0, 1.0);  // terms of size 1 summing to 0, off by 1e-3
  EXPECT_NEAR(cancelled.done(2e-3).rel_l2, 1e-3, 1e-15);
  ComparisonBuilder plain("dA");
  plain.add(1.0 + 1e-3, 1.0, 0.5);  // a sum larger than its terms' scale: relative to the sum
  EXPECT_NEAR(plain.done(2e-3).rel_l2, 1e-3, 1e-12);
  ComparisonBuilder off("dA");
  off.add(0.5, 0.0, 1.0);  // half the terms' scale off: fails
  EXPECT_FALSE(off.done(4e-3).pass());
}

}  // namespace
}  // namespace mamba2ssd::testing
