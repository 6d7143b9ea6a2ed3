// The CUDA backward against the fp64 oracle over the backward's matrix (tests/cpu/backward_cases.h:
// every feature, dtype and gradient layout, listed and random), every gradient poisoned with NaN
// before each run; reruns must give the same bits (no atomics: determinism is a promise, and a
// moving result would be a race). Then the calls it refuses, larger shapes, and a second stream.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "api/internal.h"
#include "backward_cases.h"
#include "device_array.h"
#include "testing/device_problem.h"

namespace mamba2ssd::testing {
namespace {

// The CUDA backward does not take dvarlen_states (yet): its cases run without varlen_states.
BackwardCase without_varlen_states(BackwardCase c) {
  c.config.varlen_states = false;
  return c;
}

std::vector<BackwardCase> cuda_cases(std::vector<BackwardCase> cases) {
  for (auto& c : cases) c = without_varlen_states(c);
  return cases;
}

// One case: every gradient against the oracle, poisoned before each run, reruns bitwise. With
// `saved_by` (ForwardParams::saved_states), the forward runs first on that path, saving the states
// the backward then reads (their buffer poisoned before each forward), and its y and final states
// are checked too.
void check_one(BackwardCase c, int reruns = 2, std::optional<CudaPath> saved_by = std::nullopt) {
  if (saved_by) c.config.cuda_path = *saved_by;  // (the forward's; the backward has one path)
  BackwardProblem problem(c.config, c.layout);
  if (saved_by) problem.save_states();
  const std::string what =
      problem.describe() + (saved_by ? std::string(", states saved by the forward on path ") + to_string(*saved_by) : "");
  DeviceBackwardProblem dev(problem);
  auto run = [&] {
    if (saved_by) {
      dev.poison_forward_outputs();
      dev.launch_forward();
    }
    dev.poison_gradients();
    dev.launch();
  };
  run();
  if (saved_by) {
    const std::vector<Comparison> fwd = compare_with_oracle(problem.forward, dev.download_forward_outputs());
    EXPECT_FALSE(fwd.empty()) << what;
    for (const Comparison& cmp : fwd) EXPECT_TRUE(cmp.pass()) << what << ": forward " << cmp.name << " rel_l2 " << cmp.rel_l2;
  }
  const auto out = dev.download();
  const std::vector<Comparison> cmps = compare_gradients(problem, out, backward_oracle(problem));
  EXPECT_EQ(cmps.size(), problem.gradients.size()) << what;
  for (const Comparison& cmp : cmps)
    EXPECT_TRUE(cmp.pass()) << what << ": " << cmp.name << " rel_l2 " << cmp.rel_l2 << " (tolerance " << cmp.tolerance
                            << "), max_abs " << cmp.max_abs << ", " << cmp.nonfinite << " of " << cmp.count
                            << " not finite";
  EXPECT_EQ(written_outside_gradients(problem, out), 0) << what;
  for (int rerun = 0; rerun < reruns; ++rerun) {
    run();
    EXPECT_TRUE(dev.download() == out) << what << ": rerun " << rerun << " differs (a race, or an atomic)";
  }
}

class CudaBackwardVsOracle : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(CudaBackwardVsOracle, Matches) { check_one(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Listed, CudaBackwardVsOracle, ::testing::ValuesIn(cuda_cases(listed_cases())), case_name);
INSTANTIATE_TEST_SUITE_P(Random, CudaBackwardVsOracle, ::testing::ValuesIn(cuda_cases(random_cases(40))), case_name);

// The walks in each form on the listed and larger cases: the portable walks and chunk_grads (which the
// Hopper kernels replace on an H200 wherever they take the call), and the Hopper walks with one segment
// and with three (their entries chained across segments, in both directions). Forms that do not
// apply run the default.
class ScopedWalkForm {
 public:
  ScopedWalkForm(bool portable, int64_t segments) {
    detail::set_portable_backward_for_testing(portable);
    detail::set_fused_segments_for_testing(segments);
  }
  ~ScopedWalkForm() {
    detail::set_portable_backward_for_testing(false);
    detail::set_fused_segments_for_testing(0);
  }
  ScopedWalkForm(const ScopedWalkForm&) = delete;
  ScopedWalkForm& operator=(const ScopedWalkForm&) = delete;
};

// The random fp32 cases also on the portable chunk_grads, which fp32 runs where the Hopper one (TF32)
// does not take the call: before Hopper, states above 128.
TEST_P(CudaBackwardVsOracle, MatchesOnPortableKernels) {
  if (GetParam().config.dtype != DType::kF32) GTEST_SKIP() << "16-bit: CudaBackwardWalkForms.PortableKernels";
  const ScopedWalkForm form(true, 0);
  check_one(GetParam());
}

class CudaBackwardWalkForms : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(CudaBackwardWalkForms, PortableKernels) {
  const ScopedWalkForm form(true, 0);
  check_one(GetParam(), 1);
}
TEST_P(CudaBackwardWalkForms, HopperWalksOneSegment) {
  const ScopedWalkForm form(false, 1);
  check_one(GetParam(), 1);
}
TEST_P(CudaBackwardWalkForms, HopperWalksThreeSegments) {
  const ScopedWalkForm form(false, 3);
  check_one(GetParam(), 1);
}

// Shapes past the small matrix: many chunks, every head dim with the largest state, packed
// sequences whose boundaries fall inside and on the edges of the 64-token chunks.
std::vector<BackwardCase> larger_cases() {
  std::vector<BackwardCase> v;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    ProblemConfig c = backward_base(2, 1000, 4, 2, 64, 128, t);
    c.z = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.initial_states = true;
    c.seed = 7;
    v.push_back({c, GradLayout::kContiguous});
  }
  for (int64_t P : {32, 64, 80, 128}) {
    ProblemConfig c = backward_base(1, 700, 4, 1, P, 256, DType::kBF16);
    c.seqlens = {50, 78, 128, 0, 1, 200, 243}, c.seq_idx = true, c.initial_states = true, c.varlen_states = false;
    c.seed = 8;
    v.push_back({c, GradLayout::kPadded});
  }
  {  // 176: a state past 128 that is no multiple of 64 (Hopper's chunk_grads on 256 columns, the rest zeros)
    ProblemConfig c = backward_base(2, 1000, 4, 2, 64, 176, DType::kF16);
    c.z = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.initial_states = true;
    c.seed = 11;
    v.push_back({c, GradLayout::kContiguous});
  }
  {
    ProblemConfig c = backward_base(1, 640, 8, 8, 64, 80, DType::kF16);  // 80: a ragged block of state columns
    c.dt_dtype = DType::kF16;  // the fused layout holds ddt in the dtype of x
    c.seqlens = {64, 64, 0, 320, 192}, c.initial_states = true, c.varlen_states = false, c.z = true;
    c.seed = 9;
    v.push_back({c, GradLayout::kFused});
  }
  {  // fp32 (Hopper's chunk_grads on TF32): head dim 32 in its 64 columns, a state of 80 in two halves
     // of 64 (the second ragged), packed sequences, z
    ProblemConfig c = backward_base(1, 700, 4, 2, 32, 80, DType::kF32);
    c.seqlens = {50, 78, 128, 0, 1, 200, 243}, c.seq_idx = true, c.initial_states = true, c.varlen_states = false;
    c.z = true, c.seed = 12;
    v.push_back({c, GradLayout::kPadded});
  }
  {  // fp32 past a state of 128: the TF32 walks in four parts of 64 columns (the last past the state),
     // the portable chunk_grads behind them, the TF32 chunk_dbc in three blocks (the last ragged:
     // 176 = 2 x 64 + 48; a state is a multiple of 16, validate.cpp)
    ProblemConfig c = backward_base(1, 400, 4, 2, 64, 176, DType::kF32);
    c.seqlens = {130, 0, 64, 206}, c.seq_idx = true, c.initial_states = true, c.varlen_states = false;
    c.z = true, c.dt_bias = true, c.seed = 14;
    v.push_back({c, GradLayout::kContiguous});
  }
  {  // fp32 at head dim 128 (as heads of 64, head_split.h) and a state of 64 (one half)
    ProblemConfig c = backward_base(2, 500, 4, 1, 128, 64, DType::kF32);
    c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.seed = 13;
    v.push_back({c, GradLayout::kContiguous});
  }
  // Head dims no power of two (Nemotron-H's 80; 48, 112): the portable chunk_grads and chunk_dbc in
  // tiles of 64 or 128 rows, the Hopper walks' last column tile partly past the head dim; every
  // optional input, each dtype.
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t P = t == DType::kF32 ? 80 : t == DType::kF16 ? 48 : 112;
    ProblemConfig c = backward_base(2, 500, 4, 2, P, 128, t);
    c.z = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.initial_states = true;
    c.seed = 15;
    v.push_back({c, GradLayout::kContiguous});
  }
  {  // three heads a group with a ragged block of 48 state columns and a partial last chunk (Hopper's chunk_dbc)
    ProblemConfig c = backward_base(1, 666, 6, 2, 64, 48, DType::kBF16);
    c.seqlens = {100, 0, 233, 1, 99, 233}, c.seq_idx = true, c.varlen_states = false, c.z = true, c.dt_bias = true;
    c.seed = 10;
    v.push_back({c, GradLayout::kPadded});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Larger, CudaBackwardVsOracle, ::testing::ValuesIn(larger_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Listed, CudaBackwardWalkForms, ::testing::ValuesIn(cuda_cases(listed_cases())), case_name);
INSTANTIATE_TEST_SUITE_P(Larger, CudaBackwardWalkForms, ::testing::ValuesIn(larger_cases()), case_name);

// The states saved by the forward (ForwardParams::saved_states) in place of the backward's own walk
// of them: on the forward's own choice of path (the hopper walk saves them as it goes where it runs
// the call with 16-bit inputs; elsewhere a walk of their own after the path), on the
// three-kernel path (that walk), and in the backward's walk forms (the forward's walk then in as
// many segments).
class CudaBackwardSavedStates : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(CudaBackwardSavedStates, Matches) { check_one(GetParam(), 2, CudaPath::kAuto); }
TEST_P(CudaBackwardSavedStates, ThreeKernelForward) { check_one(GetParam(), 1, CudaPath::kThreeKernel); }
// The hopper path's forward, wherever it takes the call (auto may choose another path for a small
// call): its walk saves them as it goes with 16-bit inputs, every head dim; fp32's TF32 walk does
// not, and a walk of their own runs after it.
TEST_P(CudaBackwardSavedStates, HopperForward) {
  const BackwardCase& c = GetParam();
  // Asked of the call's auto form: a device problem forced onto a path sizes that path's
  // workspace, which throws where the path refuses the call (fp32 past a state of 128).
  BackwardProblem problem(c.config, c.layout);
  problem.save_states();
  const DeviceBackwardProblem device(problem);
  ForwardParams f = device.params().fwd;
  f.cuda_path = CudaPath::kHopper;
  const CudaExplanation x = explain_cuda(f);
  if (x.chosen != CudaPath::kHopper) GTEST_SKIP() << "the hopper path does not take it: " << x.to_string();
  const bool walk_saves = c.config.dtype != DType::kF32;
  EXPECT_NE(x.plan.find(walk_saves ? "saved by its walk" : "saved by a walk of their own"), std::string::npos)
      << x.to_string();
  check_one(GetParam(), 1, CudaPath::kHopper);
}
TEST_P(CudaBackwardSavedStates, PortableKernels) {
  const ScopedWalkForm form(true, 0);
  check_one(GetParam(), 1, CudaPath::kAuto);
}
TEST_P(CudaBackwardSavedStates, ThreeSegments) {
  const ScopedWalkForm form(false, 3);
  check_one(GetParam(), 1, CudaPath::kAuto);
}

// The calls whose hopper walk saves them (16-bit inputs; head dim 64 in one column tile, 32 and 128
// in column tiles of their own) around the edges of the 64-token steps: one token, a step and one,
// sequences that start on a step's first token and inside one, state sizes whose columns the walk
// pads (16, 48, 80, 176), groups, every optional input.
std::vector<BackwardCase> saved_states_cases() {
  std::vector<BackwardCase> v;
  const DType bf16 = DType::kBF16, f16 = DType::kF16;
  v.push_back({backward_base(2, 1, 2, 1, 64, 32, bf16), GradLayout::kContiguous});
  v.push_back({backward_base(3, 129, 2, 1, 64, 64, f16), GradLayout::kContiguous});
  v.push_back({backward_base(2, 129, 2, 1, 128, 48, bf16), GradLayout::kContiguous});
  v.push_back({backward_base(3, 65, 4, 2, 32, 80, f16), GradLayout::kContiguous});
  for (int64_t N : {16, 48, 80, 176}) {
    const int64_t P = N == 80 ? 128 : N == 16 ? 32 : 64;
    ProblemConfig c = backward_base(2, 300, 4, 2, P, N, N == 48 ? f16 : bf16);
    c.z = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.initial_states = true;
    c.seed = 20 + N;
    v.push_back({c, GradLayout::kContiguous});
  }
  for (int64_t P : {16, 80}) {  // the walk's last column tile of state rows partly past the head dim
    ProblemConfig c = backward_base(2, 300, 4, 2, P, 128, P == 16 ? f16 : bf16);
    c.z = true, c.D_layout = DLayout::kPerHead, c.initial_states = true;
    c.seed = 40 + P;
    v.push_back({c, GradLayout::kContiguous});
  }
  {
    ProblemConfig c = backward_base(1, 356, 4, 1, 64, 128, bf16);
    c.seqlens = {64, 128, 64, 100}, c.seq_idx = true, c.initial_states = true, c.varlen_states = false;
    c.seed = 31;
    v.push_back({c, GradLayout::kPadded});
  }
  {
    ProblemConfig c = backward_base(1, 333, 8, 2, 64, 256, f16);
    c.seqlens = {1, 63, 65, 0, 204}, c.seq_idx = true, c.z = true, c.varlen_states = false;
    c.seed = 32;
    v.push_back({c, GradLayout::kContiguous});
    c.headdim = 128, c.nheads = 4, c.seed = 33;
    v.push_back({c, GradLayout::kContiguous});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Listed, CudaBackwardSavedStates, ::testing::ValuesIn(cuda_cases(listed_cases())), case_name);
INSTANTIATE_TEST_SUITE_P(Larger, CudaBackwardSavedStates, ::testing::ValuesIn(larger_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(WalkSaves, CudaBackwardSavedStates, ::testing::ValuesIn(saved_states_cases()), case_name);

// Who saves the states, as explain_cuda says: the hopper walk where it runs the call with 16-bit
// inputs (every head dim), a walk of their own elsewhere (fp32); the forward's workspace grows by
// that walk's sections only. The backward that reads them has no section for them.
TEST(CudaBackward, SavedStatesPlanAndWorkspace) {
  auto explained = [](const ProblemConfig& c) {
    BackwardProblem problem(c);
    problem.save_states();
    DeviceBackwardProblem dev(problem);
    const CudaExplanation x = explain_cuda(dev.params().fwd);
    EXPECT_EQ(x.workspace_bytes, cuda_workspace_bytes(dev.params().fwd));
    return x;
  };
  const CudaExplanation f32 = explained(backward_base(1, 200, 2, 1, 64, 32, DType::kF32));
  EXPECT_NE(f32.plan.find("saved by a walk of their own"), std::string::npos) << f32.to_string();
  for (int64_t P : {32, 64, 80, 128}) {
    const CudaExplanation x = explained(backward_base(1, 200, 2, 1, P, 32, DType::kBF16));
    const char* who = x.chosen == CudaPath::kHopper ? "saved by its walk" : "saved by a walk of their own";
    EXPECT_NE(x.plan.find(who), std::string::npos) << "head dim " << P << ": " << x.to_string();
  }

  const ScopedWalkForm form(false, 1);  // (with one direction the walks' plan may choose other segments)
  BackwardProblem plain(backward_base(2, 300, 4, 2, 64, 128, DType::kBF16)), saved(plain.forward.config);
  saved.save_states();
  DeviceBackwardProblem dev_plain(plain), dev_saved(saved);
  const ForwardParams f = dev_saved.params().fwd;
  EXPECT_EQ(cuda_backward_workspace_bytes(dev_plain.params()) - cuda_backward_workspace_bytes(dev_saved.params()),
            (static_cast<std::size_t>(saved_states_elements(f)) * 2 + 255) / 256 * 256);
  EXPECT_NE(explain_cuda_backward(dev_saved.params()).plan.find("saved"), std::string::npos);
}

TEST(CudaBackward, RefusesVarlenStateGradientsNamingThem) {
  ProblemConfig c = backward_base(1, 200, 2, 1, 32, 32, DType::kBF16);
  c.seqlens = {100, 100};  // varlen_states on: the problem has dvarlen_states
  BackwardProblem problem(c);
  ASSERT_NE(problem.params().dvarlen_states, nullptr);
  try {
    DeviceBackwardProblem dev(problem);
    FAIL() << "the CUDA backward took dvarlen_states";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dvarlen_states"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
}

// chunk_dbc's grid has a y of groups x column blocks: fp32 blocks take 32 state columns, so 16400
// groups of N 128 need 65600 and are refused, naming the groups and the state.
TEST(CudaBackward, RefusesTooManyDbcBlocksNamingThem) {
  BackwardProblem problem(backward_base(1, 1, 16400, 16400, 32, 128, DType::kF32));
  try {
    DeviceBackwardProblem dev(problem);
    FAIL() << "the CUDA backward took a dB/dC grid of 65600 blocks in y";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ngroups 16400, dstate 128"), std::string::npos) << e.what();
  }
}

TEST(CudaBackward, WorkspaceChecks) {
  BackwardProblem problem(backward_base(1, 100, 2, 1, 32, 32, DType::kBF16));
  DeviceBackwardProblem dev(problem);
  const BackwardParams p = dev.params();
  const std::size_t need = cuda_backward_workspace_bytes(p);
  EXPECT_THROW(backward_cuda(p, nullptr, need, nullptr), Error);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, need + 256), cudaSuccess);
  EXPECT_THROW(backward_cuda(p, ws, need - 1, nullptr), Error);
  EXPECT_THROW(backward_cuda(p, static_cast<char*>(ws) + 16, need, nullptr), Error);
  cudaFree(ws);
}

// explain_cuda_backward answers from the plan and the refusals backward_cuda runs by: its workspace
// is the one asked for; fp32 runs the Hopper kernels (TF32) as 16-bit does (chunk_grads with
// states of at most 128), naming why where it does not; the chunk kernels run only behind the
// Hopper walks, and the launches are chained exactly where those walks run.
TEST(CudaBackward, ExplainsItsPlanAndKernels) {
  auto explain = [](const ProblemConfig& c, GradLayout layout = GradLayout::kContiguous) {
    BackwardProblem problem(c, layout);
    DeviceBackwardProblem dev(problem);
    const CudaBackwardExplanation x = explain_cuda_backward(dev.params());
    EXPECT_EQ(x.workspace_bytes, cuda_backward_workspace_bytes(dev.params()));
    EXPECT_EQ(x.kernels.size(), 3u);
    EXPECT_EQ(x.chained, !x.kernels.empty() && x.kernels[0].refusal.empty());
    EXPECT_NE(x.to_string().find("chunk_dbc: "), std::string::npos) << x.to_string();
    return x;
  };
  const std::string walks = explain(backward_base(2, 300, 4, 2, 64, 128, DType::kBF16)).kernels.at(0).refusal;
  const bool hopper = walks.empty();
  const CudaBackwardExplanation f32 = explain(backward_base(2, 300, 4, 2, 64, 128, DType::kF32));
  ASSERT_EQ(f32.kernels.size(), 3u);
  EXPECT_EQ(f32.kernels[0].name, "walks");
  EXPECT_EQ(f32.kernels[0].refusal, walks);
  EXPECT_EQ(f32.kernels[1].refusal, hopper ? "" : "it runs only behind the Hopper walks");
  EXPECT_EQ(f32.kernels[2].refusal, hopper ? "" : "it runs only behind the Hopper walks");
  if (hopper) {
    const CudaBackwardExplanation n256 = explain(backward_base(2, 300, 4, 2, 64, 256, DType::kF32));
    EXPECT_EQ(n256.kernels.at(1).refusal, "fp32 inputs take state sizes up to 128 (dstate 256)");
    const CudaBackwardExplanation f32_128 = explain(backward_base(2, 300, 4, 2, 128, 128, DType::kF32));
    EXPECT_EQ(f32_128.kernels.at(1).refusal, "");
    EXPECT_NE(f32_128.plan.find("head dim 128 as 8 heads of 64"), std::string::npos) << f32_128.plan;
    const ScopedWalkForm portable(true, 0);  // (its own scope ends with the block)
    EXPECT_EQ(explain(backward_base(2, 300, 4, 2, 64, 128, DType::kF32)).kernels.at(1).refusal,
              "it runs only behind the Hopper walks");
  }

  // Head dim 32: in the Hopper kernels' 64 columns wherever the walks run.
  const CudaBackwardExplanation p32 = explain(backward_base(2, 300, 4, 2, 32, 128, DType::kBF16));
  ASSERT_EQ(p32.kernels.size(), 3u);
  if (p32.kernels[0].refusal.empty()) {
    EXPECT_EQ(p32.kernels[1].refusal, "");
    EXPECT_EQ(p32.kernels[2].refusal, "");
  }
  EXPECT_EQ(p32.plan.find("heads of 64"), std::string::npos) << p32.plan;

  // Head dim 128: where the Hopper walks run (an sm_90 GPU, sm_90a code), as twice the heads of 64
  // on every Hopper kernel (head_split.h); with gradients whose heads are not P rows apart, or the
  // portable kernels forced, as it is.
  const ProblemConfig c128 = backward_base(2, 300, 4, 2, 128, 128, DType::kBF16);
  const CudaBackwardExplanation p128 = explain(c128);
  ASSERT_EQ(p128.kernels.size(), 3u);
  if (p128.kernels[0].refusal.empty()) {
    EXPECT_EQ(p128.kernels[1].refusal, "");
    EXPECT_EQ(p128.kernels[2].refusal, "");
    EXPECT_NE(p128.plan.find("head dim 128 as 8 heads of 64"), std::string::npos) << p128.plan;
  } else {
    EXPECT_EQ(p128.kernels[1].refusal, "it runs only behind the Hopper walks");
    EXPECT_EQ(p128.plan.find("heads of 64"), std::string::npos) << p128.plan;
  }
  const CudaBackwardExplanation padded = explain(c128, GradLayout::kPadded);
  EXPECT_EQ(padded.plan.find("heads of 64"), std::string::npos) << padded.plan;
  if (padded.kernels[0].refusal.empty())
    EXPECT_EQ(padded.kernels[1].refusal, "it takes head dim 32 or 64 (head dim 128)");
  const ScopedWalkForm form(true, 0);
  const CudaBackwardExplanation portable = explain(c128);
  EXPECT_EQ(portable.plan.find("heads of 64"), std::string::npos) << portable.plan;
  EXPECT_EQ(portable.kernels[0].refusal, "the portable kernels are forced (tests)");
}

// Inputs broadcast with stride 0 (torch's expand()), as in ForwardCudaRuns.InputsExpandedWithStrideZero:
// x and z one batch row for every row, C likewise, B and dt one token's for every token, the
// initial states one row's. Each gradient is still per element of the view (the caller's autograd
// sums the broadcast), on the Hopper and the portable kernels, against the oracle on the same view.
TEST(CudaBackward, InputsExpandedWithStrideZero) {
  for (DType t : {DType::kBF16, DType::kF32})
    for (bool portable : {false, true}) {
      ProblemConfig c = backward_base(3, 300, 4, 2, 64, 128, t);
      c.z = true, c.initial_states = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true;
      BackwardProblem problem(c);
      const std::string what = problem.describe() + ", expanded inputs" + (portable ? ", portable" : "");
      const ScopedWalkForm form(portable, 0);  // (before the workspace is sized: the plans differ)
      DeviceBackwardProblem dev(problem);
      BackwardParams hp = problem.params(), dp = dev.params();
      for (BackwardParams* p : {&hp, &dp}) {
        p->fwd.x_stride.s0 = 0, p->fwd.z_stride.s0 = 0, p->fwd.C_stride.s0 = 0, p->fwd.initial_states_stride.s0 = 0;
        p->fwd.B_stride.s1 = 0, p->fwd.dt_stride.s1 = 0;
      }
      const reference::Grads64 ref = reference::run_backward(hp);
      dev.poison_gradients();
      EXPECT_NO_THROW(backward_cuda(dp, dev.workspace(), dev.workspace_bytes(), nullptr)) << what;
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const std::vector<Comparison> cmps = compare_gradients(problem, dev.download(), ref);
      EXPECT_EQ(cmps.size(), problem.gradients.size()) << what;
      for (const Comparison& cmp : cmps)
        EXPECT_TRUE(cmp.pass()) << what << ": " << cmp.name << " rel_l2 " << cmp.rel_l2 << " (tolerance "
                                << cmp.tolerance << "), " << cmp.nonfinite << " of " << cmp.count << " not finite";
    }
}

TEST(CudaBackward, SecondStreamGivesTheSameBits) {
  ProblemConfig c = backward_base(2, 300, 4, 2, 64, 64, DType::kBF16);
  c.z = true, c.initial_states = true;
  BackwardProblem problem(c);
  DeviceBackwardProblem dev(problem);
  dev.poison_gradients();
  dev.launch();
  const auto want = dev.download();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  dev.poison_gradients();
  dev.launch(s);
  cudaStreamSynchronize(s);
  EXPECT_TRUE(dev.download() == want);
  cudaStreamDestroy(s);
}

// The blocking entry point (mamba2ssd::backward) on device pointers picks CUDA.
TEST(CudaBackward, AutoBackendPicksCuda) {
  BackwardProblem problem(backward_base(1, 130, 2, 1, 32, 32, DType::kF16));
  DeviceBackwardProblem dev(problem);
  EXPECT_EQ(backward(dev.params()), Backend::kCuda);
}

// A development timing, not a test (disabled; --gtest_also_run_disabled_tests runs it): the backward
// alone on the headline and 2.7B shapes (the benchmark is bench/bench.py).
TEST(CudaBackwardTiming, DISABLED_Shapes) {
  struct Shape {
    const char* name;
    int64_t b, L, H, P, N;
  };
  for (const Shape& s : {Shape{"16K headline", 4, 16384, 8, 64, 128}, Shape{"2.7B", 8, 2048, 80, 64, 128}}) {
    ProblemConfig c = backward_base(s.b, s.L, s.H, 1, s.P, s.N, DType::kBF16);
    c.final_states = false;
    BackwardProblem problem(c);
    DeviceBackwardProblem dev(problem);
    std::printf("backward %s (%s): median %.1f us\n", s.name, c.describe().c_str(),
                median_launch_us([&] { dev.launch(); }));
  }
}

}  // namespace
}  // namespace mamba2ssd::testing
