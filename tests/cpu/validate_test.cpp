// Invalid input: every rule of validate() and of the host checks of cu_seqlens makes the host
// backends throw mamba2ssd::Error whose message names the parameter and the bad value, before any
// output is written.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

// A valid call with every optional tensor: packed sequences {3, 5}, so cu_seqlens and varlen states.
ProblemConfig valid_config() {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 8, c.nheads = 2, c.headdim = 32, c.dstate = 16, c.chunk_size = 64;
  c.dtype = DType::kF32;
  c.z = true, c.dt_bias = true, c.initial_states = true;
  c.seqlens = {3, 5}, c.seq_idx = true;
  return c;
}

struct BadCase {
  std::string name;
  std::function<void(ForwardParams&)> edit;
  std::vector<std::string> message;  // substrings the message must contain
};

// A place for saved_states (the valid config's [1, 1, 2, 32, 16] fp32 elements), 16-byte aligned.
alignas(16) float saved_buffer[1024 + 4];

// Host cu_seqlens contents for the cases below ([S + 1] with S = 2, seqlen 8).
int64_t cu_first_not_zero[] = {1, 3, 8};
int64_t cu_decreasing[] = {0, 5, 3};
int64_t cu_wrong_end[] = {0, 3, 7};

std::vector<BadCase> bad_cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return {
      {"BatchZero", [](auto& p) { p.batch = 0; }, {"batch must be >= 1, got 0"}},
      {"SeqlenNegative", [](auto& p) { p.seqlen = -5; }, {"seqlen must be >= 1, got -5"}},
      {"NheadsZero", [](auto& p) { p.nheads = 0; }, {"nheads must be >= 1, got 0"}},
      {"Headdim40", [](auto& p) { p.headdim = 40; }, {"headdim must be a multiple of 16 in [16, 128], got 40"}},
      {"Headdim8", [](auto& p) { p.headdim = 8; }, {"headdim must be a multiple of 16 in [16, 128], got 8"}},
      {"Headdim144", [](auto& p) { p.headdim = 144; }, {"headdim must be a multiple of 16 in [16, 128], got 144"}},
      {"Dstate8", [](auto& p) { p.dstate = 8; }, {"dstate must be a multiple of 16 in [16, 256], got 8"}},
      {"Dstate24", [](auto& p) { p.dstate = 24; }, {"dstate must be a multiple of 16 in [16, 256], got 24"}},
      {"Dstate272", [](auto& p) { p.dstate = 272; }, {"dstate must be a multiple of 16 in [16, 256], got 272"}},
      {"NgroupsZero", [](auto& p) { p.ngroups = 0; }, {"ngroups must be >= 1, got 0"}},
      {"NgroupsNotDividing", [](auto& p) { p.nheads = 4, p.ngroups = 3; },
       {"ngroups must divide nheads, got ngroups 3 for nheads 4"}},
      {"ChunkSizeZero", [](auto& p) { p.chunk_size = 0; }, {"chunk_size must be >= 1, got 0"}},
      {"SizesTooLarge", [](auto& p) { p.seqlen = 1000000000000, p.nheads = 1000, p.headdim = 128; },
       {"batch * seqlen * nheads * headdim = 1 * 1000000000000 * 1000 * 128 is more than 2^56"}},
      {"UnknownDtype", [](auto& p) { p.dtype = static_cast<DType>(7); }, {"dtype: unknown dtype 7"}},
      {"UnknownDtDtype", [](auto& p) { p.dt_dtype = static_cast<DType>(-1); }, {"dt_dtype: unknown dtype -1"}},
      {"XNull", [](auto& p) { p.x = nullptr; }, {"x is null"}},
      {"DtNull", [](auto& p) { p.dt = nullptr; }, {"dt is null"}},
      {"ANull", [](auto& p) { p.A = nullptr; }, {"A is null"}},
      {"BNull", [](auto& p) { p.B = nullptr; }, {"B is null"}},
      {"CNull", [](auto& p) { p.C = nullptr; }, {"C is null"}},
      {"YNull", [](auto& p) { p.y = nullptr; }, {"y (the output) is null"}},
      {"UnknownDLayout", [](auto& p) { p.D_layout = static_cast<DLayout>(5); }, {"D_layout: unknown value 5"}},
      {"UnknownCudaPath", [](auto& p) { p.cuda_path = static_cast<CudaPath>(5); }, {"cuda_path: unknown value 5"}},
      {"UnknownFp32Math", [](auto& p) { p.fp32_math = static_cast<Fp32Math>(2); }, {"fp32_math: unknown value 2"}},
      {"NegativeFp32Math", [](auto& p) { p.fp32_math = static_cast<Fp32Math>(-1); }, {"fp32_math: unknown value -1"}},
      {"DWithoutLayout", [](auto& p) { p.D_layout = DLayout::kNone; }, {"D is given but D_layout is none"}},
      {"LayoutWithoutD", [](auto& p) { p.D = nullptr; }, {"D_layout is per-head or per-head-dim but D is null"}},
      {"DtLimitNaN", [nan](auto& p) { p.dt_max = nan; }, {"dt_limit must not be NaN, got (0, nan)"}},
      {"DtLimitNegativeLow", [](auto& p) { p.dt_min = -0.5f; }, {"dt_limit lower bound must be >= 0, got -0.5"}},
      // A lower bound of +inf clamps every step to inf: every output NaN. The upper bound may be inf.
      {"DtLimitInfLow", [inf](auto& p) { p.dt_min = inf, p.dt_max = inf; },
       {"dt_limit lower bound must be finite, got inf"}},
      {"DtLimitNaNLow", [nan](auto& p) { p.dt_min = nan; }, {"dt_limit must not be NaN, got (nan, inf)"}},
      // Extents past 2^63 are refused before they are formed (run under UBSan, scripts/sanitize_test.sh:
      // a product that wrapped would be a finding). Inputs and outputs, elements and bytes.
      {"XStrideOverflows", [](auto& p) { p.x_stride.s1 = kMax / 4; }, {"x: strides", "reach past 2^63 elements"}},
      {"YStrideOverflows", [](auto& p) { p.y_stride.s2 = kMax / 2 + 1; }, {"y: strides", "reach past 2^63"}},
      {"YStrideBytesOverflow", [](auto& p) { p.y_stride.s1 = int64_t{1} << 60; }, {"y: strides", "reach past 2^63 bytes"}},
      {"FinalStatesStrideOverflows", [](auto& p) { p.final_states_stride.s1 = kMax - 1; },
       {"final_states: strides", "reach past 2^63"}},
      {"VarlenStrideOverflows", [](auto& p) { p.varlen_states_stride.s0 = kMax; },
       {"varlen_states: strides", "reach past 2^63"}},
      // Sizes whose products pass 2^56 elements, whatever the strides (the states' [b, H, P, N] too:
      // the oracle forms that product even without final_states).
      {"HugeNheadsWithStates", [](auto& p) { p.seqlen = 1, p.nheads = int64_t{1} << 49, p.ngroups = 1, p.headdim = 128, p.dstate = 256; },
       {"batch * nheads * headdim * dstate = 1 * 562949953421312 * 128 * 256", "2^56"}},
      {"HugeBatchTimesSeqlen", [](auto& p) { p.batch = int64_t{1} << 40, p.seqlen = int64_t{1} << 40; },
       {"batch * seqlen * nheads * headdim = 1099511627776 * 1099511627776 * 2 * 32", "2^56"}},
      {"DtLimitInverted", [](auto& p) { p.dt_min = 0.5f, p.dt_max = 0.25f; },
       {"dt_limit must satisfy lo <= hi, got (0.5, 0.25)"}},
      {"CuSeqlensWithBatch2", [](auto& p) { p.batch = 2; },
       {"cu_seqlens needs batch == 1 (packed sequences), got batch 2"}},
      {"NseqsZero", [](auto& p) { p.nseqs = 0; }, {"nseqs must be >= 1 with cu_seqlens, got 0"}},
      {"NseqsWithoutCuSeqlens", [](auto& p) { p.cu_seqlens = nullptr, p.varlen_states = nullptr; },
       {"nseqs is 2 but cu_seqlens is null"}},
      {"VarlenWithoutCuSeqlens", [](auto& p) { p.cu_seqlens = nullptr, p.nseqs = 0; },
       {"varlen_states needs cu_seqlens"}},
      {"NegativeStrideX", [](auto& p) { p.x_stride.s1 = -64; }, {"x: negative stride", "-64"}},
      {"NegativeStrideDt", [](auto& p) { p.dt_stride.s0 = -1; }, {"dt: negative stride", "-1"}},
      {"NegativeStrideFinal", [](auto& p) { p.final_states_stride.s2 = -16; },
       {"final_states: negative stride", "-16"}},
      {"NonContiguousB", [](auto& p) { p.B_stride.s3 = 2; },
       {"B: last dimension must be contiguous (stride 1), got strides [128, 16, 16, 2]"}},
      {"NonContiguousC", [](auto& p) { p.C_stride.s3 = 0; }, {"C: last dimension must be contiguous", ", 0]"}},
      {"NonContiguousZ", [](auto& p) { p.z_stride.s3 = 3; }, {"z: last dimension must be contiguous", ", 3]"}},
      {"NonContiguousInitialStates", [](auto& p) { p.initial_states_stride.s3 = 2; },
       {"initial_states: last dimension must be contiguous", ", 2]"}},
      {"NonContiguousSeqIdx", [](auto& p) { p.seq_idx_stride.s1 = 2; },
       {"seq_idx: last dimension must be contiguous", "[8, 2]"}},
      {"NonContiguousY", [](auto& p) { p.y_stride.s3 = 2; }, {"y: last dimension must be contiguous", ", 2]"}},
      {"NonContiguousVarlen", [](auto& p) { p.varlen_states_stride.s3 = 4; },
       {"varlen_states: last dimension must be contiguous", ", 4]"}},
      {"YAliasesItself", [](auto& p) { p.y_stride.s1 = 0; },
       {"y: strides [512, 0, 32, 1] for sizes [1, 8, 2, 32] make elements alias"}},
      {"FinalStatesAliasesItself", [](auto& p) { p.final_states_stride.s1 = 256; },
       {"final_states: strides [1024, 256, 16, 1] for sizes [1, 2, 32, 16] make elements alias"}},
      {"YOverlapsX", [](auto& p) { p.y = const_cast<void*>(p.x); }, {"output y overlaps input x"}},
      {"FinalOverlapsInitial", [](auto& p) { p.final_states = const_cast<float*>(p.initial_states); },
       {"output final_states overlaps input initial_states"}},
      {"VarlenOverlapsFinal", [](auto& p) { p.varlen_states = p.final_states; },
       {"output final_states overlaps output varlen_states"}},
      {"CuSeqlensFirstNotZero", [](auto& p) { p.cu_seqlens = cu_first_not_zero; },
       {"cu_seqlens [0] must be 0, got 1"}},
      {"CuSeqlensDecreasing", [](auto& p) { p.cu_seqlens = cu_decreasing; },
       {"cu_seqlens must be non-decreasing, got [1] = 5 > [2] = 3"}},
      {"CuSeqlensWrongEnd", [](auto& p) { p.cu_seqlens = cu_wrong_end; },
       {"cu_seqlens [2] must equal seqlen 8, got 7"}},
      // The states for the backward: saved by the CUDA forward only, 16-byte aligned, an output.
      {"SavedStatesOnHostBackends", [](auto& p) { p.saved_states = saved_buffer; },
       {"saved_states: backend", "(backend cuda does); leave it null"}},
      {"SavedStatesMisaligned", [](auto& p) { p.saved_states = saved_buffer + 1; },
       {"saved_states: address", "is not 16-byte aligned"}},
      // (initial_states: of the saved states' size here, so that they reach no third buffer)
      {"SavedStatesOverlapsInitialStates", [](auto& p) { p.saved_states = const_cast<float*>(p.initial_states); },
       {"output saved_states overlaps input initial_states"}},
  };
}

