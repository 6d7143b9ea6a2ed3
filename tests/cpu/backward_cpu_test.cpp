// The CPU backward against the oracle over a matrix of shapes, features, dtypes and gradient layouts
// (contiguous, padded, slices of one fused buffer), every gradient poisoned with NaN before the run;
// then determinism (reruns and thread counts give the same bits) and non-finite cotangents.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backward_cases.h"
#include "backward_helpers.h"
#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

class CpuBackwardVsOracle : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(CpuBackwardVsOracle, Matches) {
  BackwardProblem problem(GetParam().config, GetParam().layout);
  expect_backward_matches_oracle(problem, cpu_backward());
}

INSTANTIATE_TEST_SUITE_P(Listed, CpuBackwardVsOracle, ::testing::ValuesIn(listed_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Random, CpuBackwardVsOracle, ::testing::ValuesIn(random_cases(40)), case_name);

// seq_idx resets in batch rows of their own (no cu_seqlens): row 0 resets twice, row 1 starts at id
// 1, so initial_states reach none of its tokens and its dinitial_states is zero.
TEST(CpuBackward, SeqIdxResetsPerBatchRow) {
  ProblemConfig c = backward_base(2, 150, 4, 2, 32, 32, DType::kF32);
  c.initial_states = true, c.z = true, c.dt_bias = true;
  BackwardProblem problem(c, GradLayout::kPadded);
  std::vector<uint8_t> seq(c.batch * c.seqlen * sizeof(int32_t));
  int32_t* ids = reinterpret_cast<int32_t*>(seq.data());
  for (int64_t t = 0; t < c.seqlen; ++t) {
    ids[t] = t < 40 ? 0 : t < 100 ? 3 : 4;
    ids[c.seqlen + t] = t < 70 ? 1 : 2;
  }
  problem.forward.buffers["seq_idx"] = seq;  // laid out [b, L] as params() expects
  ASSERT_NE(problem.params().fwd.seq_idx, nullptr);
  expect_backward_matches_oracle(problem, cpu_backward());
  const GradView& v = problem.gradients.at("dinitial_states");
  const float* dinit = reinterpret_cast<const float*>(problem.buffers.at(v.buffer).data());
  double row0 = 0.0;
  for (int64_t h = 0; h < c.nheads; ++h)
    for (int64_t i = 0; i < c.headdim; ++i)
      for (int64_t n = 0; n < c.dstate; ++n) {
        row0 += std::abs(dinit[h * v.stride[1] + i * v.stride[2] + n]);
        EXPECT_EQ(dinit[v.stride[0] + h * v.stride[1] + i * v.stride[2] + n], 0.0f);
      }
  EXPECT_GT(row0, 0.0);
}

// seq_idx that does not reset where cu_seqlens ends a sequence (all zero): each varlen state is then
// the running state at its sequence's last token, as the forward takes it, and its cotangent joins
// a lam that carries on through the boundary.
TEST(CpuBackward, VarlenEndsWithoutResets) {
  ProblemConfig c = backward_base(1, 200, 4, 2, 32, 32, DType::kF32);
  c.seqlens = {70, 0, 60, 70}, c.seq_idx = true, c.initial_states = true;
  BackwardProblem problem(c);
  auto& seq = problem.forward.buffers.at("seq_idx");
  std::fill(seq.begin(), seq.end(), 0);
  expect_backward_matches_oracle(problem, cpu_backward());
}

// Decays far outside the usual range: a head that barely decays, one whose steps underflow exp to
// zero, A = 0 and A > 0 (growth), over several segments.
TEST(CpuBackward, ExtremeDecays) {
  ProblemConfig c = backward_base(1, 500, 4, 1, 32, 16, DType::kF32);
  c.initial_states = true;
  BackwardProblem problem(c);
  float* A = buffer<float>(problem.forward, "A");
  A[0] = -1e-4f, A[1] = -50.0f, A[2] = 0.0f, A[3] = 0.3f;
  float* dt = buffer<float>(problem.forward, "dt");
  for (int64_t t = 0; t < c.seqlen; t += 97) dt[t * c.nheads + 1] = 30.0f;  // exp(-1500) == 0
  expect_backward_matches_oracle(problem, cpu_backward());
}

// A long input at the default problem's head shape: many segments.
TEST(CpuBackward, LongSequence) {
  ProblemConfig c = backward_base(1, 2048, 2, 1, 64, 128, DType::kBF16);
  c.dt_dtype = DType::kBF16, c.dt_bias = true, c.dt_softplus = true, c.initial_states = true, c.z = true;
  BackwardProblem problem(c, GradLayout::kFused);
  expect_backward_matches_oracle(problem, cpu_backward());
}

// Gradients of one run, as raw bytes.
std::map<std::string, std::vector<uint8_t>> run_cpu(BackwardProblem& problem, int threads) {
  problem.poison_gradients();
  backward_cpu(problem.params(), threads);
  return gradient_buffers(problem);
}

BackwardProblem determinism_problem() {
  ProblemConfig c = backward_base(1, 257, 4, 2, 64, 32, DType::kBF16);
  c.seqlens = {100, 57, 100}, c.seq_idx = true, c.initial_states = true, c.z = true, c.dt_bias = true;
  c.D_layout = DLayout::kPerHeadDim;
  return BackwardProblem(c, GradLayout::kPadded);
}

TEST(CpuBackward, RepeatedCallsAreBitwiseIdentical) {
  BackwardProblem problem = determinism_problem();
  const auto first = run_cpu(problem, 2);
  EXPECT_EQ(run_cpu(problem, 2), first);
}

TEST(CpuBackward, ThreadCountDoesNotChangeResults) {
  BackwardProblem problem = determinism_problem();
  const auto one = run_cpu(problem, 1);
  EXPECT_EQ(run_cpu(problem, 2), one);
  EXPECT_EQ(run_cpu(problem, 3), one);
  EXPECT_EQ(run_cpu(problem, 0), one);    // every hardware thread
  EXPECT_EQ(run_cpu(problem, 100), one);  // more threads than work items
}

}  // namespace
}  // namespace mamba2ssd::testing
