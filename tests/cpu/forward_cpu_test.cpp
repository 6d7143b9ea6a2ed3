// The CPU path against the oracle over a matrix of shapes and features, plus determinism: the same
// call twice, and any thread count, give bitwise identical outputs.
#include <gtest/gtest.h>

#include <cctype>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

ProblemConfig base(int64_t batch, int64_t seqlen, int64_t nheads, int64_t ngroups, int64_t headdim,
                   int64_t dstate, int64_t chunk, DType dtype) {
  ProblemConfig c;
  c.batch = batch, c.seqlen = seqlen, c.nheads = nheads, c.ngroups = ngroups, c.headdim = headdim;
  c.dstate = dstate, c.chunk_size = chunk, c.dtype = dtype;
  return c;
}

// Hand-picked cases, so that every feature and size is covered whatever the random draws do.
std::vector<ProblemConfig> listed_cases() {
  std::vector<ProblemConfig> v;
  const DType f32 = DType::kF32, f16 = DType::kF16, bf16 = DType::kBF16;
  // Ragged lengths around and across chunk boundaries.
  for (int64_t L : {1, 63, 65, 200, 300}) v.push_back(base(2, L, 4, 2, 64, 32, 64, bf16));
  // Every group count, head dim, a spread of state sizes, every chunk size and dtype.
  v.push_back(base(1, 130, 4, 1, 32, 16, 128, f32));
  v.push_back(base(1, 130, 4, 4, 128, 48, 256, f16));
  v.push_back(base(2, 100, 2, 2, 32, 256, 64, bf16));
  v.push_back(base(1, 90, 4, 2, 128, 256, 128, f32));
  v.push_back(base(1, 70, 2, 1, 64, 128, 256, f16));
  // dt in 16-bit, every D layout.
  {
    ProblemConfig c = base(2, 65, 4, 2, 32, 32, 64, bf16);
    c.dt_dtype = DType::kF16, c.D_layout = DLayout::kNone;
    v.push_back(c);
    c.dt_dtype = DType::kBF16, c.D_layout = DLayout::kPerHeadDim, c.dtype = f16;
    v.push_back(c);
  }
  // Gate, dt bias, softplus, dt limit (both bounds active), initial and final states.
  {
    ProblemConfig c = base(2, 150, 4, 2, 64, 64, 64, f32);
    c.z = true, c.dt_bias = true, c.dt_softplus = true, c.dt_min = 0.01f, c.dt_max = 0.1f;
    c.initial_states = true, c.D_layout = DLayout::kPerHeadDim;
    v.push_back(c);
    c.dtype = bf16, c.dt_softplus = false, c.dt_min = 0.02f, c.dt_max = 0.05f, c.final_states = false;
    v.push_back(c);
  }
  // Packed sequences (with empty ones) through seq_idx or cu_seqlens alone, varlen states.
  {
    ProblemConfig c = base(1, 300, 4, 4, 64, 32, 128, bf16);
    c.seqlens = {0, 65, 1, 63, 0, 171, 0};
    c.initial_states = true, c.z = true;
    v.push_back(c);
    c.seq_idx = true;
    v.push_back(c);
  }
  // Strided views of every tensor.
  {
    ProblemConfig c = base(2, 77, 4, 2, 32, 48, 64, f16);
    c.strided = true, c.z = true, c.initial_states = true, c.D_layout = DLayout::kPerHeadDim;
    v.push_back(c);
    c = base(1, 120, 2, 1, 64, 16, 64, f32);
    c.strided = true, c.seqlens = {50, 0, 70}, c.seq_idx = true, c.initial_states = true;
    v.push_back(c);
  }
  return v;
}

// Random combinations of everything; sizes kept small so the fp64 oracle stays quick.
std::vector<ProblemConfig> random_cases(int count) {
  std::mt19937_64 rng(20240611);
  auto pick = [&](auto... options) {
    using T = std::common_type_t<decltype(options)...>;
    const T values[] = {static_cast<T>(options)...};
    return values[rng() % sizeof...(options)];
  };
  auto coin = [&] { return rng() % 2 == 0; };
  std::vector<ProblemConfig> v;
  for (int i = 0; i < count; ++i) {
    ProblemConfig c;
    c.nheads = pick(2, 4);
    c.ngroups = pick(int64_t{1}, int64_t{2}, c.nheads);
    c.headdim = pick(16, 32, 48, 64, 80, 128);
    c.dstate = 16 * (1 + static_cast<int64_t>(rng() % 16));
    c.chunk_size = pick(64, 128, 256);
    c.seqlen = pick(1, 63, 65, 200, 300);
    c.batch = pick(1, 2);
    if (c.headdim * c.dstate * c.seqlen > 64 * 128 * 300) c.batch = 1;  // bound the oracle's work
    c.dtype = pick(DType::kF32, DType::kF16, DType::kBF16);
    c.dt_dtype = pick(DType::kF32, DType::kF16, DType::kBF16);
    c.D_layout = pick(DLayout::kNone, DLayout::kPerHead, DLayout::kPerHeadDim);
    c.z = coin(), c.dt_bias = coin(), c.dt_softplus = coin(), c.initial_states = coin();
    c.final_states = rng() % 4 != 0;
    c.strided = coin();
    if (rng() % 3 == 0) c.dt_min = 0.005f, c.dt_max = 0.08f;
    if (rng() % 3 == 0 && c.seqlen > 1) {  // packed: cut seqlen into 1 to 4 pieces, some empty
      c.batch = 1;
      int64_t left = c.seqlen;
      const int pieces = 1 + static_cast<int>(rng() % 4);
      for (int s = 0; s + 1 < pieces; ++s) {
        const int64_t len = static_cast<int64_t>(rng() % (left + 1));
        c.seqlens.push_back(len);
        left -= len;
      }
      c.seqlens.push_back(left);
      c.seq_idx = coin();
    }
    c.seed = static_cast<uint64_t>(i + 1);
    v.push_back(c);
  }
  return v;
}

