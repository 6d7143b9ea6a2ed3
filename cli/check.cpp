// mamba2ssd check: a fixed sweep of small problems covering every feature, dtype, head dim, state
// size, chunk, group count, ragged length and packed sequences, each compared with the fp64 oracle,
// forward and (unless --no-backward) backward; then the decode step's test matrix against its oracle;
// then the packed prefill's (with --impl cuda: prefill_cuda, guards checked); then the consistency
// rules (prefill whole, in pieces, ended by decode steps; default and exact mode).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "commands.h"
#include "execute.h"
#include "report.h"
#include "testing/consistency.h"
#include "testing/decode_problem.h"
#include "testing/prefill_problem.h"

namespace mamba2ssd::cli {
namespace {

// The worst of the comparisons `keep` selects, or null: a non-finite one before any finite one (a
// NaN never hides behind a larger finite error), else the largest score.
template <typename Keep, typename Score>
const testing::Comparison* worst_of(const std::vector<testing::Comparison>& cmps, Keep keep, Score score) {
  const testing::Comparison* worst = nullptr;
  for (const auto& c : cmps) {
    if (!keep(c)) continue;
    const bool worse = !worst || ((c.nonfinite > 0) != (worst->nonfinite > 0) ? c.nonfinite > 0
                                                                              : score(c) > score(*worst));
    if (worse) worst = &c;
  }
  return worst;
}

using testing::ProblemConfig;

// The sweep. Small enough that the whole list runs in seconds on the oracle itself.
std::vector<ProblemConfig> sweep(uint64_t seed) {
  const std::vector<std::function<void(ProblemConfig&)>> edits = {
      [](ProblemConfig& c) { c.seqlen = 256; },                                     // aligned to the chunk
      [](ProblemConfig&) {},                                                        // ragged: 300 = 4*64 + 44
      [](ProblemConfig& c) { c.dtype = DType::kF32; },
      [](ProblemConfig& c) { c.dtype = DType::kF16; },
      [](ProblemConfig& c) { c.headdim = 32; },
      [](ProblemConfig& c) { c.headdim = 128; },
      [](ProblemConfig& c) { c.headdim = 80, c.z = true; },                          // Nemotron-H's
      [](ProblemConfig& c) { c.dstate = 16; },
      [](ProblemConfig& c) { c.dstate = 48, c.nheads = 2; },
      [](ProblemConfig& c) { c.dstate = 128; },
      [](ProblemConfig& c) { c.dstate = 256, c.batch = 1, c.nheads = 2, c.seqlen = 200; },
      [](ProblemConfig& c) { c.chunk_size = 128, c.seqlen = 500; },
      [](ProblemConfig& c) { c.chunk_size = 256, c.seqlen = 600, c.batch = 1; },
      [](ProblemConfig& c) { c.ngroups = 2; },
      [](ProblemConfig& c) { c.ngroups = 8, c.nheads = 8, c.batch = 1; },          // one head per group
      [](ProblemConfig& c) { c.z = true; },
      [](ProblemConfig& c) { c.D_layout = DLayout::kPerHeadDim; },
      [](ProblemConfig& c) { c.D_layout = DLayout::kNone; },
      [](ProblemConfig& c) { c.dt_bias = true; },
      [](ProblemConfig& c) { c.dt_softplus = true; },
      [](ProblemConfig& c) { c.dt_softplus = true, c.dt_bias = true, c.dt_min = 0.001f, c.dt_max = 0.08f; },
      [](ProblemConfig& c) { c.dt_min = 0.01f, c.dt_max = 0.05f; },
      [](ProblemConfig& c) { c.initial_states = true; },
      [](ProblemConfig& c) { c.dt_dtype = DType::kF16; },
      [](ProblemConfig& c) { c.dt_dtype = DType::kBF16; },
      [](ProblemConfig& c) { c.batch = 1, c.seqlens = {100, 37, 163}; },
      [](ProblemConfig& c) { c.batch = 1, c.seqlens = {100, 37, 163}, c.seq_idx = true; },
      [](ProblemConfig& c) { c.batch = 1, c.seqlen = 256, c.seqlens = {64, 64, 128}; },  // on chunk boundaries
      [](ProblemConfig& c) {
        c.batch = 1, c.seqlens = {130, 170}, c.seq_idx = true, c.initial_states = true, c.z = true;
        c.dtype = DType::kF16;
      },
      [](ProblemConfig& c) { c.batch = 1, c.seqlen = 200, c.seqlens = {1, 5, 60, 2, 100, 32}, c.strided = true; },
      [](ProblemConfig& c) { c.strided = true, c.dtype = DType::kF32, c.z = true, c.D_layout = DLayout::kPerHeadDim; },
      [](ProblemConfig& c) { c.seqlen = 1; },
      [](ProblemConfig& c) { c.seqlen = 17, c.chunk_size = 128; },                 // shorter than one chunk
      [](ProblemConfig& c) { c.seqlen = 65; },                                     // one chunk and a token
      [](ProblemConfig& c) {                                                       // everything at once
        c.batch = 3, c.seqlen = 333, c.nheads = 6, c.ngroups = 3, c.dstate = 80, c.dtype = DType::kF16;
        c.z = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true;
        c.dt_min = 0.0005f, c.dt_max = 0.2f, c.initial_states = true, c.strided = true;
      },
      [](ProblemConfig& c) {                                                       // the headline, small
        c.seqlen = 1024, c.nheads = 8, c.dstate = 128, c.chunk_size = 128;
      },
      [](ProblemConfig& c) {
        c.batch = 1, c.seqlen = 700, c.seqlens = {300, 400}, c.chunk_size = 256, c.dtype = DType::kF32;
        c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true;
      },
  };
  std::vector<ProblemConfig> configs;
  for (std::size_t i = 0; i < edits.size(); ++i) {
    ProblemConfig c;  // the base: b2 L300 H4 P64 N32 G1 Q64 bf16 D[H]
    c.batch = 2, c.seqlen = 300, c.nheads = 4, c.headdim = 64, c.dstate = 32, c.ngroups = 1, c.chunk_size = 64;
    edits[i](c);
    c.seed = seed + i;
    configs.push_back(c);
  }
  return configs;
}

struct Outcome {
  ProblemConfig config;
  std::vector<testing::Comparison> cmps;
  std::string error;
  bool backward = false;                       // the backward ran too
  testing::GradLayout layout = testing::GradLayout::kContiguous;
  std::vector<testing::Comparison> grads;      // every gradient against the oracle
  int64_t written_outside = 0;                 // gradient elements written outside their views
  std::string note;                            // what the backward left out, and why
  bool pass() const {
    return error.empty() && testing::all_pass(cmps) &&
           (!backward || (testing::all_pass(grads) && written_outside == 0));
  }
  // The gradient furthest from its tolerance: "dB 3.1e-03", "nan:dx", "-" without a backward.
  std::string worst_gradient() const {
    if (!backward || grads.empty()) return "-";
    const testing::Comparison* worst = worst_of(
        grads, [](const testing::Comparison&) { return true; },
        [](const testing::Comparison& c) { return c.rel_l2 / c.tolerance; });
    if (worst->nonfinite) return "nan:" + worst->name;
    return worst->name + " " + fmt_sci(worst->rel_l2);
  }
  std::string rel(const char* name) const {
    for (const auto& c : cmps)
      if (c.name == name) return c.nonfinite ? fmt("nan:%lld", static_cast<long long>(c.nonfinite)) : fmt_sci(c.rel_l2);
    return "-";
  }
};

}  // namespace

int check_command(const Args& args) {
  const Backend backend = impl_flag(args);
  const int threads = threads_flag(args);
  const uint64_t seed = args.get_u64("--seed", 0);
  const bool json = args.has("--json");
  const CudaPath path = path_flag(args, backend);
  const bool backward = !args.has("--no-backward");
  std::vector<ProblemConfig> configs = sweep(seed);
  for (ProblemConfig& c : configs) c.cuda_path = path;

  const auto t0 = std::chrono::steady_clock::now();
  if (!json) {
    std::printf("mamba2ssd check: %zu problems against the fp64 oracle, %s, impl %s, seed %llu\n",
                configs.size(), backward ? "forward and backward" : "forward only", to_string(backend),
                static_cast<unsigned long long>(seed));
    std::printf("%4s  %-8s %-8s %-8s %-18s %-6s %s\n", "#", "y", "final", "varlen", "worst gradient", "result",
                "problem (rel L2 error per output)");
    std::fflush(stdout);
  }
  std::vector<Outcome> outcomes;
  int failed = 0;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    Outcome o;
    o.config = configs[i];
    try {
      testing::HostProblem problem(o.config);
      const Execution e = execute(problem, backend, 1, 0, threads);  // one untimed run
      o.cmps = testing::compare_with_oracle(problem, e.outputs(problem));
      if (backward) {
        // The gradient buffers' layouts in turn; slices of one buffer need dt in x's dtype.
        const testing::GradLayout layouts[] = {testing::GradLayout::kContiguous, testing::GradLayout::kPadded,
                                               testing::GradLayout::kFused};
        o.layout = layouts[i % 3];
        if (o.layout == testing::GradLayout::kFused && o.config.dt_dtype != o.config.dtype)
          o.layout = testing::GradLayout::kPadded;
        o.backward = true;
        auto check_backward = [&](const ProblemConfig& c) {
          testing::BackwardProblem bp(c, o.layout);
          const BackwardExecution b = execute_backward(bp, backend, 1, 0, threads);  // one untimed run
          o.grads = testing::compare_gradients(bp, b.gradients(bp), testing::backward_oracle(bp));
          o.written_outside = testing::written_outside_gradients(bp, b.gradients(bp));
        };
        try {
          check_backward(o.config);
        } catch (const Error& ex) {
          // A backend that takes no gradient through varlen states (the CUDA backward, today) must
          // refuse it by name; the rest of the backward is then checked without that cotangent.
          if (std::string(ex.what()).find("dvarlen_states") == std::string::npos) throw;
          o.note = "dvarlen_states refused by the backend; checked without it";
          ProblemConfig without = o.config;
          without.varlen_states = false;
          check_backward(without);
        }
      }
    } catch (const std::exception& ex) {
      o.error = ex.what();
    }
    if (!o.pass()) ++failed;
    if (!json) {
      std::printf("%4zu  %-8s %-8s %-8s %-18s %-6s %s%s\n", i + 1, o.rel("y").c_str(), o.rel("final_states").c_str(),
                  o.rel("varlen_states").c_str(), o.worst_gradient().c_str(),
                  o.pass() ? "PASS" : o.error.empty() ? "FAIL" : "ERROR", o.config.describe().c_str(),
                  o.backward ? (std::string(" grads:") + testing::to_string(o.layout)).c_str() : "");
      if (!o.note.empty()) std::printf("      note: %s\n", o.note.c_str());
      if (o.written_outside)
        std::printf("      error: %lld gradient elements written outside their views\n",
                    static_cast<long long>(o.written_outside));
      if (!o.error.empty()) std::printf("      error: %s\n", o.error.c_str());
      std::fflush(stdout);
    }
    outcomes.push_back(std::move(o));
  }
  // The decode step: its test matrix against its oracle (out, stored states, untouched slots).
  struct DecodeOutcome {
    testing::DecodeConfig config;
    std::vector<testing::Comparison> cmps;
    std::string error;
    bool pass() const { return error.empty() && testing::all_pass(cmps); }
  };
  const std::vector<testing::DecodeConfig> decode_configs = testing::decode_test_matrix(seed + 1);
  if (!json) {
    std::printf("decode: %zu problems against the fp64 oracle\n", decode_configs.size());
    std::printf("%4s  %-8s %-8s %-6s %s\n", "#", "out", "state", "result", "problem (rel L2 error per output)");
    std::fflush(stdout);
  }
  std::vector<DecodeOutcome> decode_outcomes;
  int decode_failed = 0;
  for (std::size_t i = 0; i < decode_configs.size(); ++i) {
    DecodeOutcome o;
    o.config = decode_configs[i];
    try {
      testing::HostDecodeProblem problem(o.config);
      std::map<std::string, std::vector<uint8_t>> results;
      if (backend == Backend::kCuda) {
        results = gpu::execute_decode(problem, 0, 0, 0.0).results;
      } else {
        const DecodeParams p = problem.params();
        if (backend == Backend::kReference) decode_reference(p);
        else decode_cpu(p, threads);
        results = problem.buffers;
      }
      o.cmps = testing::compare_decode(problem, results, testing::decode_oracle(problem));
    } catch (const std::exception& ex) {
      o.error = ex.what();
    }
    if (!o.pass()) ++decode_failed;
    if (!json) {
      auto rel = [&](const char* name) {
        for (const auto& c : o.cmps)
          if (c.name == name) return c.nonfinite ? fmt("nan:%lld", static_cast<long long>(c.nonfinite)) : fmt_sci(c.rel_l2);
        return std::string("-");
      };
      std::printf("%4zu  %-8s %-8s %-6s %s\n", i + 1, rel("out").c_str(), rel("state").c_str(),
                  o.pass() ? "PASS" : o.error.empty() ? "FAIL" : "ERROR", o.config.describe().c_str());
      if (!o.error.empty()) std::printf("      error: %s\n", o.error.c_str());
      std::fflush(stdout);
    }
    decode_outcomes.push_back(std::move(o));
  }
  failed += decode_failed;

