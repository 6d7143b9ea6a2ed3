// Invalid backward calls: every rule of validate(BackwardParams) makes both host backends throw
// mamba2ssd::Error whose message names the parameter (and the value), before any gradient is written.
// And calls that are valid although they look unusual: no y, gradients as slices of one buffer.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backward_helpers.h"
#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

// A valid call with every optional tensor: packed sequences {3, 5} with seq_idx, so cu_seqlens and
// both state cotangents; padded gradient buffers.
ProblemConfig valid_config() {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 8, c.nheads = 2, c.headdim = 32, c.dstate = 16, c.chunk_size = 64;
  c.dtype = DType::kF32;
  c.z = true, c.dt_bias = true, c.initial_states = true, c.D_layout = DLayout::kPerHead;
  c.seqlens = {3, 5}, c.seq_idx = true;
  return c;
}

struct BadCase {
  std::string name;
  std::function<void(BackwardParams&)> edit;
  std::vector<std::string> message;  // substrings the message must contain
};

int64_t cu_wrong_end[] = {0, 3, 7};

// A place for fwd.saved_states (the valid config's [1, 1, 2, 32, 16] fp32 elements), 16-byte aligned.
alignas(16) float saved_buffer[1024];

std::vector<BadCase> bad_cases() {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max() / 4;
  return {
      // The forward's rules on sizes, inputs and options.
      {"Headdim40", [](auto& p) { p.fwd.headdim = 40; }, {"headdim must be a multiple of 16 in [16, 128], got 40"}},
      {"XNull", [](auto& p) { p.fwd.x = nullptr; }, {"x is null"}},
      {"DtLimitInverted", [](auto& p) { p.fwd.dt_min = 0.5f, p.fwd.dt_max = 0.25f; },
       {"dt_limit must satisfy lo <= hi, got (0.5, 0.25)"}},
      {"NegativeStrideB", [](auto& p) { p.fwd.B_stride.s1 = -16; }, {"B: negative stride", "-16"}},
      {"CuSeqlensWrongEnd", [](auto& p) { p.fwd.cu_seqlens = cu_wrong_end; }, {"cu_seqlens [2] must equal seqlen 8, got 7"}},
      // Cotangents and required gradients.
      {"DoutNull", [](auto& p) { p.dout = nullptr; }, {"dout is null"}},
      {"DxNull", [](auto& p) { p.dx = nullptr; }, {"dx (a required gradient) is null"}},
      {"DdtNull", [](auto& p) { p.ddt = nullptr; }, {"ddt (a required gradient) is null"}},
      {"DANull", [](auto& p) { p.dA = nullptr; }, {"dA (a required gradient) is null"}},
      {"DBNull", [](auto& p) { p.dB = nullptr; }, {"dB (a required gradient) is null"}},
      {"DCNull", [](auto& p) { p.dC = nullptr; }, {"dC (a required gradient) is null"}},
      // Optional gradients exactly with their inputs.
      {"DDWithoutD", [](auto& p) { p.fwd.D = nullptr, p.fwd.D_layout = DLayout::kNone; },
       {"dD is given but D is null"}},
      {"DWithoutDD", [](auto& p) { p.dD = nullptr; }, {"D is given but dD is null"}},
      {"DzWithoutZ", [](auto& p) { p.fwd.z = nullptr; }, {"dz is given but z is null"}},
      {"ZWithoutDz", [](auto& p) { p.dz = nullptr; }, {"z is given but dz is null"}},
      {"DdtBiasWithoutDtBias", [](auto& p) { p.fwd.dt_bias = nullptr; }, {"ddt_bias is given but dt_bias is null"}},
      {"DtBiasWithoutDdtBias", [](auto& p) { p.ddt_bias = nullptr; }, {"dt_bias is given but ddt_bias is null"}},
      {"DinitWithoutInit", [](auto& p) { p.fwd.initial_states = nullptr; },
       {"dinitial_states is given but initial_states is null"}},
      {"InitWithoutDinit", [](auto& p) { p.dinitial_states = nullptr; },
       {"initial_states is given but dinitial_states is null"}},
      {"DvarlenWithoutCuSeqlens", [](auto& p) { p.fwd.cu_seqlens = nullptr, p.fwd.nseqs = 0; },
       {"dvarlen_states needs cu_seqlens"}},
      // Strides.
      {"NonContiguousDx", [](auto& p) { p.dx_stride.s3 = 2; }, {"dx: last dimension must be contiguous", ", 2]"}},
      {"NonContiguousDdt", [](auto& p) { p.ddt_stride.s2 = 3; }, {"ddt: last dimension must be contiguous", ", 3]"}},
      {"NonContiguousDout", [](auto& p) { p.dout_stride.s3 = 0; }, {"dout: last dimension must be contiguous", ", 0]"}},
      {"NegativeStrideDfinal", [](auto& p) { p.dfinal_states_stride.s1 = -1; }, {"dfinal_states: negative stride", "-1"}},
      {"NegativeStrideDinit", [](auto& p) { p.dinitial_states_stride.s2 = -4; },
       {"dinitial_states: negative stride", "-4"}},
      {"DBAliasesItself", [](auto& p) { p.dB_stride.s1 = 0; }, {"dB: strides", "make elements alias"}},
      {"DzStrideOverflows", [kHuge](auto& p) { p.dz_stride.s1 = kHuge; }, {"dz: strides", "reach past 2^63"}},
      {"DvarlenStrideOverflows", [kHuge](auto& p) { p.dvarlen_states_stride.s0 = kHuge; },
       {"dvarlen_states: strides", "reach past 2^63"}},
      // Overlaps: gradients with each other, with inputs, with cotangents. An aliasing gradient takes
      // the strides of what it aliases, so that it reaches no third buffer (whose place in memory
      // varies) before the overlap the case is about.
      {"DzAliasesDx", [](auto& p) { p.dz = p.dx, p.dz_stride = p.dx_stride; }, {"output dx overlaps output dz"}},
      {"DCAliasesDB", [](auto& p) { p.dC = p.dB, p.dC_stride = p.dB_stride; }, {"output dB overlaps output dC"}},
      {"DdtBiasAliasesDA", [](auto& p) { p.ddt_bias = p.dA; }, {"output dA overlaps output ddt_bias"}},
      {"DxOverlapsX", [](auto& p) { p.dx = const_cast<void*>(p.fwd.x), p.dx_stride = p.fwd.x_stride; }, {"output dx overlaps input x"}},
      {"DAOverlapsA", [](auto& p) { p.dA = const_cast<float*>(p.fwd.A); }, {"output dA overlaps input A"}},
      {"DxOverlapsDout", [](auto& p) { p.dx = const_cast<void*>(p.dout), p.dx_stride = p.dout_stride; }, {"output dx overlaps input dout"}},
      {"DinitOverlapsDfinal", [](auto& p) {
         p.dinitial_states = const_cast<float*>(p.dfinal_states), p.dinitial_states_stride = p.dfinal_states_stride;
       },
       {"output dinitial_states overlaps input dfinal_states"}},
      {"DinitOverlapsInit", [](auto& p) {
         p.dinitial_states = const_cast<float*>(p.fwd.initial_states);
         p.dinitial_states_stride = p.fwd.initial_states_stride;
       },
       {"output dinitial_states overlaps input initial_states"}},
      // The states the CUDA forward saved: the host backends neither save nor read them; they are an
      // input of the backward, which no gradient may overlap.
      {"SavedStatesOnHostBackends", [](auto& p) { p.fwd.saved_states = saved_buffer; },
       {"saved_states: backend", "(backend cuda does); leave it null"}},
      {"DxOverlapsSavedStates", [](auto& p) { p.fwd.saved_states = p.dx; },
       {"output dx overlaps input saved_states"}},
  };
}

