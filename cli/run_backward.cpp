// mamba2ssd run --backward: forward + backward on one problem, timed (and the backward alone), and
// every gradient checked against the oracle of the backward on a slice.
#include <algorithm>
#include <cstdio>
#include <string>

#include "api/internal.h"  // detail::set_portable_backward_for_testing (--portable)
#include "commands.h"
#include "execute.h"
#include "memory.h"
#include "problem_flags.h"
#include "report.h"
#include "testing/backward_problem.h"

namespace mamba2ssd::cli {
namespace {

// --explain: how backward_cuda would run the problem (its plan, and which form of each kernel runs),
// then stop; nothing runs on the GPU.
int explain_backward(const Args& args, const testing::ProblemConfig& config, Backend backend, bool save_states) {
  if (backend != Backend::kCuda)
    bad_flag("--explain", std::string("explains the CUDA dispatch, but the backend is ") + to_string(backend));
  testing::BackwardProblem problem(config, testing::GradLayout::kContiguous);
  if (save_states) problem.save_states();
  validate(problem.forward.params());  // a bad problem is an argument error (exit 2)
  validate(problem.params());
  const CudaBackwardExplanation x = explain_cuda_backward(problem.params());
  if (args.has("--json")) {
    std::vector<std::string> kernels;
    for (const CudaBackwardKernel& k : x.kernels)
      kernels.push_back(JsonObject()
                            .str("kernel", k.name)
                            .str("form", k.refusal.empty() ? "hopper" : "portable")
                            .str("refusal", k.refusal)
                            .dump());
    JsonObject o;
    o.str("command", "run --backward --explain")
        .raw("problem", config_json(config).dump())
        .str("device", x.device)
        .str("plan", x.plan)
        .integer("workspace_bytes", static_cast<long long>(x.workspace_bytes))
        .boolean("chained", x.chained)
        .raw("kernels", json_array(kernels));
    std::printf("%s\n", o.dump().c_str());
  } else {
    std::printf("mamba2ssd run --backward --explain\n  problem  %s\n%s", config.describe().c_str(), x.to_string().c_str());
  }
  return 0;
}

}  // namespace

int run_backward_command(const Args& args) {
  testing::ProblemConfig config = config_from(args);  // sizes within the API's limits (else exit 2)
  const Backend backend = impl_flag(args);
  config.cuda_path = path_flag(args, backend);
  if (args.has("--exact-prefill")) bad_flag("--exact-prefill", "times the forward's exact mode; leave out --backward");
  const bool save_states = args.has("--save-states");
  if (save_states && backend != Backend::kCuda)
    bad_flag("--save-states", std::string("saves states on the cuda backend only, the backend is ") + to_string(backend));
  const int threads = threads_flag(args);
  segments_flag(args, backend);  // the forward's walks and the backward's Hopper walks alike
  if (args.has("--portable")) {
    if (backend != Backend::kCuda)
      bad_flag("--portable", std::string("picks the CUDA backward's kernels, but the backend is ") + to_string(backend));
    detail::set_portable_backward_for_testing(true);
  }
  if (args.has("--explain")) return explain_backward(args, config, backend, save_states);
  const int default_repeats = backend == Backend::kCuda ? 20 : backend == Backend::kCpu ? 3 : 1;
  const int repeats = static_cast<int>(args.get_int("--repeats", default_repeats, 1, 1000000));
  const int warmup = backend == Backend::kReference ? 0 : 1;
  const bool json = args.has("--json"), check_all = args.has("--check-all");

  // The oracle checks the first batch row and two heads (everything with --check-all), as run does.
  reference::Slice slice;
  if (!check_all) {
    slice.batch_begin = 0, slice.batch_end = 1;
    slice.head_begin = 0, slice.head_end = std::min<int64_t>(2, config.nheads);
  }
  require_host_memory(backward_run_host_bytes(config, backend, slice), available_host_memory());

  // Gradients in padded buffers when the inputs are strided, so that the backend writes strided too.
  testing::BackwardProblem problem(config, config.strided || config.misaligned ? testing::GradLayout::kPadded
                                                                               : testing::GradLayout::kContiguous);
  if (save_states) problem.save_states();
  validate(problem.forward.params());  // a bad problem is an argument error (exit 2), before anything runs
  validate(problem.params());

  const BackwardExecution e = execute_backward(problem, backend, warmup, repeats, threads);
  std::vector<testing::Comparison> cmps;
  if (check_all) {
    cmps = testing::compare_gradients(problem, e.gradients(problem), testing::backward_oracle(problem));
  } else {
    // One more, untimed run with the cotangents zero outside the slice: then dA, dD, ddt_bias (sums
    // over batch rows) and dB, dC (sums over a group's heads) are the slice's alone.
    testing::restrict_cotangents(problem, slice);
    const BackwardExecution checked = execute_backward(problem, backend, 1, 0, threads);
    cmps = testing::compare_gradients(problem, checked.gradients(problem), testing::backward_oracle(problem, slice),
                                      slice);
  }
  const bool pass = testing::all_pass(cmps);
  const int64_t slice_heads = slice.head_end < 0 ? config.nheads : slice.head_end;
  const int64_t slice_rows = slice.batch_end < 0 ? config.batch : slice.batch_end;

  if (json) {
    std::vector<std::string> errs;
    for (const auto& c : cmps) errs.push_back(comparison_json(c).dump());
    JsonObject o;
    o.str("command", "run --backward")
        .raw("problem", config_json(config).dump())
        .str("backend", to_string(e.backend))
        .str("device", describe_backend(e.backend, threads))
        .integer("warmup", e.forward_backward.warmup)
        .integer("repeats", static_cast<long long>(e.forward_backward.seconds.size()))
        .num("forward_backward_time_s", e.forward_backward.median())
        .num("forward_backward_time_min_s", e.forward_backward.min())
        .num("backward_time_s", e.backward.median())
        .num("backward_time_min_s", e.backward.min())
        .boolean("save_states", save_states)
        .raw("check_slice", fmt("{\"batch\":[0,%lld],\"heads\":[0,%lld],\"tokens\":[0,%lld]}",
                                static_cast<long long>(slice_rows), static_cast<long long>(slice_heads),
                                static_cast<long long>(config.seqlen)))
        .raw("errors", json_array(errs))
        .boolean("pass", pass);
    std::printf("%s\n", o.dump().c_str());
    return pass ? 0 : 1;
  }

  std::printf("mamba2ssd run --backward\n");
  std::printf("  problem  %s\n", config.describe().c_str());
  std::printf("  backend  %s\n", describe_backend(e.backend, threads).c_str());
  std::printf("  fwd+bwd  %s\n", e.forward_backward.describe().c_str());
  std::printf("  bwd      %s\n", e.backward.describe().c_str());
  if (save_states) std::printf("  states   saved by the forward, read by the backward (--save-states)\n");
  if (check_all)
    std::printf("  error    gradients against the fp64 oracle on every batch row, head and token\n");
  else
    std::printf("  error    gradients against the fp64 oracle on batch row 0, heads 0..%lld, all %lld tokens\n"
                "           (a run of its own, with the cotangents zero elsewhere)\n",
                static_cast<long long>(slice_heads - 1), static_cast<long long>(config.seqlen));
  print_comparisons(cmps, 16);
  std::printf("  result   %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace mamba2ssd::cli