  // The packed prefill: its test matrix against its oracle (y, stored and intermediate states,
  // untouched slots); on the GPU also the guard bytes around the cache.
  struct PrefillOutcome {
    testing::PrefillConfig config;
    std::vector<testing::Comparison> cmps;
    std::string error;
    std::string guard_damage;  // empty: nothing written outside the cache (GPU only)
    bool pass() const { return error.empty() && guard_damage.empty() && testing::all_pass(cmps); }
    std::string rel(const char* name) const {
      for (const auto& c : cmps)
        if (c.name == name) return c.nonfinite ? fmt("nan:%lld", static_cast<long long>(c.nonfinite)) : fmt_sci(c.rel_l2);
      return "-";
    }
  };
  const std::vector<testing::PrefillConfig> prefill_configs = testing::prefill_test_matrix(seed + 3);
  if (!json) {
    std::printf("prefill: %zu problems against the fp64 oracle\n%4s  %-8s %-8s %-8s %-6s %s\n", prefill_configs.size(),
                "#", "y", "state", "inter", "result", "problem (rel L2 error per output; inter: intermediate states)");
    std::fflush(stdout);
  }
  std::vector<PrefillOutcome> prefill_outcomes;
  for (std::size_t i = 0; i < prefill_configs.size(); ++i) {
    PrefillOutcome o;
    o.config = prefill_configs[i];
    try {
      testing::HostPrefillProblem problem(o.config);
      const testing::PrefillOracle ref = testing::prefill_oracle(problem);
      problem.reset();
      if (backend == Backend::kCuda) o.guard_damage = gpu::execute_prefill(problem, 0, 0).guard_damage;  // one untimed run
      else if (backend == Backend::kReference) prefill_reference(problem.params());
      else prefill_cpu(problem.params(), threads);
      o.cmps = testing::compare_prefill(problem, ref);
    } catch (const std::exception& ex) {
      o.error = ex.what();
    }
    if (!o.pass()) ++failed;
    if (!json) {
      std::printf("%4zu  %-8s %-8s %-8s %-6s %s\n", i + 1, o.rel("y").c_str(), o.rel("state").c_str(),
                  o.rel("intermediate").c_str(), o.pass() ? "PASS" : o.error.empty() ? "FAIL" : "ERROR",
                  o.config.describe().c_str());
      if (!o.guard_damage.empty()) std::printf("      error: %s\n", o.guard_damage.c_str());
      if (!o.error.empty()) std::printf("      error: %s\n", o.error.c_str());
      std::fflush(stdout);
    }
    prefill_outcomes.push_back(std::move(o));
  }

