#include "testing/device_prefill_problem.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "cuda/common/check.h"

namespace mamba2ssd::testing {
namespace {

template <typename T>
T* upload(const std::vector<T>& v, const char* what) {
  if (v.empty()) return nullptr;
  void* d = nullptr;
  cuda_check(cudaMalloc(&d, v.size() * sizeof(T)), what);
  cuda_check(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), what);
  return static_cast<T*>(d);
}

}  // namespace

DevicePrefillProblem::DevicePrefillProblem(const HostPrefillProblem& host) : host_(host), fwd_(host.fwd) {
  const std::size_t slot_bytes = static_cast<std::size_t>(host.state_stride.s0) * dtype_size(host.config.state_dtype);
  guard_ = (std::max<std::size_t>(slot_bytes, 4096) + 255) / 256 * 256;  // keeps cudaMalloc's alignment
  const std::size_t n = host.initial_state.size() + 2 * guard_;
  try {
    void* base = nullptr;
    cuda_check(cudaMalloc(&base, n), "cudaMalloc(prefill cache)");
    state_base_ = static_cast<uint8_t*>(base);
    cuda_check(cudaMemset(state_base_, kGuardByte, n), "cudaMemset(guard)");
    slots_ = upload(host.slots, "upload(slots)");
    has_initial_state_ = upload(host.has_initial_state, "upload(has_initial_state)");
    intermediate_slots_ = upload(host.intermediate_slots, "upload(intermediate_slots)");
    PrefillParams three_kernel = params();
    three_kernel.fwd.cuda_path = CudaPath::kThreeKernel;
    workspace_bytes_ = std::max(cuda_prefill_workspace_bytes(params()), cuda_prefill_workspace_bytes(three_kernel));
    cuda_check(cudaMalloc(&workspace_, std::max<std::size_t>(workspace_bytes_, 1)), "cudaMalloc(workspace)");
    reset();
  } catch (...) {
    for (void* p : {static_cast<void*>(state_base_), static_cast<void*>(slots_), static_cast<void*>(has_initial_state_),
                    static_cast<void*>(intermediate_slots_), workspace_})
      cudaFree(p);
    throw;
  }
}

DevicePrefillProblem::~DevicePrefillProblem() {
  for (void* p : {static_cast<void*>(state_base_), static_cast<void*>(slots_), static_cast<void*>(has_initial_state_),
                  static_cast<void*>(intermediate_slots_), workspace_})
    cudaFree(p);
}

PrefillParams DevicePrefillProblem::params() const {
  PrefillParams p = const_cast<HostPrefillProblem&>(host_).params();  // (params() only takes addresses)
  p.fwd = fwd_.params();
  p.state = state();
  p.slots = slots_;
  p.has_initial_state = has_initial_state_;
  p.intermediate_slots = intermediate_slots_;
  return p;
}

void DevicePrefillProblem::launch(void* stream, CudaPath path) {
  PrefillParams p = params();
  p.fwd.cuda_path = path;
  prefill_cuda(p, workspace_, workspace_bytes_, stream);
}

void DevicePrefillProblem::reset() {
  fwd_.poison_outputs();
  cuda_check(cudaMemcpy(state(), host_.initial_state.data(), host_.initial_state.size(), cudaMemcpyHostToDevice),
             "cudaMemcpy(reset cache)");
}

void DevicePrefillProblem::download(HostPrefillProblem& into) const {
  auto out = fwd_.download_outputs();
  into.fwd.buffers.at("y") = out.at("y");
  into.state.resize(host_.initial_state.size());
  cuda_check(cudaMemcpy(into.state.data(), state(), into.state.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(download cache)");
}

std::string DevicePrefillProblem::guard_damage() const {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(guards)");
  const std::size_t n = host_.initial_state.size();
  std::vector<uint8_t> all(n + 2 * guard_);
  cuda_check(cudaMemcpy(all.data(), state_base_, all.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(guards)");
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i >= guard_ && i < guard_ + n) continue;
    if (all[i] != kGuardByte)
      return i < guard_ ? "state: the guard before it changed at byte -" + std::to_string(guard_ - i)
                        : "state: the guard after it changed at byte +" + std::to_string(i - guard_ - n);
  }
  return "";
}

}  // namespace mamba2ssd::testing
