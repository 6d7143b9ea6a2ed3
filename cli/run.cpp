// mamba2ssd run: one forward pass on one problem, timed, and checked against the oracle on a slice.
#include <algorithm>
#include <cstdio>
#include <string>

#include "commands.h"
#include "execute.h"
#include "memory.h"
#include "metrics.h"
#include "problem_flags.h"
#include "report.h"
#include "testing/consistency.h"
#include "testing/tolerance.h"

namespace mamba2ssd::cli {

int run_command(const Args& args) {
  if (args.has("--backward")) return run_backward_command(args);
  if (args.has("--save-states")) bad_flag("--save-states", "keeps the forward's states for the backward: add --backward");
  if (args.has("--portable")) bad_flag("--portable", "picks the backward's kernels: add --backward");
  testing::ProblemConfig config = config_from(args);  // sizes within the API's limits (else exit 2)
  const Backend backend = impl_flag(args);
  config.cuda_path = path_flag(args, backend);
  const int threads = threads_flag(args);
  segments_flag(args, backend);
  const int default_repeats = backend == Backend::kCuda ? 20 : backend == Backend::kCpu ? 3 : 1;
  const int repeats = static_cast<int>(args.get_int("--repeats", default_repeats, 1, 1000000));
  const int warmup = backend == Backend::kReference ? 0 : 1;  // the oracle has nothing to warm
  const bool json = args.has("--json");
  const bool exact = args.has("--exact-prefill");
  if (exact && !config.seqlens.empty()) bad_flag("--exact-prefill", "takes one prompt per batch row, not --seqlens");
  if (exact && !config.final_states) bad_flag("--exact-prefill", "keeps its state in the final states: drop --no-final-states");
  // execute_exact starts the cache as a byte copy of initial_states into final_states, which is
  // right only when the two share one layout: padded views give each its own padding (problem.cpp),
  // so the copy would read past initial_states' buffer and scramble the state.
  if (exact && config.initial_states && (config.strided || config.misaligned))
    bad_flag("--exact-prefill", "copies the initial states into the final states' layout, so it takes them unpadded: "
                                "drop --strided and --misaligned, or --initial-states");

  // The oracle checks the first batch row and two heads (everything with --check-all).
  reference::Slice slice;
  if (!args.has("--check-all")) {
    slice.batch_begin = 0, slice.batch_end = 1;
    slice.head_begin = 0, slice.head_end = std::min<int64_t>(2, config.nheads);
  }
  // Enough host memory for the buffers and the oracle, before any is allocated (else exit 1).
  if (!args.has("--explain"))
    require_host_memory(run_host_bytes(config, backend, slice) + (exact ? exact_prefill_host_bytes(config, backend) : 0.0),
                        available_host_memory());

  testing::HostProblem problem(config);
  const ForwardParams params = problem.params();
  validate(params);  // a bad problem is an argument error (exit 2), before anything runs
  const Work work = count_work(params);
  if (args.has("--explain")) {
    if (backend != Backend::kCuda)
      bad_flag("--explain", std::string("explains the CUDA dispatch, but the backend is ") + to_string(backend));
    const CudaExplanation x = explain_cuda(params);
    if (json) {
      std::vector<std::string> paths;
      for (const CudaPathVerdict& v : x.paths)
        paths.push_back(JsonObject().str("path", to_string(v.path)).str("refusal", v.refusal).dump());
      JsonObject o;
      o.str("command", "run --explain")
          .raw("problem", config_json(config).dump())
          .str("device", x.device)
          .str("requested", to_string(x.requested))
          .str("chosen", x.chosen == CudaPath::kAuto ? "none" : to_string(x.chosen))
          .str("plan", x.plan)
          .str("products", x.products)
          .raw("paths", json_array(paths));
      std::printf("%s\n", o.dump().c_str());
    } else {
      std::printf("mamba2ssd run --explain\n  problem  %s\n%s", config.describe().c_str(), x.to_string().c_str());
    }
    return x.chosen == CudaPath::kAuto ? 1 : 0;
  }
  // Which CUDA path runs it, and its tensor-core products ("TF32" or "3xTF32" for fp32), for the report.
  std::string cuda_path, products;
  if (backend == Backend::kCuda) {
    const CudaExplanation x = explain_cuda(params);
    cuda_path = std::string(to_string(x.chosen)) + " (" + x.plan + ")";
    products = x.products;
  }

  const Execution e = execute(problem, backend, warmup, repeats, threads);
  const double t = e.timing.median();

  const reference::Result ref = testing::oracle(problem, slice);
  const std::vector<testing::Comparison> cmps = testing::compare_with(problem, e.outputs(problem), ref);
  bool pass = testing::all_pass(cmps);

  // --exact-prefill: the same prompt through the exact mode (after the forward's outputs are checked:
  // on the host it writes the same buffers), held to the decode step's bar.
  Execution x;
  std::vector<testing::Comparison> exact_cmps;
  if (exact) {
    x = execute_exact(problem, backend, warmup, repeats, threads);
    for (testing::Comparison c : testing::compare_with(problem, x.outputs(problem), ref)) {
      c.tolerance = testing::exact_prefill_rel_l2_tolerance(config.dtype);
      c.name = "exact " + c.name;
      exact_cmps.push_back(c);
    }
    pass = pass && testing::all_pass(exact_cmps);
  }

  if (json) {
    std::vector<std::string> errs;
    for (const auto& c : cmps) errs.push_back(comparison_json(c).dump());
    JsonObject o;
    o.str("command", "run")
        .raw("problem", config_json(config).dump())
        .str("backend", to_string(e.backend))
        .str("device", describe_backend(e.backend, threads))
        .str("cuda_path", cuda_path)
        .str("products", products)
        .timing(e.timing)
        .num("bytes", work.bytes)
        .num("flops", work.flops)
        .num("GBps", work.bytes / t * 1e-9)
        .num("GFLOPps", work.flops / t * 1e-9)
        .raw("check_slice", fmt("{\"batch\":[0,%lld],\"heads\":[0,%lld],\"tokens\":[0,%lld]}",
                                static_cast<long long>(slice.batch_end < 0 ? config.batch : slice.batch_end),
                                static_cast<long long>(slice.head_end < 0 ? config.nheads : slice.head_end),
                                static_cast<long long>(config.seqlen)))
        .raw("errors", json_array(errs));
    if (exact) {
      std::vector<std::string> xerrs;
      for (const auto& c : exact_cmps) xerrs.push_back(comparison_json(c).dump());
      o.raw("exact_prefill", JsonObject()
                                 .num("time_s", x.timing.median())
                                 .num("time_min_s", x.timing.min())
                                 .num("time_max_s", x.timing.max())
                                 .num("time_over_forward", x.timing.median() / t)
                                 .raw("errors", json_array(xerrs))
                                 .dump());
    }
    o.boolean("pass", pass);
    std::printf("%s\n", o.dump().c_str());
    return pass ? 0 : 1;
  }

  std::printf("mamba2ssd run\n");
  std::printf("  problem  %s\n", config.describe().c_str());
  std::printf("  backend  %s\n", describe_backend(e.backend, threads).c_str());
  if (!cuda_path.empty()) std::printf("  path     %s, %s products\n", cuda_path.c_str(), products.c_str());
  std::printf("  time     %s\n", e.timing.describe().c_str());
  std::printf("  traffic  %s MB   %s GB/s\n", fmt_rate(work.bytes * 1e-6).c_str(), fmt_rate(work.bytes / t * 1e-9).c_str());
  std::printf("  work     %s GFLOP   %s GFLOP/s\n", fmt_rate(work.flops * 1e-9).c_str(),
              fmt_rate(work.flops / t * 1e-9).c_str());
  if (args.has("--check-all"))
    std::printf("  error    against the fp64 oracle on every batch row, head and token\n");
  else
    std::printf("  error    against the fp64 oracle on batch row 0, heads 0..%lld, all %lld tokens\n",
                static_cast<long long>(slice.head_end - 1), static_cast<long long>(config.seqlen));
  print_comparisons(cmps, 14);
  if (exact) {
    std::printf("  exact    %s  (the exact mode: the decode step over the %lld tokens, fp32 cache; median of %zu; min %s, max %s)   %.2fx the forward's time\n",
                fmt_time(x.timing.median()).c_str(), static_cast<long long>(config.seqlen), x.timing.seconds.size(),
                fmt_time(x.timing.min()).c_str(), fmt_time(x.timing.max()).c_str(), x.timing.median() / t);
    print_comparisons(exact_cmps, 20);
  }
  std::printf("  result   %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace mamba2ssd::cli
