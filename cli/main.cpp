#include <cstdio>
#include "testing/problem.h"
int main() {
  mamba2ssd::testing::ProblemConfig c;
  c.batch = 1; c.seqlen = 100; c.nheads = 2; c.dstate = 16;
  mamba2ssd::testing::HostProblem prob(c);
  auto p = prob.params();
  mamba2ssd::forward(p, mamba2ssd::Backend::kCpu);
  for (auto& cmp : mamba2ssd::testing::compare_with_oracle(prob, prob.buffers))
    std::printf("%s rel %g nonfinite %ld\n", cmp.name.c_str(), cmp.rel_l2, (long)cmp.nonfinite);
}
