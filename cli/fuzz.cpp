// mamba2ssd fuzz: a randomized sweep of small problems, each checked in full against the fp64 oracle
// with the one tolerance table. A failing case is printed as the `mamba2ssd run` (`prefill`,
// `decode`) command line that reproduces it; the last line counts the runs: "N passed, M failed".
// --op picks what a case runs: the forward (default), the backward (forward + backward, every
// gradient), the packed prefill or the decode step.
//
// What a case draws (uniformly unless said): head dim 16, 32, 48, 64, 80 or 128; state size 16..256
// step 16; heads 1, 2, 3, 4, 6 or 8 and a divisor of them as groups; chunk 64, 128 or 256; dtype
// fp32, fp16 or bf16, and dt's dtype (fp32 half the time); layouts contiguous, strided, misaligned
// (rows at odd element offsets) or both; z, dt_bias, softplus (each half the time), D none, per
// head or per (head, dim), dt_limit (30%: a lower bound 0, 1e-3 or 1e-2 and an upper 0.05, 0.2 or
// inf), initial states (40%), final states (75%), fast decays (A times 8, 10%), fp32's accurate
// mode (30% of fp32 cases); and either packed sequences (30%: batch 1, 1..6 sequences of ragged
// lengths, some empty, marked by cu_seqlens, seq_idx or both, varlen states with cu_seqlens 75% of
// the time) or 1..3 batch rows. Lengths are ragged (any length up to the budget) or, half the time,
// a chunk boundary +-1. The backward takes the forward's cases (on the CUDA backend without varlen
// states, whose cotangent it refuses by name).
//
// A prefill case: the heads, chunk and features as above, the cache's dtype, 1..8 requests (some
// empty), seq_idx (30%), pad requests (20%), every request reading its slot (30%) or has_initial_state
// drawn, intermediate states every 1 or 2 chunks (30%), strided or misaligned inputs, odd cache rows
// (15%). A decode case: 1..8 requests of 1 (60%) or 2..4 tokens, the cache's dtype, state_batch_indices
// (85%, pads among them 25%), a destination slot per token (30%, pads among them 25%), strided views
// or misaligned cache rows (20% each).
#include "fuzz.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "api/internal.h"  // the knobs of the tests: forced segments, decode kernel, backward form
#include "commands.h"
#include "common/host_dtype.h"
#include "execute.h"
#include "problem_flags.h"
#include "report.h"
#include "testing/forced.h"
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

// 1..max_requests requests of ragged lengths (15% empty, not all) within max_tokens in all.
std::vector<int64_t> draw_requests(Draw& d, int64_t max_requests, int64_t max_tokens, int64_t chunk) {
  const int64_t S = d.range(1, max_requests);
  std::vector<int64_t> lens;
  int64_t total = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t room = max_tokens - total;
    const int64_t len = room <= 0 || d.chance(0.15) ? 0 : draw_length(d, std::max<int64_t>(room / (S - s), 1), chunk);
    lens.push_back(len);
    total += len;
  }
  if (total == 0) lens[d.range(0, S - 1)] = 1;
  return lens;
}

// Head dim, state size, heads and a divisor of them as groups.
template <typename Config>
void draw_heads(Draw& d, Config& c) {
  c.headdim = d.pick<int64_t>({16, 32, 48, 64, 80, 128});
  c.dstate = 16 * d.range(1, 16);
  c.nheads = d.pick<int64_t>({1, 2, 3, 4, 6, 8});
  std::vector<int64_t> divisors;
  for (int64_t g = 1; g <= c.nheads; ++g)
    if (c.nheads % g == 0) divisors.push_back(g);
  c.ngroups = divisors[d.range(0, static_cast<int64_t>(divisors.size()) - 1)];
}

// z, D, dt_bias, softplus and dt_limit, as every call takes them.
template <typename Config>
void draw_features(Draw& d, Config& c) {
  c.z = d.chance(0.5);
  c.D_layout = d.pick({DLayout::kNone, DLayout::kPerHead, DLayout::kPerHeadDim});
  c.dt_bias = d.chance(0.5);
  c.dt_softplus = d.chance(0.5);
  if (d.chance(0.3)) {
    c.dt_min = d.pick({0.0f, 0.001f, 0.01f});
    c.dt_max = d.pick({0.05f, 0.2f, std::numeric_limits<float>::infinity()});
  }
}