class InvalidBackward : public ::testing::TestWithParam<BadCase> {};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

// Both host backends refuse the call with the message, and leave every buffer untouched.
void expect_refused(BackwardProblem& problem, const std::function<void(BackwardParams&)>& edit,
                    const std::vector<std::string>& message, const std::string& what) {
  const auto before = problem.buffers;
  const auto inputs_before = problem.forward.buffers;
  const std::pair<const char*, BackwardBackend> backends[] = {
      {"cpu", cpu_backward()}, {"reference", [](const BackwardParams& p) { backward_reference(p); }}};
  for (const auto& [backend, run] : backends) {
    BackwardParams p = problem.params();
    edit(p);
    try {
      run(p);
      ADD_FAILURE() << backend << ": no exception for " << what;
    } catch (const Error& e) {
      const std::string text = e.what();
      for (const std::string& part : message)
        EXPECT_NE(text.find(part), std::string::npos) << backend << ": message \"" << text << "\" lacks \"" << part << "\"";
    } catch (const std::exception& e) {
      ADD_FAILURE() << backend << ": wrong exception type: " << e.what();
    }
    EXPECT_TRUE(problem.buffers == before) << backend << ": buffers changed by a refused call";
    EXPECT_TRUE(problem.forward.buffers == inputs_before) << backend << ": inputs changed by a refused call";
  }
}

TEST_P(InvalidBackward, ThrowsErrorNamingParameter) {
  BackwardProblem problem(valid_config(), GradLayout::kPadded);
  ASSERT_NO_THROW(validate(problem.params())) << "the base case must be valid";
  expect_refused(problem, GetParam().edit, GetParam().message, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(Rules, InvalidBackward, ::testing::ValuesIn(bad_cases()),
                         [](const auto& info) { return info.param.name; });

// A backward call does not read the forward's outputs: y may be null.
TEST(ValidBackward, ForwardOutputsAreNotNeeded) {
  BackwardProblem problem(valid_config());
  BackwardParams p = problem.params();
  p.fwd.y = nullptr, p.fwd.final_states = nullptr, p.fwd.varlen_states = nullptr;
  EXPECT_NO_THROW(validate(p));
  expect_backward_matches_oracle(problem, [&](const BackwardParams&) { backward_cpu(p); });
}

// Gradients interleaved as the columns of one buffer are disjoint and accepted; shifted by one
// element into a neighbour's columns, they overlap and are refused.
TEST(ValidBackward, FusedSlicesAreDisjointUntilShifted) {
  ProblemConfig c = valid_config();
  c.dt_dtype = c.dtype;
  BackwardProblem problem(c, GradLayout::kFused);
  EXPECT_NO_THROW(validate(problem.params()));
  auto shift = [](void* ptr, int64_t elems) { return static_cast<float*>(ptr) + elems; };
  expect_refused(problem, [&](BackwardParams& p) { p.dB = shift(p.dB, -1); }, {"output dx overlaps output dB"},
                 "dB shifted into dx");
  expect_refused(problem, [&](BackwardParams& p) { p.ddt = shift(p.ddt, -1); }, {"output ddt overlaps output dC"},
                 "ddt shifted into dC");
  expect_refused(problem, [&](BackwardParams& p) { p.dx_stride.s2 = 33; }, {"output dx overlaps output dB"},
                 "dx's heads spread into dB");
}

}  // namespace
}  // namespace mamba2ssd::testing
