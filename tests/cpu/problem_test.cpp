// Sizes that do not fit: contiguous_strides() refuses products past 2^63. Run under UBSan
// (scripts/sanitize_test.sh), a product that wrapped would be a finding.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ContiguousStrides, ProductsPast2To63AreRefused) {
  const int64_t H = int64_t{1} << 49;
  expect_error([&] { contiguous_strides(1, H, 128, 256); }, "contiguous_strides");
  expect_error([&] { contiguous_strides(1, H * 128, 256); }, "contiguous_strides");
  const Strides4 s = contiguous_strides(1, H, 32, 256);  // 2^62: fits
  EXPECT_EQ(s.s0, int64_t{1} << 62);
  EXPECT_EQ(s.s1, 32 * 256);
}

}  // namespace
}  // namespace mamba2ssd::testing