// Contiguous (40%), strided (20%), misaligned (20%: rows at odd element offsets) or both (20%).
template <typename Config>
void draw_layout(Draw& d, Config& c) {
  const int layout = static_cast<int>(d.range(0, 9));
  c.strided = layout == 4 || layout == 5 || layout == 8 || layout == 9;
  c.misaligned = layout >= 6;
}

DType draw_dtype(Draw& d) { return d.pick({DType::kF32, DType::kF16, DType::kBF16}); }
DType draw_dt_dtype(Draw& d) { return d.chance(0.5) ? DType::kF32 : d.pick({DType::kF16, DType::kBF16}); }

// Tokens a problem of these heads may have within the budget (at least one).
template <typename Config>
int64_t max_tokens(const Config& c) {
  return std::clamp<int64_t>(kFuzzBudget / (c.nheads * c.headdim * c.dstate), 1, 700);
}

}  // namespace

testing::ProblemConfig fuzz_case(uint64_t seed, int64_t index) {
  Draw d(mix(mix(seed) ^ static_cast<uint64_t>(index)));
  testing::ProblemConfig c;
  draw_heads(d, c);
  c.chunk_size = d.pick<int64_t>({64, 128, 256});
  c.dtype = draw_dtype(d);
  c.dt_dtype = draw_dt_dtype(d);

  draw_layout(d, c);
  draw_features(d, c);
  c.initial_states = d.chance(0.4);
  c.final_states = d.chance(0.75);
  c.A_scale = d.chance(0.1) ? 8.0f : 1.0f;

  if (d.chance(0.3)) {  // packed sequences
    c.batch = 1;
    c.seqlens = draw_requests(d, 6, max_tokens(c), c.chunk_size);
    c.seqlen = std::accumulate(c.seqlens.begin(), c.seqlens.end(), int64_t{0});
    const int marks = static_cast<int>(d.range(0, 2));  // 0 cu_seqlens, 1 both, 2 seq_idx alone
    c.seq_idx = marks >= 1;
    c.cu_seqlens = marks <= 1;
    c.varlen_states = c.cu_seqlens && d.chance(0.75);
  } else {
    c.batch = d.range(1, 3);
    c.seqlen = draw_length(d, std::max<int64_t>(max_tokens(c) / c.batch, 1), c.chunk_size);
  }
  c.seed = d.bits();
  if (c.dtype == DType::kF32 && d.chance(0.3)) c.fp32_math = Fp32Math::kAccurate;  // 3xTF32 on the GPU
  return c;
}

testing::PrefillConfig fuzz_prefill_case(uint64_t seed, int64_t index) {
  Draw d(mix(mix(seed ^ 0x70726566696c6cull) ^ static_cast<uint64_t>(index)));  // ("prefill")
  testing::PrefillConfig c;
  draw_heads(d, c);
  c.chunk_size = d.pick<int64_t>({64, 128, 256});
  c.dtype = draw_dtype(d);
  c.dt_dtype = draw_dt_dtype(d);
  c.state_dtype = draw_dtype(d);
  draw_features(d, c);
  c.seqlens = draw_requests(d, 8, max_tokens(c), c.chunk_size);
  c.seq_idx = d.chance(0.3);
  c.pads = d.chance(0.2) ? d.range(1, c.requests()) : 0;
  c.has_initial_state = d.chance(0.7);  // drawn per request; else every request reads its slot
  c.state_every = d.chance(0.3) ? c.chunk_size * d.range(1, 2) : 0;
  draw_layout(d, c);
  c.odd_cache = d.chance(0.15);
  c.seed = d.bits();
  return c;
}

