// mamba2ssd fuzz: a randomized sweep of small problems, each checked in full against the fp64 oracle
// with the one tolerance table. A failing case is printed as the `mamba2ssd run` command line that
// reproduces it; the last line counts the runs: "N passed, M failed".
//
// What a case draws (uniformly unless said): head dim 32, 64 or 128; state size 16..256 step 16;
// heads 1, 2, 3, 4, 6 or 8 and a divisor of them as groups; chunk 64, 128 or 256; dtype fp32, fp16
// or bf16, and dt's dtype (fp32 half the time); layouts contiguous, strided, misaligned (rows at odd
// element offsets) or both; z, dt_bias, softplus (each half the time), D none, per head or per
// (head, dim), dt_limit (30%: a lower bound 0, 1e-3 or 1e-2 and an upper 0.05, 0.2 or inf), initial
// states (40%), final states (75%), fast decays (A times 8, 10%); and either packed sequences (30%:
// batch 1, 1..6 sequences of ragged lengths, some empty, marked by cu_seqlens, seq_idx or both,
// varlen states with cu_seqlens 75% of the time) or 1..3 batch rows. Lengths are ragged (any length
// up to the budget) or, half the time, a chunk boundary +-1.
#include "fuzz.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "common/host_dtype.h"
#include "execute.h"
#include "problem_flags.h"
#include "report.h"
#include "testing/tolerance.h"

namespace mamba2ssd::cli {
namespace {

// splitmix64: decorrelates neighbouring seeds and indices.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  int64_t range(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p; }
  template <typename T>
  T pick(std::initializer_list<T> options) {
    return options.begin()[range(0, static_cast<int64_t>(options.size()) - 1)];
  }
  uint64_t bits() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

// A length in [1, max_len]: ragged, or half the time next to a chunk boundary.
int64_t draw_length(Draw& d, int64_t max_len, int64_t chunk) {
  if (max_len <= 1) return 1;
  if (d.chance(0.5)) return d.range(1, max_len);
  const int64_t len = d.range(1, 3) * chunk + d.range(-1, 1);
  return std::clamp<int64_t>(len, 1, max_len);
}

}  // namespace

testing::ProblemConfig fuzz_case(uint64_t seed, int64_t index) {
  Draw d(mix(mix(seed) ^ static_cast<uint64_t>(index)));
  testing::ProblemConfig c;
  c.headdim = d.pick<int64_t>({32, 64, 128});
  c.dstate = 16 * d.range(1, 16);
  c.nheads = d.pick<int64_t>({1, 2, 3, 4, 6, 8});
  std::vector<int64_t> divisors;
  for (int64_t g = 1; g <= c.nheads; ++g)
    if (c.nheads % g == 0) divisors.push_back(g);
  c.ngroups = divisors[d.range(0, static_cast<int64_t>(divisors.size()) - 1)];
  c.chunk_size = d.pick<int64_t>({64, 128, 256});
  c.dtype = d.pick({DType::kF32, DType::kF16, DType::kBF16});
  c.dt_dtype = d.chance(0.5) ? DType::kF32 : d.pick({DType::kF16, DType::kBF16});

  const int layout = static_cast<int>(d.range(0, 9));
  c.strided = layout == 4 || layout == 5 || layout == 8 || layout == 9;
  c.misaligned = layout >= 6;
  c.z = d.chance(0.5);
  c.D_layout = d.pick({DLayout::kNone, DLayout::kPerHead, DLayout::kPerHeadDim});
  c.dt_bias = d.chance(0.5);
  c.dt_softplus = d.chance(0.5);
  if (d.chance(0.3)) {
    c.dt_min = d.pick({0.0f, 0.001f, 0.01f});
    c.dt_max = d.pick({0.05f, 0.2f, std::numeric_limits<float>::infinity()});
  }
  c.initial_states = d.chance(0.4);
  c.final_states = d.chance(0.75);
  c.A_scale = d.chance(0.1) ? 8.0f : 1.0f;

  // Tokens within the budget (at least one per row).
  const int64_t per_token = c.nheads * c.headdim * c.dstate;
  const int64_t max_tokens = std::clamp<int64_t>(kFuzzBudget / per_token, 1, 700);
  if (d.chance(0.3)) {  // packed sequences
    c.batch = 1;
    const int64_t S = d.range(1, 6);
    int64_t total = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t room = max_tokens - total;
      const int64_t len = room <= 0 || d.chance(0.15) ? 0 : draw_length(d, std::max<int64_t>(room / (S - s), 1), c.chunk_size);
      c.seqlens.push_back(len);
      total += len;
    }
    if (total == 0) c.seqlens[d.range(0, S - 1)] = total = 1;
    c.seqlen = total;
    const int marks = static_cast<int>(d.range(0, 2));  // 0 cu_seqlens, 1 both, 2 seq_idx alone
    c.seq_idx = marks >= 1;
    c.cu_seqlens = marks <= 1;
    c.varlen_states = c.cu_seqlens && d.chance(0.75);
  } else {
    c.batch = d.range(1, 3);
    c.seqlen = draw_length(d, std::max<int64_t>(max_tokens / c.batch, 1), c.chunk_size);
  }
  c.seed = d.bits();
  return c;
}

