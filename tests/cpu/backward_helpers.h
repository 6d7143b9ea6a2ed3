// Helpers shared by the backward tests: run a backward backend on a BackwardProblem and check it.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "testing/backward_problem.h"

namespace mamba2ssd::testing {

using BackwardBackend = std::function<void(const BackwardParams&)>;

inline BackwardBackend cpu_backward(int threads = 0) {
  return [threads](const BackwardParams& p) { backward_cpu(p, threads); };
}

// The gradient buffers of a problem, as raw bytes (what a run produced).
inline std::map<std::string, std::vector<uint8_t>> gradient_buffers(const BackwardProblem& problem) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& [name, v] : problem.gradients) out[v.buffer] = problem.buffers.at(v.buffer);
  return out;
}

// Runs the backend with every gradient buffer poisoned with NaN, then checks each gradient against
// the oracle with the project's tolerance, and that nothing was written outside the gradients' views.
inline void expect_backward_matches_oracle(BackwardProblem& problem, const BackwardBackend& run) {
  problem.poison_gradients();
  run(problem.params());
  const std::vector<Comparison> cmps = compare_gradients(problem, problem.buffers, backward_oracle(problem));
  EXPECT_EQ(cmps.size(), problem.gradients.size());
  for (const Comparison& c : cmps)
    EXPECT_TRUE(c.pass()) << problem.describe() << ": " << c.name << " rel_l2 " << c.rel_l2 << " (tolerance "
                          << c.tolerance << "), max_abs " << c.max_abs << ", " << c.nonfinite << " of " << c.count
                          << " not finite";
  EXPECT_EQ(written_outside_gradients(problem, problem.buffers), 0) << problem.describe();
}

}  // namespace mamba2ssd::testing
