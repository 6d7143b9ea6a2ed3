// mamba2ssd decode: the decode step on one batch of requests, timed, set against the copy ceiling
// measured in the same run (on a GPU), and checked against the oracle on a slice.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "api/internal.h"  // detail::set_decode_kernel_for_testing (--kernel)
#include "commands.h"
#include "execute.h"
#include "memory.h"
#include "problem_flags.h"
#include "report.h"
#include "testing/decode_problem.h"

namespace mamba2ssd::cli {
namespace {

// Bytes that must move at least once: each request that runs reads its state and writes it once per
// stored token; every request reads x, dt, B, C (and z) and writes out.
double decode_bytes(const testing::DecodeConfig& c) {
  const double b = static_cast<double>(c.batch), T = static_cast<double>(c.ntokens), H = static_cast<double>(c.nheads);
  const double P = static_cast<double>(c.headdim), N = static_cast<double>(c.dstate), G = static_cast<double>(c.ngroups);
  const double es = static_cast<double>(dtype_size(c.dtype)), state = H * P * N * static_cast<double>(dtype_size(c.state_dtype));
  const double running = b - static_cast<double>(c.pads);
  double bytes = running * state * (1.0 + (c.dst_indices ? T : 1.0));
  bytes += b * T * H * P * es * (c.z ? 3.0 : 2.0);  // x, z, out
  bytes += 2.0 * b * T * G * N * es;                // B, C
  bytes += b * T * H * 4.0;                          // dt (fp32)
  return bytes;
}

// Host memory: the cache twice (as drawn and as run), the other buffers, the results downloaded, and
// the oracle's states (T per request and head of the slice).
double decode_host_bytes(const testing::DecodeConfig& c, int64_t checked_requests) {
  const double slot = static_cast<double>(c.nheads * c.headdim * c.dstate);
  const double cache = static_cast<double>(c.slots()) * slot * static_cast<double>(dtype_size(c.state_dtype));
  const double io = static_cast<double>(c.batch * c.ntokens * c.nheads * (c.headdim * 3 + 2 * c.dstate)) * 4.0;
  const double oracle = static_cast<double>(checked_requests * c.ntokens) * slot * 8.0;
  return 3.0 * cache + 2.0 * io + oracle + 64.0 * 1024 * 1024;
}

}  // namespace

int decode_command(const Args& args) {
  const testing::DecodeConfig config = decode_config_from(args);
  const Backend backend = impl_flag(args);
  const int threads = threads_flag(args);
  const bool on_gpu = backend == Backend::kCuda;
  const int repeats = static_cast<int>(
      args.get_int("--repeats", on_gpu ? 100 : backend == Backend::kCpu ? 3 : 1, 1, 1000000));
  const int warmup = backend == Backend::kReference ? 0 : on_gpu ? 5 : 1;
  const bool json = args.has("--json");
  // A tuning knob: one of decode_cuda's two kernels whatever the call (docs/serving.md, "Two kernels").
  const std::string kernel = args.get_word("--kernel", "auto", {"auto", "rows", "stream"});
  if (args.has("--kernel")) {
    if (!on_gpu) bad_flag("--kernel", "picks a CUDA kernel, but the backend is " + std::string(to_string(backend)));
    detail::set_decode_kernel_for_testing(kernel == "rows" ? 1 : kernel == "stream" ? 2 : 0);
  }

  // The oracle checks the first two requests and the last, all heads (everything with --check-all).
  std::vector<reference::DecodeSlice> slices(1);
  if (!args.has("--check-all")) {
    slices[0].batch_end = std::min<int64_t>(2, config.batch);
    if (config.batch > 2) {
      reference::DecodeSlice last;
      last.batch_begin = config.batch - 1, last.batch_end = config.batch;
      slices.push_back(last);
    }
  }
  const int64_t checked = args.has("--check-all") ? config.batch : std::min<int64_t>(3, config.batch);
  require_host_memory(decode_host_bytes(config, backend == Backend::kReference ? config.batch : checked),
                      available_host_memory());

  testing::HostDecodeProblem problem(config);
  const DecodeParams params = problem.params();
  validate(params);  // a bad problem is an argument error (exit 2), before anything runs
  const double bytes = decode_bytes(config);

  Timing timing;
  std::map<std::string, std::vector<uint8_t>> results;
  std::string guard_damage, copy_error;
  double copy_s = 0.0;
  if (on_gpu) {
    gpu::DecodeExecution e = gpu::execute_decode(problem, warmup, repeats, bytes);
    timing = e.timing, results = std::move(e.results), guard_damage = e.guard_damage;
    copy_s = e.copy_seconds, copy_error = e.copy_error;
  } else {
    auto once = [&] {
      if (backend == Backend::kReference) decode_reference(params);
      else decode_cpu(params, threads);
    };
    timing.warmup = warmup;
    for (int i = 0; i < warmup; ++i) once();
    timing.seconds = time_host(repeats, once);
    problem.reset_state();  // the timed runs advanced the cache: check one run from the cache as drawn
    problem.poison_outputs();
    once();
    results = {{"out", problem.buffers.at("out")}, {"state", problem.buffers.at("state")}};
  }
  const double t = timing.median();

  std::vector<testing::Comparison> cmps;
  for (const reference::DecodeSlice& slice : slices)
    for (testing::Comparison& c : testing::compare_decode(problem, results, testing::decode_oracle(problem, slice))) {
      if (c.count == 0) continue;  // e.g. no skipped request in the slice
      if (slices.size() > 1) c.name += slice.batch_begin == 0 ? " [first]" : " [last]";
      cmps.push_back(c);
    }
  const bool pass = testing::all_pass(cmps) && guard_damage.empty();
  const double gbps = bytes / t * 1e-9;
  const double ceiling_gbps = copy_s > 0.0 ? bytes / copy_s * 1e-9 : 0.0;

  if (json) {
    std::vector<std::string> errs;
    for (const auto& c : cmps) errs.push_back(comparison_json(c).dump());
    JsonObject o;
    o.str("command", "decode")
        .str("problem", config.describe())
        .integer("batch", config.batch)
        .integer("nheads", config.nheads)
        .integer("headdim", config.headdim)
        .integer("dstate", config.dstate)
        .integer("ngroups", config.ngroups)
        .integer("ntokens", config.ntokens)
        .str("state_dtype", to_string(config.state_dtype))
        .str("dtype", to_string(config.dtype))
        .str("backend", to_string(backend))
        .str("device", describe_backend(backend, threads))
        .timing(timing)
        .num("bytes", bytes)
        .num("GBps", gbps);
    if (on_gpu) {
      o.str("kernel", kernel).num("copy_ceiling_GBps", ceiling_gbps).num("fraction_of_copy_ceiling", ceiling_gbps > 0 ? gbps / ceiling_gbps : 0.0);
      if (!copy_error.empty()) o.str("copy_error", copy_error);
      o.str("guard_damage", guard_damage);
    }
    o.boolean("check_all", args.has("--check-all")).raw("errors", json_array(errs)).boolean("pass", pass);
    std::printf("%s\n", o.dump().c_str());
    return pass ? 0 : 1;
  }

  std::printf("mamba2ssd decode\n");
  std::printf("  problem  %s\n", config.describe().c_str());
  std::printf("  backend  %s\n", describe_backend(backend, threads).c_str());
  if (on_gpu) std::printf("  kernel   %s\n", kernel == "auto" ? "auto (chosen by the call)" : kernel.c_str());
  std::printf("  time     %s\n", timing.describe(on_gpu ? ", L2 cleared before each" : "").c_str());
  std::printf("  traffic  %s MB   %s GB/s\n", fmt_rate(bytes * 1e-6).c_str(), fmt_rate(gbps).c_str());
  if (on_gpu) {
    if (ceiling_gbps > 0)
      std::printf("  ceiling  %s GB/s (cudaMemcpyAsync of the same bytes, device to device)   %.3f of it\n",
                  fmt_rate(ceiling_gbps).c_str(), gbps / ceiling_gbps);
    else
      std::printf("  ceiling  not measured: %s\n", copy_error.c_str());
    std::printf("  guards   %s\n", guard_damage.empty() ? "intact (nothing written outside the cache and out)" : guard_damage.c_str());
  }
  std::printf("  error    against the fp64 oracle on %s\n",
              args.has("--check-all") ? "every request and head" : "requests 0..1 and the last, every head");
  print_comparisons(cmps, 22);
  std::printf("  result   %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace mamba2ssd::cli
