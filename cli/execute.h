// Running one problem on one backend, timed: host backends with std::chrono around the call, CUDA
// with cudaEvents around each DeviceProblem::launch (and the decode and prefill problems' launches). Also the GPU's floor (copy bandwidth, bf16
// matmul rate). The CUDA half lives in gpu.cpp (or gpu_none.cpp in a build without CUDA).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"
#include "testing/consistency.h"
#include "testing/decode_problem.h"
#include "testing/backward_problem.h"
#include "testing/prefill_problem.h"
#include "testing/problem.h"

namespace mamba2ssd::cli {

using Buffers = std::map<std::string, std::vector<uint8_t>>;

struct Timing {
  int warmup = 0;
  std::vector<double> seconds;  // one per timed run
  double median() const;
  double min() const;
  double max() const;
  // "41.2 us  (median of 20 runs, after 1 warm-up<note>; min 40.9 us, max 43.0 us)", or
  // "41.2 us  (1 run, after 1 warm-up)": the report's time line.
  std::string describe(const std::string& note = "") const;
};

// Host wall-clock seconds of each of `repeats` calls of `work` (the host backends' timings; `before`
// runs ahead of each call, outside the timed region).
template <typename Work, typename Before>
std::vector<double> time_host(int repeats, Work&& work, Before&& before) {
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    before();
    const auto t0 = std::chrono::steady_clock::now();
    work();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return seconds;
}
template <typename Work>
std::vector<double> time_host(int repeats, Work&& work) {
  return time_host(repeats, work, [] {});
}

struct Execution {
  Backend backend = Backend::kCpu;
  Timing timing;
  Buffers downloaded;  // outputs copied back from the GPU (empty for host backends)
  // The outputs of the last run, laid out as the problem's buffers.
  const Buffers& outputs(const testing::HostProblem& problem) const {
    return backend == Backend::kCuda ? downloaded : problem.buffers;
  }
};

// The backward of one problem, timed two ways: forward then backward (what a training step costs), and
// the backward alone.
struct BackwardExecution {
  Backend backend = Backend::kCpu;
  Timing forward_backward, backward;
  Buffers downloaded;  // the gradient buffers copied back from the GPU (empty for host backends)
  // The gradients of the last run, laid out as the problem's buffers.
  const Buffers& gradients(const testing::BackwardProblem& problem) const {
    return backend == Backend::kCuda ? downloaded : problem.buffers;
  }
};

// `auto` resolved: CUDA when a GPU is visible, else CPU.
Backend resolve(Backend requested);

// For reports: "cuda on NVIDIA H200 (sm_90, 132 SMs)", "cpu (16 threads)", "reference (...)".
std::string describe_backend(Backend backend, int threads);

// Runs `problem` `warmup` times untimed, then `repeats` times timed. Host backends write into
// problem.buffers (poisoned beforehand by HostProblem). threads: for the CPU backend (0: all).
Execution execute(testing::HostProblem& problem, Backend backend, int warmup, int repeats, int threads);

// The same for the backward: `warmup` untimed forward + backward runs, then `repeats` timed forward +
// backward runs, then `repeats` timed backward runs. The gradient buffers are poisoned (NaN) first.
// repeats 0: the warm-up runs only (a check).
BackwardExecution execute_backward(testing::BackwardProblem& problem, Backend backend, int warmup, int repeats,
                                   int threads);

// The exact mode of prefill on the problem (docs/serving.md, "Consistency"): the decode step over all
// L tokens, its fp32 cache the final_states buffer, which starts as initial_states (or zeros).
// `warmup` untimed and `repeats` timed runs (each advancing the cache), then one checked run from the
// initial state with y poisoned; its y and final_states come back as the outputs. Needs final
// states, no packed sequences, and initial_states laid out as final_states (the cache starts as a
// byte copy of them; run refuses padded ones).
Execution execute_exact(testing::HostProblem& problem, Backend backend, int warmup, int repeats, int threads);

namespace gpu {

// "NVIDIA H200 (sm_90, 132 SMs)", or "" without a GPU.
std::string device_name();

// Uploads the problem, poisons its outputs, launches `warmup` times, then `repeats` launches each
// between two cudaEvents (the L2 cache cleared before each, outside the events), and downloads the
// outputs.
Execution execute(const testing::HostProblem& problem, int warmup, int repeats);

// The backward likewise (testing::DeviceBackwardProblem, the forward on a DeviceProblem of its own):
// each timed run between two cudaEvents after an L2 flush. Downloads the backward's buffers.
BackwardExecution execute_backward(const testing::BackwardProblem& problem, int warmup, int repeats);

// execute_exact on the GPU (decode_cuda on a DeviceProblem, timed like execute).
Execution execute_exact(const testing::HostProblem& problem, int warmup, int repeats);

// The consistency rules' ways on the GPU (testing/device_consistency.h).
std::vector<testing::WayResult> consistency_ways(const testing::ConsistencyConfig& config,
                                                 const testing::HostProblem& problem);

// The CUDA paths that take the problem, in the registry's order: explain_cuda on a device copy of it
// (a path's verdict depends on the device pointers' alignment, not on the host buffers').
std::vector<CudaPath> paths_taking(const testing::HostProblem& problem);

// The decode step on the GPU: uploads the problem (the cache between guards), launches `warmup`
// times, then `repeats` launches each between two cudaEvents (the L2 cache cleared before each),
// then one more from the cache as drawn, with out poisoned, whose out and cache come back in
// `results` (the timed launches advanced the cache). With copy_bytes > 0 it also times
// cudaMemcpyAsync of that many bytes device to device the same way (the copy ceiling).
struct DecodeExecution {
  Timing timing;
  Buffers results;            // "out" and "state", laid out as the host problem's
  std::string guard_damage;   // empty: nothing outside the cache and out was written
  double copy_seconds = 0.0;  // median of the copies, 0 if not measured
  std::string copy_error;
};
DecodeExecution execute_decode(const testing::HostDecodeProblem& problem, int warmup, int repeats, double copy_bytes);

// The packed prefill on the GPU (testing::DevicePrefillProblem: the cache between guards, its own
// workspace): `warmup` launches of prefill_cuda, then `repeats` launches each between two cudaEvents
// (the L2 cache cleared before each), then one more from the cache as drawn with y poisoned, whose y
// and cache are downloaded into `problem` (its cache as drawn stays in initial_state), ready for
// compare_prefill. The timed launches advance the cache: the same work on other values. `path`:
// fwd.cuda_path of every launch (auto, hopper or three_kernel).
struct PrefillExecution {
  Timing timing;
  std::string guard_damage;        // empty: nothing outside the cache was written
  std::size_t workspace_bytes = 0;  // cuda_prefill_workspace_bytes of the call
  std::string path;                // the path that ran, and with auto why not the hopper path
};
PrefillExecution execute_prefill(testing::HostPrefillProblem& problem, int warmup, int repeats,
                                 CudaPath path = CudaPath::kAuto);

// Why the hopper path refuses the prefill on a device copy of `problem` (its workspace query's
// message), or "" if it takes it.
std::string hopper_prefill_refusal(const testing::HostPrefillProblem& problem);

// The floor's two rates, measured now on the current GPU. A rate that could not be measured is 0,
// with the reason in *_error.
struct Floor {
  double copy_bytes_per_s = 0.0;   // cudaMemcpyAsync device to device, bytes read + written
  double copy_bytes = 0.0;         // size of one copy
  double matmul_flops_per_s = 0.0; // cublasGemmEx 8192^3, bf16 in, fp32 accumulate
  std::string copy_error, matmul_error;
  double floor_seconds(double bytes, double flops) const;
};
Floor measure_floor();

}  // namespace gpu
}  // namespace mamba2ssd::cli
