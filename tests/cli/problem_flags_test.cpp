// The CLI's problem flags both ways, and the fuzz cases: every case is valid and small, the sweep
// covers every value the fuzzer promises, and the command line printed for a failing case rebuilds
// exactly that case (config_from(Args::parse(run_flags(c))) == c), so a reported failure reproduces.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "fuzz.h"
#include "problem_flags.h"
#include "testing/decode_problem.h"
#include "testing/prefill_problem.h"
#include "testing/problem.h"

namespace mamba2ssd::cli {
namespace {

using testing::ProblemConfig;

ProblemConfig round_trip(const ProblemConfig& c) { return config_from(Args::parse(kRun, run_flags(c))); }

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

TEST(ProblemFlags, FuzzCasesRoundTripThroughTheCommandLine) {
  for (uint64_t seed : {0ull, 1ull, 2ull, 18446744073709551615ull})
    for (int64_t i = 0; i < 500; ++i) {
      const ProblemConfig c = fuzz_case(seed, i);
      EXPECT_EQ(round_trip(c), c) << "seed " << seed << " case " << i << ": " << c.describe() << "\n  "
                                  << repro_command(c, Backend::kCpu);
    }
}

// The printed command, split into words as a shell would, parses as `run` flags and rebuilds the
// case (with --impl, --check-all and --repeats, which are not part of it).
TEST(ProblemFlags, ReproCommandParsesBackToTheCase) {
  ProblemConfig c = fuzz_case(7, 3);
  c.cuda_path = CudaPath::kFused;
  const std::vector<std::string> w = words(repro_command(c, Backend::kCuda));
  ASSERT_GE(w.size(), 2u);
  EXPECT_EQ(w[0], "mamba2ssd");
  EXPECT_EQ(w[1], "run");
  const Args args = Args::parse(kRun, std::vector<std::string>(w.begin() + 2, w.end()));
  EXPECT_EQ(args.raw("--impl"), "cuda");
  EXPECT_TRUE(args.has("--check-all"));
  EXPECT_EQ(args.raw("--path"), "fused");
  ProblemConfig back = config_from(args);
  back.cuda_path = CudaPath::kFused;  // run takes --path through path_flag, not config_from
  EXPECT_EQ(back, c);
}

// --fp32-math: tf32 by default (and then not printed), accurate read and printed back.
TEST(ProblemFlags, Fp32MathRoundTrips) {
  EXPECT_EQ(config_from(Args::parse(kRun, {})).fp32_math, Fp32Math::kTf32);
  EXPECT_EQ(config_from(Args::parse(kRun, {"--fp32-math", "tf32"})).fp32_math, Fp32Math::kTf32);
  EXPECT_EQ(config_from(Args::parse(kRun, {"--fp32-math", "accurate"})).fp32_math, Fp32Math::kAccurate);
  ProblemConfig c = fuzz_case(3, 1);
  c.dtype = DType::kF32, c.fp32_math = Fp32Math::kTf32;
  for (const std::string& w : run_flags(c)) EXPECT_NE(w, "--fp32-math");
  c.fp32_math = Fp32Math::kAccurate;
  EXPECT_EQ(round_trip(c), c) << repro_command(c, Backend::kCuda);
  EXPECT_NE(repro_command(c, Backend::kCuda).find(" --fp32-math accurate "), std::string::npos);
}

// Values that a decimal round trip could lose: float limits and scales, all 64 bits of a seed.
TEST(ProblemFlags, FloatsAndSeedsRoundTripExactly) {
  ProblemConfig c = fuzz_case(0, 0);
  c.dt_min = 0.1f, c.dt_max = 1.0f / 3.0f, c.A_scale = 8.5f, c.seed = 18446744073709551615ull;
  EXPECT_EQ(round_trip(c), c);
  c.dt_min = std::nextafter(0.001f, 1.0f), c.dt_max = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_trip(c), c);
}

// Every case builds (HostProblem, validate) and stays within the budget.
TEST(FuzzCases, AreValidAndSmall) {
  for (int64_t i = 0; i < 400; ++i) {
    const ProblemConfig c = fuzz_case(11, i);
    EXPECT_LE(c.batch * c.seqlen * c.nheads * c.headdim * c.dstate, std::max(kFuzzBudget, c.nheads * c.headdim * c.dstate))
        << c.describe();
    testing::HostProblem problem(c);
    EXPECT_NO_THROW(validate(problem.params())) << c.describe();
  }
}

// The sweep reaches every value it promises (in 2000 cases of one seed).
TEST(FuzzCases, CoverEveryShapeDtypeLayoutAndFeature) {
  std::set<int64_t> headdims, dstates, chunks, heads, groups;
  std::set<int> dtypes, dt_dtypes, D_layouts, marks;
  bool strided = false, misaligned = false, both = false, contiguous = false, z = false, bias = false,
       softplus = false, limit = false, inf_limit = false, init = false, no_final = false, fast = false,
       varlen = false, no_varlen = false, empty_seq = false, multi_batch = false, ragged = false, boundary = false,
       accurate = false;
  for (int64_t i = 0; i < 2000; ++i) {
    const ProblemConfig c = fuzz_case(5, i);
    headdims.insert(c.headdim), dstates.insert(c.dstate), chunks.insert(c.chunk_size);
    heads.insert(c.nheads), groups.insert(c.ngroups);
    dtypes.insert(static_cast<int>(c.dtype)), dt_dtypes.insert(static_cast<int>(c.dt_dtype));
    D_layouts.insert(static_cast<int>(c.D_layout));
    strided |= c.strided && !c.misaligned, misaligned |= c.misaligned && !c.strided;
    both |= c.strided && c.misaligned, contiguous |= !c.strided && !c.misaligned;
    z |= c.z, bias |= c.dt_bias, softplus |= c.dt_softplus;
    limit |= c.dt_min > 0.0f && std::isfinite(c.dt_max), inf_limit |= c.dt_min > 0.0f && std::isinf(c.dt_max);
    init |= c.initial_states, no_final |= !c.final_states, fast |= c.A_scale != 1.0f;
    accurate |= c.fp32_math == Fp32Math::kAccurate;
    multi_batch |= c.batch > 1;
    ragged |= c.seqlen % c.chunk_size != 0 && c.seqlen > c.chunk_size;
    boundary |= c.seqlen % c.chunk_size == 0;
    if (!c.seqlens.empty()) {
      marks.insert(c.cu_seqlens && !c.seq_idx ? 0 : c.cu_seqlens ? 1 : 2);
      varlen |= c.cu_seqlens && c.varlen_states, no_varlen |= c.cu_seqlens && !c.varlen_states;
      for (int64_t len : c.seqlens) empty_seq |= len == 0;
    }
  }
  EXPECT_EQ(headdims, (std::set<int64_t>{16, 32, 48, 64, 80, 128}));
  EXPECT_EQ(dstates.size(), 16u);
  EXPECT_EQ(chunks, (std::set<int64_t>{64, 128, 256}));
  EXPECT_EQ(heads, (std::set<int64_t>{1, 2, 3, 4, 6, 8}));
  EXPECT_EQ(groups, (std::set<int64_t>{1, 2, 3, 4, 6, 8}));
  EXPECT_EQ(dtypes.size(), 3u);
  EXPECT_EQ(dt_dtypes.size(), 3u);
  EXPECT_EQ(D_layouts.size(), 3u);
  EXPECT_EQ(marks, (std::set<int>{0, 1, 2}));  // cu_seqlens alone, both, seq_idx alone
  for (bool seen : {strided, misaligned, both, contiguous, z, bias, softplus, limit, inf_limit, init, no_final, fast,
                    varlen, no_varlen, empty_seq, multi_batch, ragged, boundary, accurate})
    EXPECT_TRUE(seen);
}

// The prefill's and the decode's cases: valid, and the command line printed for a failing one
// rebuilds exactly that case.
TEST(ProblemFlags, PrefillAndDecodeCasesRoundTripThroughTheCommandLine) {
  for (uint64_t seed : {0ull, 1ull, 18446744073709551615ull})
    for (int64_t i = 0; i < 400; ++i) {
      const testing::PrefillConfig p = fuzz_prefill_case(seed, i);
      EXPECT_EQ(prefill_config_from(Args::parse(kPrefill, prefill_flags(p))), p)
          << "seed " << seed << " case " << i << ": " << p.describe();
      const testing::DecodeConfig d = fuzz_decode_case(seed, i);
      EXPECT_EQ(decode_config_from(Args::parse(kDecode, decode_flags(d))), d)
          << "seed " << seed << " case " << i << ": " << d.describe();
    }
}

TEST(FuzzCases, PrefillAndDecodeCasesAreValidAndSmall) {
  for (int64_t i = 0; i < 300; ++i) {
    const testing::PrefillConfig p = fuzz_prefill_case(11, i);
    EXPECT_LE(p.tokens() * p.nheads * p.headdim * p.dstate, std::max(kFuzzBudget, p.nheads * p.headdim * p.dstate))
        << p.describe();
    testing::HostPrefillProblem prefill(p);
    EXPECT_NO_THROW(validate(prefill.params())) << p.describe();
    testing::HostDecodeProblem decode(fuzz_decode_case(11, i));
    EXPECT_NO_THROW(validate(decode.params())) << decode.config.describe();
  }
}

// The prefill's and the decode's sweeps reach the features and slot rules they draw (2000 cases).
TEST(FuzzCases, PrefillAndDecodeCoverTheirFeatures) {
  std::set<int> state_dtypes, decode_state_dtypes;
  std::set<int64_t> headdims, tokens;
  bool seq_idx = false, pads = false, all_cached = false, every = false, strided = false, misaligned = false,
       odd_cache = false, empty = false, no_indices = false, dst = false, pad_dsts = false, decode_pads = false,
       decode_strided = false, decode_misaligned = false;
  for (int64_t i = 0; i < 2000; ++i) {
    const testing::PrefillConfig p = fuzz_prefill_case(5, i);
    state_dtypes.insert(static_cast<int>(p.state_dtype)), headdims.insert(p.headdim);
    seq_idx |= p.seq_idx, pads |= p.pads > 0, all_cached |= !p.has_initial_state, every |= p.state_every > 0;
    strided |= p.strided, misaligned |= p.misaligned, odd_cache |= p.odd_cache;
    for (int64_t len : p.seqlens) empty |= len == 0;
    const testing::DecodeConfig d = fuzz_decode_case(5, i);
    decode_state_dtypes.insert(static_cast<int>(d.state_dtype)), tokens.insert(d.ntokens);
    no_indices |= !d.indices, dst |= d.dst_indices, pad_dsts |= d.pad_dsts > 0, decode_pads |= d.pads > 0;
    decode_strided |= d.strided, decode_misaligned |= d.misaligned;
  }
  EXPECT_EQ(state_dtypes.size(), 3u);
  EXPECT_EQ(decode_state_dtypes.size(), 3u);
  EXPECT_EQ(headdims, (std::set<int64_t>{16, 32, 48, 64, 80, 128}));
  EXPECT_EQ(tokens, (std::set<int64_t>{1, 2, 3, 4}));
  for (bool seen : {seq_idx, pads, all_cached, every, strided, misaligned, odd_cache, empty, no_indices, dst, pad_dsts,
                    decode_pads, decode_strided, decode_misaligned})
    EXPECT_TRUE(seen);
}

// The flags refuse what the API would refuse, naming the flag.
TEST(ProblemFlags, RefusalsNameTheFlag) {
  auto refused = [](const std::vector<std::string>& w, const std::string& start) {
    try {
      config_from(Args::parse(kRun, w));
      ADD_FAILURE() << "accepted: " << w[0];
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(start, 0), 0u) << e.what();
    }
  };
  refused({"--dt-limit", "inf,inf"}, "--dt-limit: dt_limit lower bound must be finite, got inf");
  refused({"--dt-limit", "0.5,0.1"}, "--dt-limit: dt_limit must satisfy lo <= hi, got (0.5, 0.1)");
  refused({"--dt-limit", "nan,1"}, "--dt-limit: dt_limit must not be NaN, got (nan, 1)");
  // Judged as typed, before narrowing to float: -1e-50's float is -0, which passed as >= 0.
  refused({"--dt-limit", "-1e-50,1"}, "--dt-limit: dt_limit lower bound must be >= 0, got -1e-50");
  refused({"--dt-limit", "1e39,inf"}, "--dt-limit: dt_limit lower bound must be finite in float32");
  refused({"--dt-limit", "1,x"}, "--dt-limit: expected LO,HI");
  // The whole word is the number, as for the integer flags (strtod skipped leading blanks).
  refused({"--dt-limit", " 0.1,1"}, "--dt-limit: expected LO,HI");
  refused({"--A-scale", " 8"}, "--A-scale: expected a finite number > 0");
  refused({"--A-scale", "1e-50"}, "--A-scale: expected a finite number > 0");
  refused({"--A-scale", "inf"}, "--A-scale: expected a finite number > 0");
  refused({"--fp32-math", "fp64"}, "--fp32-math: expected one of tf32, accurate, got 'fp64'");
  refused({"--no-cu-seqlens", "--seqlens", "3,4"}, "--no-cu-seqlens: needs --seqlens and --seq-idx");
  refused({"--seqlens", "0,0"}, "--seqlens: the lengths sum to 0");
  refused({"--batch", "1099511627776", "--seqlen", "1099511627776"},
          "problem too large (--batch 1099511627776 --seqlen 1099511627776): batch * seqlen * nheads * headdim");
  refused({"--heads", "1048576", "--headdim", "128", "--dstate", "256", "--seqlen", "1", "--batch", "1099511627776"},
          "problem too large (--batch 1099511627776 --seqlen 1 --heads 1048576 --headdim 128 --dstate 256)");
}

// dt_limit as the API takes it: an upper bound past float's range is no bound (it was refused as not
// a number), a tiny positive lower bound is 0.
TEST(ProblemFlags, DtLimitAsTheApiTakesIt) {
  const ProblemConfig c = config_from(Args::parse(kRun, {"--dt-limit", "0.001,1e39"}));
  EXPECT_EQ(c.dt_min, 0.001f);
  EXPECT_TRUE(std::isinf(c.dt_max) && c.dt_max > 0);
  EXPECT_EQ(config_from(Args::parse(kRun, {"--dt-limit", "1e-50,1"})).dt_min, 0.0f);
}

// --segments reaches the backward's walks too, so run --backward refuses it on a backend without
// them (it used to ignore the flag there).
TEST(ProblemFlags, BackwardRunTakesSegments) {
  const Args args = Args::parse(kRun, {"--backward", "--impl", "cpu", "--segments", "2", "--batch", "1", "--seqlen", "64",
                                       "--heads", "2"});
  try {
    run_backward_command(args);
    ADD_FAILURE() << "run --backward --impl cpu --segments 2 ran";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--segments: cuts the CUDA walks, but the backend is cpu", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace mamba2ssd::cli