std::string param_name(const ::testing::TestParamInfo<ProblemConfig>& info) {
  std::string name = std::to_string(info.index) + "_";
  for (char ch : info.param.describe()) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch));
    if (ok || name.back() != '_') name += ok ? ch : '_';
  }
  while (name.back() == '_') name.pop_back();
  return name;
}

class CpuVsOracle : public ::testing::TestWithParam<ProblemConfig> {};

TEST_P(CpuVsOracle, Matches) {
  HostProblem problem(GetParam());
  expect_cpu_matches_oracle(problem);
}

INSTANTIATE_TEST_SUITE_P(Listed, CpuVsOracle, ::testing::ValuesIn(listed_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Random, CpuVsOracle, ::testing::ValuesIn(random_cases(120)), param_name);

// Decays far outside the usual range: a head that barely decays over a long input, a head whose
// single steps underflow exp to zero, a head with A = 0 and one with A > 0 (growth).
TEST(CpuForward, ExtremeDecays) {
  ProblemConfig c = base(1, 2000, 4, 1, 32, 16, 64, DType::kF32);
  c.initial_states = true;
  HostProblem problem(c);
  float* A = buffer<float>(problem, "A");
  A[0] = -1e-4f, A[1] = -50.0f, A[2] = 0.0f, A[3] = 0.3f;
  float* dt = buffer<float>(problem, "dt");
  for (int64_t t = 0; t < c.seqlen; t += 97) dt[t * c.nheads + 1] = 30.0f;  // exp(-1500) == 0
  expect_cpu_matches_oracle(problem);
}

// A scaled A, as the GPU matrix's fast-decay cases use it; a scale that is not finite is refused.
TEST(CpuForward, ScaledDecays) {
  ProblemConfig c = base(1, 300, 4, 1, 64, 32, 64, DType::kBF16);
  c.A_scale = 16.0f;
  HostProblem problem(c);
  EXPECT_LT(buffer<float>(problem, "A")[0], -3.0f);  // -16 exp(u), u in [-1.4, 1.4]
  expect_cpu_matches_oracle(problem);
  c.A_scale = std::numeric_limits<float>::quiet_NaN();
  try {
    HostProblem bad(c);
    FAIL() << "a NaN A_scale was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("A_scale"), std::string::npos) << e.what();
  }
}

// A long input at the default problem's head shape: many folds of the rescaled state.
TEST(CpuForward, LongSequence) {
  ProblemConfig c = base(1, 4096, 4, 1, 64, 128, 128, DType::kBF16);
  c.dt_bias = true, c.dt_softplus = true, c.initial_states = true;
  HostProblem problem(c);
  expect_cpu_matches_oracle(problem);
}

// Outputs of one call as raw bytes.
std::vector<std::vector<uint8_t>> run_cpu(HostProblem& problem, int threads) {
  problem.poison_outputs();
  forward_cpu(problem.params(), threads);
  std::vector<std::vector<uint8_t>> out;
  for (const char* name : {"y", "final_states", "varlen_states"})
    if (problem.buffers.count(name)) out.push_back(problem.buffers.at(name));
  return out;
}

ProblemConfig determinism_case() {
  ProblemConfig c = base(1, 257, 4, 2, 64, 32, 64, DType::kBF16);
  c.seqlens = {100, 57, 100}, c.seq_idx = true, c.initial_states = true, c.z = true;
  return c;
}

TEST(CpuForward, RepeatedCallsAreBitwiseIdentical) {
  HostProblem problem(determinism_case());
  const auto first = run_cpu(problem, 2);
  EXPECT_EQ(run_cpu(problem, 2), first);
}

TEST(CpuForward, ThreadCountDoesNotChangeResults) {
  HostProblem problem(determinism_case());
  const auto one = run_cpu(problem, 1);
  EXPECT_EQ(run_cpu(problem, 2), one);
  EXPECT_EQ(run_cpu(problem, 0), one);    // every hardware thread
  EXPECT_EQ(run_cpu(problem, -3), one);   // likewise
  EXPECT_EQ(run_cpu(problem, 100), one);  // more threads than work items
}

// chunk_size organizes the peer's scan, not the function: any length runs, and gives the same bits
// (the CPU path tiles its own way) within the oracle's bar.
TEST(CpuForward, AnyChunkSizeGivesTheSameFunction) {
  ProblemConfig c = determinism_case();
  HostProblem problem(c);
  const auto at64 = run_cpu(problem, 2);
  for (int64_t chunk : {1, 17, 32, 100, 1000}) {
    c.chunk_size = chunk;
    HostProblem other(c);
    EXPECT_EQ(run_cpu(other, 2), at64) << "chunk_size " << chunk;
    expect_cpu_matches_oracle(other);
  }
}

TEST(CpuForward, BackendDispatchRunsTheCpuPath) {
  ProblemConfig c = base(1, 65, 2, 1, 32, 16, 64, DType::kF16);
  HostProblem problem(c);
  problem.poison_outputs();
  EXPECT_EQ(forward(problem.params(), Backend::kCpu), Backend::kCpu);
  for (const Comparison& cmp : compare_with_oracle(problem, problem.buffers)) EXPECT_TRUE(cmp.pass()) << cmp.name;
  EXPECT_EQ(forward(problem.params()), Backend::kCpu);  // host pointers: auto picks the CPU
}

}  // namespace
}  // namespace mamba2ssd::testing