  // The consistency rules: prefill whole, in pieces, and ended by decode steps, against each other
  // and the oracle (testing/consistency.h); by default within the tolerance table, in the exact mode
  // bit for bit. The reference backend computes in fp64 and rounds at every store, so the exact
  // mode's bits are the cpu and cuda backends' rule only.
  struct ConsistencyOutcome {
    testing::ConsistencyConfig config;
    std::vector<testing::Comparison> cmps;
    std::string error;
    bool pass() const { return error.empty() && testing::all_pass(cmps); }
    // The worst of the ways against each other: "8.1e-04", "bits ok", "bits 3.2e-01", "nan:..."
    std::string agreement() const {
      const testing::Comparison* worst = worst_of(cmps, between_ways, rel_l2);
      if (!worst) return "-";
      if (worst->nonfinite) return "nan:" + worst->name;
      if (config.exact) return worst->rel_l2 == 0.0 ? "bits ok" : "bits " + fmt_sci(worst->rel_l2);
      return fmt_sci(worst->rel_l2);
    }
    // The worst of the ways against the oracle.
    std::string oracle() const {
      const testing::Comparison* worst =
          worst_of(cmps, [](const testing::Comparison& c) { return !between_ways(c); }, rel_l2);
      if (!worst) return "-";
      return worst->nonfinite ? "nan:" + worst->name : fmt_sci(worst->rel_l2);
    }
    static bool between_ways(const testing::Comparison& c) { return c.name.find(" vs ") != std::string::npos; }
    static double rel_l2(const testing::Comparison& c) { return c.rel_l2; }
  };
  std::vector<testing::ConsistencyConfig> consistency_configs;
  for (const testing::ConsistencyConfig& c : testing::consistency_matrix(seed + 2))
    if (!(c.exact && backend == Backend::kReference)) consistency_configs.push_back(c);
  if (!json) {
    std::printf("consistency: %zu problems, prefill whole / in pieces / then decode steps%s\n", consistency_configs.size(),
                backend == Backend::kReference ? " (default mode only: the exact mode is cpu and cuda)" : "");
    std::printf("%4s  %-8s %-12s %-6s %s\n", "#", "oracle", "ways agree", "result", "problem (worst rel L2 error)");
    std::fflush(stdout);
  }
  std::vector<ConsistencyOutcome> consistency_outcomes;
  for (std::size_t i = 0; i < consistency_configs.size(); ++i) {
    ConsistencyOutcome o;
    o.config = consistency_configs[i];
    try {
      testing::HostProblem problem(o.config.problem);
      const std::vector<testing::WayResult> ways = backend == Backend::kCuda
                                                       ? gpu::consistency_ways(o.config, problem)
                                                       : testing::run_ways_host(o.config, problem, backend, threads);
      o.cmps = testing::compare_ways(o.config, problem, ways);
    } catch (const std::exception& ex) {
      o.error = ex.what();
    }
    if (!o.pass()) ++failed;
    if (!json) {
      std::printf("%4zu  %-8s %-12s %-6s %s\n", i + 1, o.oracle().c_str(), o.agreement().c_str(),
                  o.pass() ? "PASS" : o.error.empty() ? "FAIL" : "ERROR", o.config.describe().c_str());
      for (const auto& c : o.cmps)
        if (!c.pass()) std::printf("      %s: rel L2 %s (tolerance %s), nonfinite %lld\n", c.name.c_str(),
                                   fmt_sci(c.rel_l2).c_str(), fmt_sci(c.tolerance).c_str(), static_cast<long long>(c.nonfinite));
      if (!o.error.empty()) std::printf("      error: %s\n", o.error.c_str());
      std::fflush(stdout);
    }
    consistency_outcomes.push_back(std::move(o));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (json) {
    std::vector<std::string> rows;
    for (const Outcome& o : outcomes) {
      std::vector<std::string> errs;
      for (const auto& c : o.cmps) errs.push_back(comparison_json(c).dump());
      JsonObject r;
      r.raw("problem", config_json(o.config).dump()).raw("errors", json_array(errs));
      if (o.backward) {
        std::vector<std::string> grads;
        for (const auto& c : o.grads) grads.push_back(comparison_json(c).dump());
        r.str("gradient_layout", testing::to_string(o.layout))
            .raw("gradient_errors", json_array(grads))
            .integer("written_outside_gradients", static_cast<long long>(o.written_outside));
        if (!o.note.empty()) r.str("note", o.note);
      }
      r.boolean("pass", o.pass());
      if (!o.error.empty()) r.str("error", o.error);
      rows.push_back(r.dump());
    }
    std::vector<std::string> decode_rows;
    for (const DecodeOutcome& o : decode_outcomes) {
      std::vector<std::string> errs;
      for (const auto& c : o.cmps) errs.push_back(comparison_json(c).dump());
      JsonObject r;
      r.str("problem", o.config.describe()).raw("errors", json_array(errs)).boolean("pass", o.pass());
      if (!o.error.empty()) r.str("error", o.error);
      decode_rows.push_back(r.dump());
    }
    std::vector<std::string> prefill_rows;
    for (const PrefillOutcome& o : prefill_outcomes) {
      std::vector<std::string> errs;
      for (const auto& c : o.cmps) errs.push_back(comparison_json(c).dump());
      JsonObject r;
      r.str("problem", o.config.describe()).raw("errors", json_array(errs)).boolean("pass", o.pass());
      if (!o.guard_damage.empty()) r.str("guard_damage", o.guard_damage);
      if (!o.error.empty()) r.str("error", o.error);
      prefill_rows.push_back(r.dump());
    }
    std::vector<std::string> consistency_rows;
    for (const ConsistencyOutcome& o : consistency_outcomes) {
      std::vector<std::string> errs;
      for (const auto& c : o.cmps) errs.push_back(comparison_json(c).dump());
      JsonObject r;
      r.str("problem", o.config.describe()).boolean("exact", o.config.exact).boolean("packed", o.config.packed);
      r.raw("errors", json_array(errs));
      r.boolean("pass", o.pass());
      if (!o.error.empty()) r.str("error", o.error);
      consistency_rows.push_back(r.dump());
    }
    JsonObject out;
    out.str("command", "check")
        .str("backend", to_string(backend))
        .unsigned_integer("seed", seed)
        .boolean("backward", backward)
        .integer("problems", static_cast<long long>(outcomes.size()))
        .integer("failed", failed)
        .num("seconds", seconds)
        .raw("results", json_array(rows))
        .integer("decode_problems", static_cast<long long>(decode_outcomes.size()))
        .raw("decode_results", json_array(decode_rows))
        .integer("prefill_problems", static_cast<long long>(prefill_outcomes.size()))
        .raw("prefill_results", json_array(prefill_rows))
        .integer("consistency_problems", static_cast<long long>(consistency_outcomes.size()))
        .raw("consistency_results", json_array(consistency_rows))
        .boolean("pass", failed == 0);
    std::printf("%s\n", out.dump().c_str());
  } else {
    const std::size_t total =
        outcomes.size() + decode_outcomes.size() + prefill_outcomes.size() + consistency_outcomes.size();
    std::printf("%zu problems (%zu forward, %zu decode, %zu prefill, %zu consistency): %zu passed, %d failed (%.1f s)\n",
                total, outcomes.size(), decode_outcomes.size(), prefill_outcomes.size(), consistency_outcomes.size(),
                total - failed, failed, seconds);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace mamba2ssd::cli