testing::DecodeConfig fuzz_decode_case(uint64_t seed, int64_t index) {
  Draw d(mix(mix(seed ^ 0x6465636f6465ull) ^ static_cast<uint64_t>(index)));  // ("decode")
  testing::DecodeConfig c;
  draw_heads(d, c);
  c.batch = d.range(1, 8);
  c.ntokens = d.chance(0.6) ? 1 : d.range(2, 4);
  c.dtype = draw_dtype(d);
  c.dt_dtype = draw_dt_dtype(d);
  c.state_dtype = draw_dtype(d);
  draw_features(d, c);
  c.indices = d.chance(0.85);
  c.dst_indices = d.chance(0.3);
  c.pads = c.indices && d.chance(0.25) ? d.range(1, c.batch) : 0;
  c.pad_dsts = c.dst_indices && d.chance(0.25) ? d.range(1, c.batch * c.ntokens) : 0;
  c.strided = d.chance(0.2);
  c.misaligned = d.chance(0.2);
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
    if (c.nonfinite)
      s += fmt(" nonfinite %lld of %lld", static_cast<long long>(c.nonfinite), static_cast<long long>(c.count));
    if (!(c.rel_l2 <= c.tolerance)) s += " rel L2 " + fmt_sci(c.rel_l2) + " > tol " + fmt_sci(c.tolerance);
  }
  return s;
}

// Two accounts of what failed, joined by "; " (either may be empty: nothing failed there).
std::string also(const std::string& bad, const std::string& more) {
  return more.empty() ? bad : bad.empty() ? more : bad + "; " + more;
}

// The command that reproduces one run: "mamba2ssd <command> --impl I <flags> <extra>".
std::string command_line(const char* command, Backend backend, const std::vector<std::string>& flags,
                         const std::string& extra) {
  std::string s = std::string("mamba2ssd ") + command + " --impl " + to_string(backend);
  for (const std::string& w : flags) s += " " + w;
  return s + extra;
}

// Every byte 0xff: NaN in fp32, fp16 and bf16 alike (the hidden --testing-perturb flag).
void spoil(std::vector<uint8_t>& buffer) { std::fill(buffer.begin(), buffer.end(), uint8_t{0xff}); }

// The sweep's counts, and how a failed run is printed: its case, where it ran, what failed, the
// problem's line and the command that reproduces it.
struct Sweep {
  Backend backend = Backend::kCpu;
  int threads = 0;
  int64_t spoiled = -1;  // --testing-perturb: the case whose output is spoiled
  int64_t passed = 0, failed = 0, skipped = 0;

  void fail(int64_t index, const std::string& where, const std::string& what, const std::string& problem,
            const std::string& repro) {
    ++failed;
    std::printf("FAIL  case %lld%s: %s\n      problem %s\n      %s\n", static_cast<long long>(index), where.c_str(),
                what.c_str(), problem.c_str(), repro.c_str());
    std::fflush(stdout);
  }
  // One run: `run` returns what failed ("" if nothing); an exception is a failure too.
  template <typename Run>
  void attempt(int64_t index, const std::string& where, const std::string& problem, const std::string& repro,
               Run&& run) {
    std::string bad;
    try {
      bad = run();
    } catch (const std::exception& e) {
      bad = std::string("error: ") + e.what();
    }
    if (bad.empty()) ++passed;
    else fail(index, where, bad, problem, repro);
  }
};

// The forward: on every CUDA path that takes the case (or the one --path names), or the host backend.
void fuzz_forward(Sweep& sw, CudaPath path, uint64_t seed, int64_t i) {
  testing::ProblemConfig config = fuzz_case(seed, i);
  try {
    testing::HostProblem problem(config);
    const reference::Result want = testing::oracle(problem);
    std::vector<CudaPath> paths = {CudaPath::kAuto};
    if (sw.backend == Backend::kCuda) {
      const std::vector<CudaPath> takers = gpu::paths_taking(problem);
      if (path != CudaPath::kAuto) {
        if (std::find(takers.begin(), takers.end(), path) == takers.end()) {
          ++sw.skipped;  // the path asked for refuses this case
          return;
        }
        paths = {path};
      } else {
        paths = takers;
        if (paths.empty())
          return sw.fail(i, "", "no CUDA path takes the case", config.describe(), repro_command(config, sw.backend));
      }
    }
    for (CudaPath p : paths) {
      problem.config.cuda_path = p;
      const std::string where = p != CudaPath::kAuto ? std::string(" path ") + to_string(p) : "";
      sw.attempt(i, where, problem.config.describe(), repro_command(problem.config, sw.backend), [&] {
        problem.poison_outputs();
        const Execution e = execute(problem, sw.backend, 1, 0, sw.threads);  // one untimed run
        Buffers out = e.outputs(problem);
        if (i == sw.spoiled)  // the first element of y
          host::store(out.at("y").data(), 0, problem.config.dtype, std::numeric_limits<float>::quiet_NaN());
        return verdict(testing::compare_with(problem, out, want));
      });
    }
  } catch (const std::exception& ex) {
    sw.fail(i, "", std::string("error: ") + ex.what(), config.describe(), repro_command(config, sw.backend));
  }
}

