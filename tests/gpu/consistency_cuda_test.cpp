// The consistency rules on the GPU (src/testing/consistency.h; docs/serving.md, "Consistency"):
// prefill of L tokens, in two pieces from the cached state, and of L - k then k decode steps, with
// forward_cuda and decode_cuda. By default within the tolerance table of each other and of the
// oracle; in the exact mode (every prefill is decode_cuda over the piece's tokens) bit for bit, y
// and state, and within the decode step's bar of the oracle; in the packed mode (every prefill is
// prefill_cuda, the serving call, from and to the cache slots) within the tolerance table. Outputs
// poisoned with NaN first.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "test_matrix.h"
#include "testing/consistency.h"
#include "testing/device_consistency.h"

namespace mamba2ssd::testing {
namespace {

class ConsistencyCuda : public ::testing::TestWithParam<ConsistencyConfig> {};

TEST_P(ConsistencyCuda, WaysAgree) {
  const ConsistencyConfig& c = GetParam();
  HostProblem problem(c.problem);
  expect_pass(compare_ways(c, problem, run_ways_cuda(c, problem)), "consistency " + c.describe());
}

INSTANTIATE_TEST_SUITE_P(Matrix, ConsistencyCuda, ::testing::ValuesIn(consistency_matrix(1)),
                         [](const ::testing::TestParamInfo<ConsistencyConfig>& info) {
                           return "case" + std::to_string(info.index) +
                                  (info.param.exact ? "_exact" : info.param.packed ? "_packed" : "_default");
                         });

// The exact mode at prefill lengths: decode_cuda over thousands of tokens per request in one call
// (the grid does not depend on T; the state stays in registers), serving-like heads, every cache
// row layout the kernel has for fp32 (N 16: 4 lanes a row, N 128: 32 lanes, N 256: two chunks a
// lane), and splits anywhere.
TEST(ConsistencyCudaRuns, ExactLongPrefill) {
  uint64_t seed = 300;
  for (int64_t N : {16, 128, 256}) {
    ConsistencyConfig c;
    ProblemConfig& p = c.problem;
    p.batch = 2, p.seqlen = 4099, p.nheads = 8, p.ngroups = 2, p.headdim = 64, p.dstate = N, p.chunk_size = 128;
    p.dtype = DType::kBF16, p.initial_states = true, p.dt_bias = true, p.dt_softplus = true;
    p.D_layout = DLayout::kPerHead, p.seed = seed++;
    c.exact = true;
    HostProblem problem(p);
    for (auto [split, k] : {std::pair<int64_t, int64_t>{1, 1}, {2048, 3}, {4098, 130}}) {
      c.split = split, c.decode_tokens = k;
      expect_pass(compare_ways(c, problem, run_ways_cuda(c, problem)), "consistency " + c.describe());
    }
  }
}

// The default mode on the same long prompt: chunked forward pieces and decode steps within the
// tolerance table (the split inside a chunk of the kernels' 64 and 128).
TEST(ConsistencyCudaRuns, DefaultLongPrefill) {
  ConsistencyConfig c;
  ProblemConfig& p = c.problem;
  p.batch = 2, p.seqlen = 4099, p.nheads = 8, p.ngroups = 2, p.headdim = 64, p.dstate = 128, p.chunk_size = 128;
  p.dtype = DType::kBF16, p.initial_states = true, p.dt_bias = true, p.dt_softplus = true, p.seed = 310;
  c.split = 2077, c.decode_tokens = 70;
  HostProblem problem(p);
  expect_pass(compare_ways(c, problem, run_ways_cuda(c, problem)), "consistency " + c.describe());
}

}  // namespace
}  // namespace mamba2ssd::testing
