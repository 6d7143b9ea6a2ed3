// The consistency rules on the host (src/testing/consistency.h; docs/serving.md, "Consistency"):
// prefill of L tokens, prefill in two pieces from the cached state, and prefill of L - k then k
// decode steps, with forward_cpu and decode_cpu. By default the three agree with each other and
// the oracle within the tolerance table; in the exact mode (every prefill is decode_cpu over the
// piece's tokens) they agree bit for bit in y and in the state, and stay within the decode step's
// bar of the oracle; in the packed mode (every prefill is prefill_cpu, the serving call, from and to
// the cache slots) within the tolerance table. Outputs are poisoned with NaN before each way.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "helpers.h"
#include "testing/consistency.h"

namespace mamba2ssd::testing {
namespace {

class Consistency : public ::testing::TestWithParam<ConsistencyConfig> {};

TEST_P(Consistency, CpuWaysAgree) {
  const ConsistencyConfig& c = GetParam();
  HostProblem problem(c.problem);
  expect_all_pass(compare_ways(c, problem, run_ways_host(c, problem, Backend::kCpu)), c.describe());
}

INSTANTIATE_TEST_SUITE_P(Matrix, Consistency, ::testing::ValuesIn(consistency_matrix(1)),
                         [](const ::testing::TestParamInfo<ConsistencyConfig>& info) {
                           return std::to_string(info.index) + (info.param.exact ? "_exact" : info.param.packed ? "_packed" : "_default");
                         });

// The bit comparison is not vacuous: one flipped bit of one way's y, or its state, fails it.
TEST(ConsistencyRules, BitsCatchOneFlippedBit) {
  ConsistencyConfig c = consistency_matrix(1).front();
  c.exact = true;
  HostProblem problem(c.problem);
  const std::vector<WayResult> ways = run_ways_host(c, problem, Backend::kCpu);
  expect_all_pass(compare_ways(c, problem, ways), c.describe());
  for (bool state : {false, true}) {
    std::vector<WayResult> spoiled = ways;
    std::vector<uint8_t>& buf = state ? spoiled[1].state : spoiled[1].y;
    buf[buf.size() / 2] ^= 1;  // the lowest bit of one element
    int failed = 0;
    for (const Comparison& cmp : compare_ways(c, problem, spoiled)) failed += cmp.pass() ? 0 : 1;
    EXPECT_EQ(failed, 1) << (state ? "state" : "y");
  }
}

// Poison left behind never passes: a way whose decode steps wrote nothing fails, whatever mode.
TEST(ConsistencyRules, PoisonFails) {
  for (int mode = 0; mode < 3; ++mode) {
    ConsistencyConfig c = consistency_matrix(1).front();
    c.exact = mode == 1, c.packed = mode == 2;
    HostProblem problem(c.problem);
    std::vector<WayResult> ways = run_ways_host(c, problem, Backend::kCpu);
    std::memset(ways[2].y.data() + ways[2].y.size() - 2, 0xff, 2);  // the last token's last element: NaN
    int failed = 0;
    for (const Comparison& cmp : compare_ways(c, problem, ways)) failed += cmp.pass() ? 0 : 1;
    EXPECT_GE(failed, 1) << c.describe();
  }
}

// The packed mode runs the packed prefill: a piece's request that starts from zero instead of its
// slot (a lost cached state) fails the ways' agreement and the oracle.
TEST(ConsistencyRules, PackedModeReadsTheSlots) {
  ConsistencyConfig c = consistency_matrix(1).front();
  c.packed = true;
  HostProblem problem(c.problem);
  ASSERT_TRUE(c.problem.initial_states);
  expect_all_pass(compare_ways(c, problem, run_ways_host(c, problem, Backend::kCpu)), c.describe());
  const std::vector<uint8_t> none(1, 0);  // has_initial_state 0: the request starts from zero
  Executor e = host_executor(Backend::kCpu);
  e.prefill = [&](PrefillParams p, const std::vector<int64_t>& cu, const std::vector<int32_t>& slots) {
    p.fwd.cu_seqlens = cu.data(), p.slots = slots.data(), p.has_initial_state = none.data();
    prefill_cpu(p);
  };
  std::vector<float> mid(problem.buffers.at("final_states").size() / sizeof(float));
  int failed = 0;
  for (const Comparison& cmp : compare_ways(c, problem, run_ways(c, problem, problem.params(), mid.data(), e)))
    failed += cmp.pass() ? 0 : 1;
  EXPECT_GE(failed, 2) << c.describe();  // (against the oracle, and the pieces against the whole)
}

// The exact mode at prefill lengths: decode_cpu takes thousands of tokens per call (no cap), and
// splits anywhere give the same bits.
TEST(ConsistencyRules, ExactLongPrefill) {
  ConsistencyConfig c;
  ProblemConfig& p = c.problem;
  p.batch = 1, p.seqlen = 4099, p.nheads = 2, p.headdim = 32, p.dstate = 16, p.chunk_size = 128;
  p.dtype = DType::kF32, p.initial_states = true, p.dt_bias = true, p.dt_softplus = true, p.z = true, p.seed = 77;
  c.exact = true;
  HostProblem problem(p);
  for (auto [split, k] : {std::pair<int64_t, int64_t>{1, 1}, {2048, 3}, {4098, 130}}) {
    c.split = split, c.decode_tokens = k;
    expect_all_pass(compare_ways(c, problem, run_ways_host(c, problem, Backend::kCpu)), c.describe());
  }
}

}  // namespace
}  // namespace mamba2ssd::testing