class InvalidInput : public ::testing::TestWithParam<BadCase> {};

// Both host backends refuse the call with the message, and leave the (poisoned) outputs untouched.
TEST_P(InvalidInput, ThrowsErrorNamingParameterAndValue) {
  const BadCase& bad = GetParam();
  HostProblem problem(valid_config());
  ASSERT_NO_THROW(validate(problem.params())) << "the base case must be valid";
  const auto before = problem.buffers;
  using Backend = std::function<void(const ForwardParams&)>;
  const std::pair<const char*, Backend> backends[] = {
      {"cpu", [](const ForwardParams& p) { forward_cpu(p); }},
      {"reference", [](const ForwardParams& p) { forward_reference(p); }}};
  for (const auto& [backend, run] : backends) {
    ForwardParams p = problem.params();
    bad.edit(p);
    try {
      run(p);
      ADD_FAILURE() << backend << ": no exception for " << bad.name;
    } catch (const Error& e) {
      const std::string what = e.what();
      for (const std::string& part : bad.message)
        EXPECT_NE(what.find(part), std::string::npos) << backend << ": message \"" << what << "\" lacks \"" << part << "\"";
    } catch (const std::exception& e) {
      ADD_FAILURE() << backend << ": wrong exception type: " << e.what();
    }
    EXPECT_TRUE(problem.buffers == before) << backend << ": buffers changed by a refused call";
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, InvalidInput, ::testing::ValuesIn(bad_cases()),
                         [](const auto& info) { return info.param.name; });

// dt_limit as a caller holds it, in double, before narrowing it to the float fields: judged as
// given. Narrowed first, -1e-50 became -0 (passing >= 0) and a lower bound of 1e39 became inf.
TEST(ValidateDtLimit, JudgesTheBoundsAsGiven) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::pair<std::pair<double, double>, std::string> refused[] = {
      {{-1e-50, 1.0}, "dt_limit lower bound must be >= 0, got -1e-50"},
      {{0.0, -1e-50}, "dt_limit must satisfy lo <= hi, got (0, -1e-50)"},
      {{1e39, inf}, "dt_limit lower bound must be finite in float32 (at most 3.40282e+38), got 1e+39"},
      {{inf, inf}, "dt_limit lower bound must be finite, got inf"},
      {{0.0, std::nan("")}, "dt_limit must not be NaN, got (0, nan)"},
  };
  for (const auto& [bounds, message] : refused) {
    try {
      validate_dt_limit(bounds.first, bounds.second);
      ADD_FAILURE() << "accepted (" << bounds.first << ", " << bounds.second << ")";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
  // Bounds whose float is the same clamp of float dt: a tiny lower bound (0), an upper bound past
  // float's range (inf, no bound), and none.
  for (auto [lo, hi] : {std::pair{1e-50, 1e-50}, {0.0, 1e39}, {0.0, inf}, {0.01, 0.1}})
    EXPECT_NO_THROW(validate_dt_limit(lo, hi)) << lo << ", " << hi;
  // float_dt_limit: the same verdicts, then the floats the fields take (past float's range, no bound).
  EXPECT_THROW(float_dt_limit(-1e-50, 1.0), Error);
  EXPECT_EQ(float_dt_limit(0.0, 1e39), (std::pair{0.0f, std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(float_dt_limit(0.01, 0.1), (std::pair{0.01f, 0.1f}));
}

// saved_states' size helpers at any size: the chunk count without overflow, the element count
// refused (Error, as validate_sizes) where the product could wrap.
static_assert(saved_states_chunks(0) == 0 && saved_states_chunks(1) == 1 && saved_states_chunks(64) == 1 &&
              saved_states_chunks(65) == 2);
static_assert(saved_states_chunks(std::numeric_limits<int64_t>::max()) == std::numeric_limits<int64_t>::max() / 64 + 1);
TEST(SavedStatesSizes, ElementsRefusesSizesPastTheLimits) {
  ForwardParams p;
  p.batch = 2, p.seqlen = 300, p.nheads = 4, p.headdim = 32, p.ngroups = 2, p.dstate = 16;
  EXPECT_EQ(saved_states_elements(p), 2 * 5 * 4 * 32 * 16);
  p.batch = int64_t{1} << 40, p.seqlen = int64_t{1} << 26, p.nheads = 1024, p.headdim = 128, p.dstate = 256;
  try {
    saved_states_elements(p);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is more than 2^56 elements"), std::string::npos) << e.what();
  }
}

TEST(InvalidInputApi, UnknownBackend) {
  HostProblem problem(valid_config());
  try {
    forward(problem.params(), static_cast<Backend>(9));
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend: unknown value 9"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mamba2ssd::testing
