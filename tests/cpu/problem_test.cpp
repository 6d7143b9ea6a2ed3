// Sizes that do not fit: a test problem (src/testing/problem.cpp) computes every stride, extent and
// buffer length with overflow checks before it allocates anything, and refuses a problem whose sizes
// validate_sizes() refuses; contiguous_strides() refuses products past 2^63. Run under UBSan
// (scripts/sanitize_test.sh), a product that wrapped would be a finding.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

constexpr int64_t k2to40 = int64_t{1} << 40;

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// The CLI's two crashes of the reliability issue: sizes whose byte counts wrapped to 0.
TEST(ProblemSizes, HugeBatchAndSeqlenAreRefusedBeforeAllocating) {
  ProblemConfig c;
  c.batch = k2to40, c.seqlen = k2to40;
  expect_error([&] { HostProblem problem(c); }, "batch * seqlen * nheads * headdim");
  c.dtype = DType::kF32, c.seqlen = 8192;
  expect_error([&] { HostProblem problem(c); }, "batch * seqlen * nheads * headdim");
}

TEST(ContiguousStrides, ProductsPast2To63AreRefused) {
  const int64_t H = int64_t{1} << 49;
  expect_error([&] { contiguous_strides(1, H, 128, 256); }, "contiguous_strides");
  expect_error([&] { contiguous_strides(1, H * 128, 256); }, "contiguous_strides");
  const Strides4 s = contiguous_strides(1, H, 32, 256);  // 2^62: fits
  EXPECT_EQ(s.s0, int64_t{1} << 62);
  EXPECT_EQ(s.s1, 32 * 256);
}

// A problem whose sizes validate_sizes refuses is refused by the problem with the same message.
TEST(ProblemSizes, HugeStatesAreRefused) {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 1, c.nheads = int64_t{1} << 49, c.headdim = 128, c.dstate = 256, c.ngroups = 1;
  expect_error([&] { HostProblem problem(c); }, "batch * nheads * headdim * dstate");
}

}  // namespace
}  // namespace mamba2ssd::testing
