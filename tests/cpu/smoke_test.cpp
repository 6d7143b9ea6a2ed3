#include <gtest/gtest.h>

#include "testing/problem.h"

namespace mamba2ssd::testing {
TEST(Smoke, ReferenceBackendMatchesOracle) {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 70, c.nheads = 2, c.dstate = 16, c.chunk_size = 64;
  HostProblem prob(c);
  forward(prob.params(), Backend::kReference);
  for (const Comparison& cmp : compare_with_oracle(prob, prob.buffers)) EXPECT_TRUE(cmp.pass()) << cmp.name;
}
}  // namespace mamba2ssd::testing
