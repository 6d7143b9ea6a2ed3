// fp32_math accurate (3xTF32 products, tile::Mma3xTf32) on every CUDA path that takes fp32, against
// the fp64 oracle with the accurate bar (testing::accurate_fp32_rel_l2_tolerance), outputs poisoned
// (NaN) before each run; and the proof that the mode does something: on the same inputs the TF32
// products land farther from the oracle, outside that bar.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "testing/device_problem.h"
#include "testing/tolerance.h"
#include "test_matrix.h"

namespace mamba2ssd::testing {
namespace {

// The paths that take fp32 (hopper refuses it); auto runs whichever of them it picks.
constexpr CudaPath kFp32Paths[] = {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kAuto};

// One run on a fresh problem, outputs poisoned first: the comparisons with the oracle.
std::vector<Comparison> run_once(const ProblemConfig& config) {
  HostProblem host(config);
  DeviceProblem dev(host);
  dev.poison_outputs();
  dev.launch();
  return compare_with_oracle(host, dev.download_outputs());
}

// The GPU matrix (every feature and size class) in fp32 with fp32_math accurate.
std::vector<ProblemConfig> accurate_matrix() {
  std::vector<ProblemConfig> v = gpu_test_matrix(700, true);
  for (ProblemConfig& c : v) c.dtype = DType::kF32, c.fp32_math = Fp32Math::kAccurate;
  return v;
}

class Fp32Accurate : public ::testing::TestWithParam<ProblemConfig> {};

// Every path that covers the config, the fused one also with 1 and 2 segments (as forward_cuda_test).
TEST_P(Fp32Accurate, MatchesOracleWithinTheAccurateBar) {
  ProblemConfig config = GetParam();
  ASSERT_EQ(rel_l2_tolerance(config.dtype, config.fp32_math), accurate_fp32_rel_l2_tolerance());
  for (CudaPath path : kFp32Paths) {
    if (!path_applies(config, path)) continue;
    config.cuda_path = path;
    expect_pass(run_once(config), config.describe());
    if (path == CudaPath::kFused)
      for (int64_t segs : {1, 2}) {
        ForcedSegments forced(segs);
        expect_pass(run_once(config), config.describe() + " segments " + std::to_string(segs));
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, Fp32Accurate, ::testing::ValuesIn(accurate_matrix()), case_name);

TEST(Fp32AccurateRuns, PrintsMatrixNames) { print_matrix(accurate_matrix()); }

// The same inputs with TF32 and with 3xTF32 products, on each fp32 path: 3xTF32 is nearer the
// oracle on every output, and TF32 is outside the accurate bar (so a kernel left on TF32 products
// fails the matrix above).
TEST(Fp32AccurateRuns, IsNearerTheOracleThanTf32) {
  ProblemConfig c = matrix_base();
  c.dtype = DType::kF32, c.dstate = 128, c.initial_states = true, c.z = true, c.seed = 11;
  for (CudaPath path : {CudaPath::kThreeKernel, CudaPath::kFused}) {
    c.cuda_path = path;
    ASSERT_TRUE(path_applies(c, path)) << to_string(path);
    c.fp32_math = Fp32Math::kTf32;
    const std::vector<Comparison> tf32 = run_once(c);
    c.fp32_math = Fp32Math::kAccurate;
    const std::vector<Comparison> accurate = run_once(c);
    ASSERT_EQ(tf32.size(), accurate.size());
    for (std::size_t i = 0; i < tf32.size(); ++i) {
      std::printf("  %-13s %-14s TF32 %.2e  3xTF32 %.2e\n", to_string(path), tf32[i].name.c_str(), tf32[i].rel_l2,
                  accurate[i].rel_l2);
      EXPECT_EQ(tf32[i].nonfinite, 0) << tf32[i].name;
      EXPECT_EQ(accurate[i].nonfinite, 0) << accurate[i].name;
      EXPECT_LT(4.0 * accurate[i].rel_l2, tf32[i].rel_l2) << to_string(path) << " " << tf32[i].name;
      EXPECT_GT(tf32[i].rel_l2, accurate_fp32_rel_l2_tolerance()) << to_string(path) << " " << tf32[i].name;
    }
  }
}

// explain_cuda names the products; the tile path, which casts fp32 to TF32, refuses the accurate
// mode saying so; 16-bit calls ignore it.
TEST(Fp32AccurateRuns, ExplainNamesTheProducts) {
  ProblemConfig c = matrix_base();
  c.dtype = DType::kF32;
  EXPECT_EQ(explain_cuda(HostProblem(c).params()).products, "TF32");
  c.fp32_math = Fp32Math::kAccurate;
  const CudaExplanation x = explain_cuda(HostProblem(c).params());
  EXPECT_EQ(x.products, "3xTF32");
  EXPECT_NE(x.to_string().find("3xTF32 products"), std::string::npos) << x.to_string();
  for (const CudaPathVerdict& v : x.paths)
    if (v.path == CudaPath::kTile && build_info().cuda_tile)
      EXPECT_NE(v.refusal.find("fp32_math accurate"), std::string::npos) << v.refusal;
  c.dtype = DType::kBF16;
  EXPECT_EQ(explain_cuda(HostProblem(c).params()).products, "bf16");
}

}  // namespace
}  // namespace mamba2ssd::testing