// The backward (forward + backward, every gradient against the oracle, nothing written outside the
// gradients' views). On the CUDA backend three runs: the kernels the call picks, the portable ones,
// and the picked ones with 2-4 segments forced on the walks; the states saved by the forward in
// about half the cases. The CUDA backward refuses dvarlen_states (by name; tested elsewhere): its
// cases go without varlen states.
struct BackwardRun {
  bool portable = false;
  int64_t segments = 0;  // forced on the forward's and the backward's walks (0: the plan's)
  std::string where() const {
    return portable ? " portable" : segments ? fmt(" %lld segments", static_cast<long long>(segments)) : "";
  }
  std::string flags() const {
    return portable ? " --portable" : segments ? fmt(" --segments %lld", static_cast<long long>(segments)) : "";
  }
};

std::string backward_run(const Sweep& sw, testing::BackwardProblem& problem, const reference::Grads64& want,
                         const BackwardRun& r, bool spoiled) {
  const testing::Forced portable(detail::set_portable_backward_for_testing, r.portable, false);
  const testing::Forced segments(detail::set_fused_segments_for_testing, r.segments, int64_t{0});
  const BackwardExecution e = execute_backward(problem, sw.backend, 1, 0, sw.threads);  // one untimed run
  Buffers grads = e.gradients(problem);
  if (spoiled) spoil(grads.at(problem.gradients.at("dx").buffer));
  const long long outside = testing::written_outside_gradients(problem, grads);
  return also(verdict(testing::compare_gradients(problem, grads, want)),
              outside ? fmt("%lld elements written outside the gradients", outside) : "");
}

void fuzz_backward(Sweep& sw, uint64_t seed, int64_t i) {
  testing::ProblemConfig config = fuzz_case(seed, i);
  const bool cuda = sw.backend == Backend::kCuda;
  if (cuda) config.varlen_states = false;
  Draw d(mix(seed ^ mix(static_cast<uint64_t>(i))));
  const bool save = cuda && d.chance(0.5);
  // Gradients laid out as run --backward lays them out, so that the command line reproduces the run.
  const testing::GradLayout layout =
      config.strided || config.misaligned ? testing::GradLayout::kPadded : testing::GradLayout::kContiguous;
  const std::string command =
      command_line("run", sw.backend, run_flags(config), " --backward") + (save ? " --save-states" : "");
  try {
    testing::BackwardProblem problem(config, layout);
    if (save) problem.save_states();
    const reference::Grads64 want = testing::backward_oracle(problem);
    std::vector<BackwardRun> runs = {BackwardRun{}};
    if (cuda) runs.push_back({true, 0}), runs.push_back({false, d.range(2, 4)});
    for (const BackwardRun& r : runs)
      sw.attempt(i, r.where(), config.describe(), command + r.flags() + " --check-all --repeats 1",
                 [&] { return backward_run(sw, problem, want, r, i == sw.spoiled); });
  } catch (const std::exception& ex) {
    sw.fail(i, "", std::string("error: ") + ex.what(), config.describe(), command + " --check-all --repeats 1");
  }
}

