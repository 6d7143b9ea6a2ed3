// mamba2ssd prefill: the packed prefill of serving, on a host backend or the GPU (prefill_cuda on a
// DevicePrefillProblem, cudaEvents around each launch), timed and checked against the oracle: y, the
// stored states (final and, with --state-every, intermediate), the slots no store names, and on the
// GPU the guard bytes around the cache.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "execute.h"
#include "memory.h"
#include "problem_flags.h"
#include "report.h"
#include "testing/prefill_problem.h"

namespace mamba2ssd::cli {
namespace {

// Host memory: the cache three times (as drawn, as run, the oracle's), the inputs and y twice, and
// the oracle's fp64 copy of its largest request.
double prefill_host_bytes(const testing::PrefillConfig& c) {
  const double slot = static_cast<double>(c.nheads * c.headdim * c.dstate);
  const double cache = static_cast<double>(c.cache_slots()) * slot * static_cast<double>(dtype_size(c.state_dtype));
  const double row = static_cast<double>(c.nheads * c.headdim * 3 + 2 * c.ngroups * c.dstate + c.nheads);
  int64_t longest = 0;
  for (int64_t len : c.seqlens) longest = std::max(longest, len);
  return 3.0 * cache + 2.0 * static_cast<double>(c.tokens()) * row * 4.0 + static_cast<double>(longest) * row * 8.0 +
         64.0 * 1024 * 1024;
}

}  // namespace

int prefill_command(const Args& args) {
  const testing::PrefillConfig config = prefill_config_from(args);
  const Backend backend = impl_flag(args);
  const CudaPath path = path_flag(args, backend);
  const int threads = threads_flag(args);
  segments_flag(args, backend);
  request_groups_flag(args, backend);
  const bool on_gpu = backend == Backend::kCuda;
  const int repeats = static_cast<int>(
      args.get_int("--repeats", on_gpu ? 20 : backend == Backend::kCpu ? 3 : 1, 1, 1000000));
  const int warmup = backend == Backend::kReference ? 0 : on_gpu ? 3 : 1;
  const bool json = args.has("--json");
  const bool check = !args.has("--no-check");
  require_host_memory(prefill_host_bytes(config), available_host_memory());

  testing::HostPrefillProblem problem(config);
  validate(problem.params());  // a bad problem is an argument error (exit 2), before anything runs
  Timing timing;
  std::string guard_damage;
  std::size_t workspace_bytes = 0;
  std::string path_ran;
  if (on_gpu) {
    // Downloads the checked run's y and cache into `problem`, as the host backends leave them.
    const gpu::PrefillExecution e = gpu::execute_prefill(problem, warmup, repeats, path);
    timing = e.timing, guard_damage = e.guard_damage, workspace_bytes = e.workspace_bytes, path_ran = e.path;
  } else {
    auto run = [&] {
      const PrefillParams p = problem.params();
      if (backend == Backend::kReference) prefill_reference(p);
      else prefill_cpu(p, threads);
    };
    // Every run is the same call: y poisoned and the cache as drawn (outside the timing); the last
    // one's results are checked.
    timing.warmup = warmup;
    const auto reset = [&] { problem.reset(); };
    time_host(warmup, run, reset);
    timing.seconds = time_host(repeats, run, reset);
  }
  const std::vector<testing::Comparison> cmps =
      check ? testing::compare_prefill(problem, testing::prefill_oracle(problem)) : std::vector<testing::Comparison>{};
  const bool pass = (!check || testing::all_pass(cmps)) && guard_damage.empty();
  const double t = timing.median(), tokens_per_s = static_cast<double>(config.tokens()) / t;

  if (json) {
    std::vector<std::string> errs;
    for (const auto& c : cmps) errs.push_back(comparison_json(c).dump());
    JsonObject o;
    o.str("command", "prefill")
        .str("problem", config.describe())
        .integer("requests", config.requests())
        .integer("tokens", config.tokens())
        .integer("nheads", config.nheads)
        .integer("headdim", config.headdim)
        .integer("dstate", config.dstate)
        .integer("ngroups", config.ngroups)
        .str("state_dtype", to_string(config.state_dtype))
        .str("dtype", to_string(config.dtype))
        .integer("state_every", config.state_every)
        .integer("max_intermediate", config.intermediates())
        .str("backend", to_string(backend))
        .str("device", describe_backend(backend, threads))
        .timing(timing)
        .num("tokens_per_s", tokens_per_s);
    if (on_gpu)
      o.integer("workspace_bytes", static_cast<long long>(workspace_bytes))
          .str("guard_damage", guard_damage)
          .str("path", path_ran);
    o.boolean("checked", check).raw("errors", json_array(errs)).boolean("pass", pass);
    std::printf("%s\n", o.dump().c_str());
    return pass ? 0 : 1;
  }

  std::printf("mamba2ssd prefill\n");
  std::printf("  problem  %s\n", config.describe().c_str());
  std::printf("  backend  %s\n", describe_backend(backend, threads).c_str());
  std::printf("  time     %s\n", timing.describe(on_gpu ? ", L2 cleared before each" : "").c_str());
  std::printf("  rate     %s tokens/s (%lld tokens in %lld requests)\n", fmt_rate(tokens_per_s).c_str(),
              static_cast<long long>(config.tokens()), static_cast<long long>(config.requests()));
  if (on_gpu) {
    std::printf("  path     %s\n", path_ran.c_str());
    std::printf("  memory   workspace %s MB (cuda_prefill_workspace_bytes)\n",
                fmt_rate(static_cast<double>(workspace_bytes) * 1e-6).c_str());
    std::printf("  guards   %s\n", guard_damage.empty() ? "intact (nothing written outside the cache)" : guard_damage.c_str());
  }
  if (check) {
    std::printf("  error    against the fp64 oracle (prefill_reference), every request and head\n");
    print_comparisons(cmps, 22);
  } else {
    std::printf("  error    not checked (--no-check)\n");
  }
  std::printf("  result   %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace mamba2ssd::cli
