#include "execute.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "report.h"
#include "testing/consistency.h"

namespace mamba2ssd::cli {

double Timing::median() const {
  if (seconds.empty()) return 0.0;
  std::vector<double> s = seconds;
  std::sort(s.begin(), s.end());
  const std::size_t n = s.size();
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}
double Timing::min() const { return seconds.empty() ? 0.0 : *std::min_element(seconds.begin(), seconds.end()); }
double Timing::max() const { return seconds.empty() ? 0.0 : *std::max_element(seconds.begin(), seconds.end()); }

std::string Timing::describe(const std::string& note) const {
  const std::size_t n = seconds.size();
  const std::string warm = warmup ? fmt("after %d warm-up", warmup) : "no warm-up";
  if (n == 1) return fmt("%s  (1 run, %s)", fmt_time(median()).c_str(), warm.c_str());
  return fmt("%s  (median of %zu runs, %s%s; min %s, max %s)", fmt_time(median()).c_str(), n, warm.c_str(),
             note.c_str(), fmt_time(min()).c_str(), fmt_time(max()).c_str());
}

Backend resolve(Backend requested) {
  if (requested != Backend::kAuto) return requested;
  return cuda_available() ? Backend::kCuda : Backend::kCpu;
}

std::string describe_backend(Backend b, int threads) {
  switch (b) {
    case Backend::kCuda: return "cuda on " + gpu::device_name();
    case Backend::kCpu: {
      const unsigned n = threads > 0 ? static_cast<unsigned>(threads) : std::max(1u, std::thread::hardware_concurrency());
      return "cpu (" + std::to_string(n) + " threads)";
    }
    case Backend::kReference: return "reference (the fp64 oracle, sequential)";
    default: return to_string(b);
  }
}

Execution execute(testing::HostProblem& problem, Backend backend, int warmup, int repeats, int threads) {
  backend = resolve(backend);
  if (backend == Backend::kCuda) return gpu::execute(problem, warmup, repeats);

  const ForwardParams p = problem.params();
  validate(p);
  auto once = [&] {
    if (backend == Backend::kReference) forward_reference(p);
    else forward_cpu(p, threads);
  };
  Execution e;
  e.backend = backend;
  e.timing.warmup = warmup;
  for (int i = 0; i < warmup; ++i) once();
  e.timing.seconds = time_host(repeats, once);
  return e;
}

Execution execute_exact(testing::HostProblem& problem, Backend backend, int warmup, int repeats, int threads) {
  backend = resolve(backend);
  if (backend == Backend::kCuda) return gpu::execute_exact(problem, warmup, repeats);

  const ForwardParams f = problem.params();
  const DecodeParams d = testing::decode_piece(f, 0, f.seqlen, f.final_states, f.final_states_stride);
  validate(d);
  std::vector<uint8_t>& cache = problem.buffers.at("final_states");
  auto start = [&] {  // the prompt's state before its first token
    if (f.initial_states) std::memcpy(cache.data(), f.initial_states, cache.size());
    else std::fill(cache.begin(), cache.end(), 0);
  };
  auto once = [&] {
    if (backend == Backend::kReference) decode_reference(d);
    else decode_cpu(d, threads);
  };
  Execution e;
  e.backend = backend;
  e.timing.warmup = warmup;
  start();
  for (int i = 0; i < warmup; ++i) once();
  e.timing.seconds = time_host(repeats, once);
  problem.poison_outputs();
  start();
  once();
  return e;
}

BackwardExecution execute_backward(testing::BackwardProblem& problem, Backend backend, int warmup, int repeats,
                                   int threads) {
  backend = resolve(backend);
  problem.poison_gradients();
  if (backend == Backend::kCuda) return gpu::execute_backward(problem, warmup, repeats);

  const ForwardParams fp = problem.forward.params();
  const BackwardParams bp = problem.params();
  const bool oracle = backend == Backend::kReference;
  auto forward_once = [&] { oracle ? forward_reference(fp) : forward_cpu(fp, threads); };
  auto backward_once = [&] { oracle ? backward_reference(bp) : backward_cpu(bp, threads); };
  BackwardExecution e;
  e.backend = backend;
  e.forward_backward.warmup = e.backward.warmup = warmup;
  for (int i = 0; i < warmup; ++i) forward_once(), backward_once();
  e.forward_backward.seconds = time_host(repeats, [&] { forward_once(), backward_once(); });
  e.backward.seconds = time_host(repeats, backward_once);
  return e;
}

double gpu::Floor::floor_seconds(double bytes, double flops) const {
  const double t_copy = copy_bytes_per_s > 0.0 ? bytes / copy_bytes_per_s : 0.0;
  const double t_math = matmul_flops_per_s > 0.0 ? flops / matmul_flops_per_s : 0.0;
  return std::max(t_copy, t_math);
}

}  // namespace mamba2ssd::cli