// The packed prefill: y, the stored states and the untouched slots against the oracle (and on the
// GPU the guards around the cache) on the three-kernel path and, where it takes the call, the hopper
// path with its own segments and with segments forced (cuts inside requests, or whole requests).
struct PrefillRun {
  CudaPath path = CudaPath::kAuto;  // auto: a host backend
  int64_t segments = 0, request_groups = 0;  // forced (0: the plan's)
  std::string where() const {  // " path hopper, 3 segments"
    std::string s = path != CudaPath::kAuto ? std::string(" path ") + to_string(path) : "";
    if (segments) s += fmt(", %lld segments", static_cast<long long>(segments));
    if (request_groups) s += fmt(", %lld request groups", static_cast<long long>(request_groups));
    return s;
  }
  std::string flags() const {  // " --path hopper --segments 3"
    std::string s = path != CudaPath::kAuto ? std::string(" --path ") + to_string(path) : "";
    if (segments) s += fmt(" --segments %lld", static_cast<long long>(segments));
    if (request_groups) s += fmt(" --request-groups %lld", static_cast<long long>(request_groups));
    return s;
  }
};

std::string prefill_run(const Sweep& sw, testing::HostPrefillProblem& problem, const testing::PrefillOracle& want,
                        const PrefillRun& r, bool spoiled) {
  std::string guards;
  if (sw.backend == Backend::kCuda) {
    const testing::Forced segments(detail::set_fused_segments_for_testing, r.segments, int64_t{0});
    const testing::Forced groups(detail::set_prefill_request_groups_for_testing, r.request_groups, int64_t{0});
    guards = gpu::execute_prefill(problem, 0, 0, r.path).guard_damage;  // y and the cache downloaded
  } else {
    problem.reset();  // y poisoned, the cache as drawn
    const PrefillParams p = problem.params();
    if (sw.backend == Backend::kReference) prefill_reference(p);
    else prefill_cpu(p, sw.threads);
  }
  if (spoiled) spoil(problem.fwd.buffers.at("y"));
  return also(verdict(testing::compare_prefill(problem, want)), guards.empty() ? "" : "guards: " + guards);
}

void fuzz_prefill(Sweep& sw, CudaPath path, uint64_t seed, int64_t i) {
  const testing::PrefillConfig config = fuzz_prefill_case(seed, i);
  const std::string command = command_line("prefill", sw.backend, prefill_flags(config), "");
  try {
    testing::HostPrefillProblem problem(config);
    const testing::PrefillOracle want = testing::prefill_oracle(problem);
    std::vector<PrefillRun> runs = {PrefillRun{}};
    if (sw.backend == Backend::kCuda) {
      runs.clear();
      if (path != CudaPath::kHopper) runs.push_back({CudaPath::kThreeKernel, 0, 0});
      if (path != CudaPath::kThreeKernel && gpu::hopper_prefill_refusal(problem).empty()) {
        Draw d(mix(seed ^ mix(static_cast<uint64_t>(i) + 1)));
        runs.push_back({CudaPath::kHopper, 0, 0});
        runs.push_back({CudaPath::kHopper, d.range(2, 4), 0});
        runs.push_back({CudaPath::kHopper, 0, d.range(1, 3)});
      }
      if (runs.empty()) ++sw.skipped;  // --path hopper, which refuses this case
    }
    for (const PrefillRun& r : runs)
      sw.attempt(i, r.where(), config.describe(), command + r.flags() + " --repeats 1",
                 [&] { return prefill_run(sw, problem, want, r, i == sw.spoiled); });
  } catch (const std::exception& ex) {
    sw.fail(i, "", std::string("error: ") + ex.what(), config.describe(), command + " --repeats 1");
  }
}

// The decode step: out, the stored states and the untouched slots against the oracle (and on the GPU
// the guards around the cache and out), on both CUDA kernels (1 rows, 2 stream; 0 a host backend).
std::string decode_run(const Sweep& sw, testing::HostDecodeProblem& problem, const reference::DecodeResult& want,
                       int kernel, bool spoiled) {
  Buffers results;
  std::string guards;
  if (sw.backend == Backend::kCuda) {
    const testing::Forced forced([](int k) { detail::set_decode_kernel_for_testing(k); }, kernel, 0);
    gpu::DecodeExecution e = gpu::execute_decode(problem, 0, 0, 0.0);  // one run from the cache as drawn
    results = std::move(e.results), guards = e.guard_damage;
  } else {
    problem.reset_state();
    problem.poison_outputs();
    const DecodeParams p = problem.params();
    if (sw.backend == Backend::kReference) decode_reference(p);
    else decode_cpu(p, sw.threads);
    results = {{"out", problem.buffers.at("out")}, {"state", problem.buffers.at("state")}};
  }
  if (spoiled) spoil(results.at("out"));
  return also(verdict(testing::compare_decode(problem, results, want)), guards.empty() ? "" : "guards: " + guards);
}