namespace {

// One case on one path: what failed, as one line ("" if it passed).
std::string verdict(const std::vector<testing::Comparison>& cmps) {
  std::string s;
  for (const testing::Comparison& c : cmps) {
    if (c.pass()) continue;
    s += (s.empty() ? "" : "; ") + c.name;
    if (c.nonfinite) s += fmt(" nonfinite %lld of %lld", static_cast<long long>(c.nonfinite), static_cast<long long>(c.count));
    if (!(c.rel_l2 <= c.tolerance)) s += " rel L2 " + fmt_sci(c.rel_l2) + " > tol " + fmt_sci(c.tolerance);
  }
  return s;
}

// Spoils the first element of y (the hidden --testing-perturb flag): the check must then fail.
void perturb(Buffers& out, const testing::ProblemConfig& c) {
  host::store(out.at("y").data(), 0, c.dtype, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace

int fuzz_command(const Args& args) {
  const Backend backend = impl_flag(args);
  const CudaPath path = path_flag(args, backend);
  const int threads = threads_flag(args);
  const int64_t cases = args.get_int("--cases", 100, 1, 100000000);
  const uint64_t seed = args.get_u64("--seed", 0);
  const int64_t spoiled = args.get_int("--testing-perturb", -1, 0, cases - 1);

  std::printf("mamba2ssd fuzz: %lld cases from seed %llu against the fp64 oracle, impl %s%s\n",
              static_cast<long long>(cases), static_cast<unsigned long long>(seed), to_string(backend),
              backend != Backend::kCuda ? ""
              : path == CudaPath::kAuto ? ", every CUDA path that takes each case"
                                        : (std::string(", path ") + to_string(path)).c_str());
  std::fflush(stdout);
  int64_t passed = 0, failed = 0, skipped = 0;
  for (int64_t i = 0; i < cases; ++i) {
    testing::ProblemConfig config = fuzz_case(seed, i);
    auto report = [&](const testing::ProblemConfig& c, const std::string& what) {
      ++failed;
      std::printf("FAIL  case %lld%s: %s\n      problem %s\n      %s\n", static_cast<long long>(i),
                  c.cuda_path != CudaPath::kAuto ? (std::string(" path ") + to_string(c.cuda_path)).c_str() : "",
                  what.c_str(), c.describe().c_str(), repro_command(c, backend).c_str());
      std::fflush(stdout);
    };
    try {
      testing::HostProblem problem(config);
      const reference::Result want = testing::oracle(problem);
      std::vector<CudaPath> paths = {CudaPath::kAuto};
      if (backend == Backend::kCuda) {
        const std::vector<CudaPath> takers = gpu::paths_taking(problem);
        if (path != CudaPath::kAuto) {
          paths = {path};
          if (std::find(takers.begin(), takers.end(), path) == takers.end()) {
            ++skipped;  // the path asked for refuses this case
            continue;
          }
        } else {
          paths = takers;
          if (paths.empty()) {
            report(config, "no CUDA path takes the case");
            continue;
          }
        }
      }
      for (CudaPath p : paths) {
        problem.config.cuda_path = p;
        problem.poison_outputs();
        try {
          const Execution e = execute(problem, backend, 1, 0, threads);  // one untimed run
          Buffers out = e.outputs(problem);
          if (i == spoiled) perturb(out, problem.config);
          const std::string bad = verdict(testing::compare_with(problem, out, want));
          if (bad.empty()) ++passed;
          else report(problem.config, bad);
        } catch (const std::exception& ex) {
          report(problem.config, std::string("error: ") + ex.what());
        }
      }
    } catch (const std::exception& ex) {
      report(config, std::string("error: ") + ex.what());
    }
  }
  if (skipped) std::printf("(%lld cases skipped: path %s refuses them)\n", static_cast<long long>(skipped), to_string(path));
  std::printf("%lld passed, %lld failed\n", static_cast<long long>(passed), static_cast<long long>(failed));
  return failed == 0 ? 0 : 1;
}

}  // namespace mamba2ssd::cli
