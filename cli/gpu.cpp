// The CLI's CUDA half: timed launches of a DeviceProblem (forward, and forward + backward), of the
// decode and packed prefill problems, and the floor's two measurements.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#ifdef MAMBA2SSD_CLI_CUBLAS
#include <cublas_v2.h>
#endif

#include "execute.h"
#include "testing/device_consistency.h"
#include "testing/device_decode_problem.h"
#include "testing/device_prefill_problem.h"
#include "testing/device_problem.h"

namespace mamba2ssd::cli::gpu {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw CudaError(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) { check(cudaMalloc(&ptr_, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

class Event {
 public:
  Event() { check(cudaEventCreate(&event_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_{};
};

// Times `repeats` calls of `work` on the default stream, each between two events; `before` runs
// ahead of each start event (outside the timed region). Returns seconds per call.
template <typename Before, typename Work>
std::vector<double> time_each(int repeats, Before&& before, Work&& work) {
  std::vector<Event> start(static_cast<std::size_t>(repeats)), stop(static_cast<std::size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    before(i);
    check(cudaEventRecord(start[i].get(), nullptr), "cudaEventRecord");
    work();
    check(cudaEventRecord(stop[i].get(), nullptr), "cudaEventRecord");
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(timed runs)");
  check(cudaGetLastError(), "timed runs");
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start[i].get(), stop[i].get()), "cudaEventElapsedTime");
    seconds.push_back(ms * 1e-3);
  }
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Bytes to clear the L2 cache with: four times its size, at least 256 MiB (as triton's do_bench).
std::size_t l2_flush_bytes() {
  int device = 0, l2 = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute(L2)");
  return std::max<std::size_t>(std::size_t{256} << 20, std::size_t{4} * static_cast<std::size_t>(l2));
}

// time_each's `before` for cold-cache timings: clears the L2 cache by writing l2_flush_bytes().
class L2Flush {
 public:
  L2Flush() : buf_(l2_flush_bytes()) {}
  void operator()(int i) const {
    check(cudaMemsetAsync(buf_.get(), i & 0xff, buf_.bytes(), nullptr), "cudaMemsetAsync(L2 flush)");
  }

 private:
  DeviceBuffer buf_;
};

#ifdef MAMBA2SSD_CLI_CUBLAS
void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw CudaError(std::string(what) + ": " + cublasGetStatusString(s));
}

class Cublas {
 public:
  Cublas() { check_cublas(cublasCreate(&handle_), "cublasCreate"); }
  ~Cublas() { cublasDestroy(handle_); }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_{};
};

// bf16 8192^3 with fp32 accumulation, on random operands (zeros would flatter the clock).
double measure_matmul() {
  constexpr int n = 8192;
  const std::size_t elems = static_cast<std::size_t>(n) * n, bytes = elems * 2;
  DeviceBuffer a(bytes), b(bytes), c(bytes);
  {
    std::vector<uint16_t> host(elems);
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (auto& h : host) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      const float f = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      h = static_cast<uint16_t>(u >> 16);
    }
    check(cudaMemcpy(a.get(), host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(matmul A)");
    check(cudaMemcpy(b.get(), host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(matmul B)");
  }
  Cublas handle;
  check_cublas(cublasSetStream(handle.get(), nullptr), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    check_cublas(cublasGemmEx(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                              b.get(), CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  };
  for (int i = 0; i < 3; ++i) gemm();
  const double t = median(time_each(20, [](int) {}, gemm));
  return 2.0 * n * static_cast<double>(n) * n / t;
}
#endif

}  // namespace

std::string device_name() {
  if (!cuda_available()) return "";
  int device = 0;
  cudaDeviceProp prop{};
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(prop.multiProcessorCount) + " SMs)";
}

Execution execute(const testing::HostProblem& problem, int warmup, int repeats) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is visible");
  testing::DeviceProblem dp(problem);
  dp.poison_outputs();
  Execution e;
  e.backend = Backend::kCuda;
  e.timing.warmup = warmup;
  for (int i = 0; i < warmup; ++i) dp.launch(nullptr);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(warm-up)");
  if (repeats > 0) e.timing.seconds = time_each(repeats, L2Flush(), [&] { dp.launch(nullptr); });
  e.downloaded = dp.download_outputs();
  return e;
}

DecodeExecution execute_decode(const testing::HostDecodeProblem& problem, int warmup, int repeats,
                               double copy_bytes) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is visible");
  testing::DeviceDecodeProblem dp(problem);
  DecodeExecution e;
  e.timing.warmup = warmup;
  for (int i = 0; i < warmup; ++i) dp.launch(nullptr);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(warm-up)");
  if (repeats > 0) e.timing.seconds = time_each(repeats, L2Flush(), [&] { dp.launch(nullptr); });
  // The copy ceiling, timed like the launches: the same bytes read and written, L2 cleared first.
  if (copy_bytes > 0) {
    try {
      const std::size_t half = static_cast<std::size_t>(copy_bytes / 2) / 256 * 256 + 256;
      DeviceBuffer src(half), dst(half);
      check(cudaMemset(src.get(), 1, half), "cudaMemset");
      auto copy = [&] {
        check(cudaMemcpyAsync(dst.get(), src.get(), half, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
      };
      copy();
      e.copy_seconds = median(time_each(std::max(repeats, 10), L2Flush(), copy)) * copy_bytes / (2.0 * static_cast<double>(half));
    } catch (const CudaError& err) {
      e.copy_error = err.what();
      cudaGetLastError();
    }
  }
  // The checked launch: from the cache as drawn, out poisoned.
  dp.reset_state();
  dp.poison_outputs();
  dp.launch(nullptr);
  e.results = dp.download();
  e.guard_damage = dp.guard_damage();
  return e;
}

namespace {

// Why the hopper path refuses the prefill on the device problem ("" if it takes it): its workspace
// query says, as a call would.
std::string hopper_prefill_refusal(const testing::DevicePrefillProblem& dp) {
  PrefillParams p = dp.params();
  p.fwd.cuda_path = CudaPath::kHopper;
  try {
    (void)cuda_prefill_workspace_bytes(p);
    return "";
  } catch (const Error& err) {
    return err.what();
  }
}

}  // namespace

std::string hopper_prefill_refusal(const testing::HostPrefillProblem& problem) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is visible");
  return hopper_prefill_refusal(testing::DevicePrefillProblem(problem));
}

PrefillExecution execute_prefill(testing::HostPrefillProblem& problem, int warmup, int repeats, CudaPath path) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is visible");
  testing::DevicePrefillProblem dp(problem);  // uploads, the cache as drawn, y poisoned
  PrefillExecution e;
  e.workspace_bytes = dp.workspace_bytes();
  e.path = to_string(path);
  if (path == CudaPath::kAuto) {  // the hopper path runs a call it takes
    const std::string refusal = hopper_prefill_refusal(dp);
    e.path = refusal.empty() ? "hopper" : "three-kernel (" + refusal + ")";
  }
  e.timing.warmup = warmup;
  for (int i = 0; i < warmup; ++i) dp.launch(nullptr, path);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(warm-up)");
  if (repeats > 0) e.timing.seconds = time_each(repeats, L2Flush(), [&] { dp.launch(nullptr, path); });
  // The checked launch: from the cache as drawn, y poisoned (reset synchronizes).
  dp.reset();
  dp.launch(nullptr, path);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(checked run)");
  check(cudaGetLastError(), "checked run");
  dp.download(problem);
  e.guard_damage = dp.guard_damage();
  return e;
}

Execution execute_exact(const testing::HostProblem& problem, int warmup, int repeats) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is visible");
  testing::DeviceProblem dp(problem);
  const ForwardParams f = dp.params();
  const DecodeParams d = testing::decode_piece(f, 0, f.seqlen, f.final_states, f.final_states_stride);
  const std::size_t state_bytes = problem.buffers.at("final_states").size();
  auto start = [&] {  // the prompt's state before its first token
    if (f.initial_states)
      check(cudaMemcpyAsync(f.final_states, f.initial_states, state_bytes, cudaMemcpyDeviceToDevice, nullptr),
            "cudaMemcpyAsync(initial state)");
    else check(cudaMemsetAsync(f.final_states, 0, state_bytes, nullptr), "cudaMemsetAsync(initial state)");
  };
  Execution e;
  e.backend = Backend::kCuda;
  e.timing.warmup = warmup;
  start();
  for (int i = 0; i < warmup; ++i) decode_cuda(d, nullptr);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(warm-up)");
  if (repeats > 0) e.timing.seconds = time_each(repeats, L2Flush(), [&] { decode_cuda(d, nullptr); });
  dp.poison_outputs();
  start();
  decode_cuda(d, nullptr);
  e.downloaded = dp.download_outputs();
  return e;
}

std::vector<testing::WayResult> consistency_ways(const testing::ConsistencyConfig& config,
                                                 const testing::HostProblem& problem) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is visible");
  return testing::run_ways_cuda(config, problem);
}

BackwardExecution execute_backward(const testing::BackwardProblem& problem, int warmup, int repeats) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is visible");
  testing::DeviceProblem forward(problem.forward);
  testing::DeviceBackwardProblem backward(problem);  // inputs, cotangents, gradients poisoned as on the host
  BackwardExecution e;
  e.backend = Backend::kCuda;
  e.forward_backward.warmup = e.backward.warmup = warmup;
  // With saved states (--save-states) the forward runs on the backward's buffers, saving them there.
  auto run_forward = [&] { problem.saves_states() ? backward.launch_forward(nullptr) : forward.launch(nullptr); };
  for (int i = 0; i < warmup; ++i) run_forward(), backward.launch(nullptr);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(warm-up)");
  if (repeats > 0) {
    const L2Flush clear_l2;
    e.forward_backward.seconds = time_each(repeats, clear_l2, [&] { run_forward(), backward.launch(nullptr); });
    e.backward.seconds = time_each(repeats, clear_l2, [&] { backward.launch(nullptr); });
  }
  e.downloaded = backward.download();
  return e;
}

std::vector<CudaPath> paths_taking(const testing::HostProblem& problem) {
  if (!cuda_available()) throw CudaError("backend cuda: no CUDA device is visible");
  testing::DeviceProblem dp(problem);
  std::vector<CudaPath> paths;
  for (const CudaPathVerdict& v : explain_cuda(dp.params()).paths)
    if (v.refusal.empty()) paths.push_back(v.path);
  return paths;
}

Floor measure_floor() {
  Floor f;
  if (!cuda_available()) {
    f.copy_error = f.matmul_error = "no CUDA device is visible";
    return f;
  }
  try {
    const std::size_t bytes = std::size_t{1} << 30;  // 1 GiB each way
    DeviceBuffer src(bytes), dst(bytes);
    check(cudaMemset(src.get(), 1, bytes), "cudaMemset");
    auto copy = [&] {
      check(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
    };
    for (int i = 0; i < 2; ++i) copy();
    f.copy_bytes = static_cast<double>(bytes);
    f.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / median(time_each(10, [](int) {}, copy));
  } catch (const CudaError& e) {
    f.copy_error = e.what();
    cudaGetLastError();
  }
#ifdef MAMBA2SSD_CLI_CUBLAS
  try {
    f.matmul_flops_per_s = measure_matmul();
  } catch (const CudaError& e) {
    f.matmul_error = e.what();
    cudaGetLastError();
  }
#else
  f.matmul_error = "this build of the CLI has no cuBLAS";
#endif
  return f;
}

}  // namespace mamba2ssd::cli::gpu