void fuzz_decode(Sweep& sw, uint64_t seed, int64_t i) {
  const testing::DecodeConfig config = fuzz_decode_case(seed, i);
  const std::string command = command_line("decode", sw.backend, decode_flags(config), "");
  try {
    testing::HostDecodeProblem problem(config);
    const reference::DecodeResult want = testing::decode_oracle(problem);
    for (int kernel : sw.backend == Backend::kCuda ? std::vector<int>{1, 2} : std::vector<int>{0}) {
      const std::string name = kernel == 1 ? "rows" : kernel == 2 ? "stream" : "";
      const std::string repro = command + (name.empty() ? "" : " --kernel " + name) + " --check-all --repeats 1";
      sw.attempt(i, name.empty() ? "" : " kernel " + name, config.describe(), repro,
                 [&] { return decode_run(sw, problem, want, kernel, i == sw.spoiled); });
    }
  } catch (const std::exception& ex) {
    sw.fail(i, "", std::string("error: ") + ex.what(), config.describe(), command + " --check-all --repeats 1");
  }
}

}  // namespace

int fuzz_command(const Args& args) {
  const std::string op = args.get_word("--op", "forward", {"forward", "backward", "prefill", "decode"});
  if (args.has("--path") && (op == "backward" || op == "decode"))
    bad_flag("--path", "picks the forward's and the prefill's CUDA paths, not the " + op + "'s; leave it out");
  Sweep sw;
  sw.backend = impl_flag(args);
  const CudaPath path = path_flag(args, sw.backend);
  sw.threads = threads_flag(args);
  const int64_t cases = args.get_int("--cases", 100, 1, 100000000);
  const uint64_t seed = args.get_u64("--seed", 0);
  sw.spoiled = args.get_int("--testing-perturb", -1, 0, cases - 1);
  if (op == "prefill" && path != CudaPath::kAuto && path != CudaPath::kHopper && path != CudaPath::kThreeKernel)
    bad_flag("--path", std::string("the prefill runs on the hopper or the three-kernel path, not ") + to_string(path));

  const bool cuda = sw.backend == Backend::kCuda;
  const std::string where = !cuda ? ""
                            : path != CudaPath::kAuto ? std::string(", path ") + to_string(path)
                            : op == "forward"  ? ", every CUDA path that takes each case"
                            : op == "backward" ? ", both kernel forms"
                            : op == "prefill"  ? ", the three-kernel and hopper paths"
                                               : ", both kernels";
  std::printf("mamba2ssd fuzz: %lld %s cases from seed %llu against the fp64 oracle, impl %s%s\n",
              static_cast<long long>(cases), op.c_str(), static_cast<unsigned long long>(seed), to_string(sw.backend),
              where.c_str());
  std::fflush(stdout);
  // --seconds: no case starts after the budget is spent (the counts then cover the cases that ran).
  const double budget = args.get_positive_float("--seconds", std::numeric_limits<float>::infinity());
  const auto t0 = std::chrono::steady_clock::now();
  int64_t ran = 0;
  for (int64_t i = 0; i < cases; ++i, ++ran) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > budget) break;
    if (op == "forward") fuzz_forward(sw, path, seed, i);
    else if (op == "backward") fuzz_backward(sw, seed, i);
    else if (op == "prefill") fuzz_prefill(sw, path, seed, i);
    else fuzz_decode(sw, seed, i);
  }
  if (ran < cases)
    std::printf("(stopped after %s s, --seconds: %lld of %lld cases ran)\n", fmt_rate(budget).c_str(),
                static_cast<long long>(ran), static_cast<long long>(cases));
  if (sw.skipped)
    std::printf("(%lld cases skipped: path %s refuses them)\n", static_cast<long long>(sw.skipped), to_string(path));
  std::printf("%lld passed, %lld failed\n", static_cast<long long>(sw.passed), static_cast<long long>(sw.failed));
  return sw.failed == 0 ? 0 : 1;
}

}  // namespace mamba2ssd::cli
