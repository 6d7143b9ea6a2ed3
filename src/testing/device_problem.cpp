#include "testing/device_problem.h"

#include <cuda_runtime_api.h>

#include "cuda/common/check.h"

namespace mamba2ssd::testing {

DeviceProblem::DeviceProblem(const HostProblem& host) : host_(host) {
  try {
    for (const auto& [name, buf] : host.buffers) {
      void* d = nullptr;
      cuda_check(cudaMalloc(&d, buf.empty() ? 1 : buf.size()), "cudaMalloc(problem buffer)");
      device_[name] = d;
      cuda_check(cudaMemcpy(d, buf.data(), buf.size(), cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
    }
    ensure_workspace();
  } catch (...) {
    for (auto& [name, d] : device_) cudaFree(d);
    throw;
  }
}

DeviceProblem::~DeviceProblem() {
  for (auto& [name, d] : device_) cudaFree(d);
  cudaFree(workspace_);
}

ForwardParams DeviceProblem::params() const {
  return host_.params([this](const std::string& name) { return device_.at(name); });
}

void DeviceProblem::ensure_workspace() {
  const std::size_t need = cuda_workspace_bytes(params());
  if (workspace_ && need <= workspace_bytes_) return;
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(workspace)");
  cudaFree(workspace_);
  workspace_ = nullptr;
  cuda_check(cudaMalloc(&workspace_, need ? need : 1), "cudaMalloc(workspace)");
  workspace_bytes_ = need;
}

void DeviceProblem::launch(void* stream) {
  ensure_workspace();
  forward_cuda(params(), workspace_, workspace_bytes_, stream);
}

void DeviceProblem::poison_outputs() {
  for (const auto& [name, buf] : host_.buffers)
    if (HostProblem::is_output(name))
      cuda_check(cudaMemset(device_.at(name), 0xff, buf.size()), "cudaMemset(poison)");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(poison)");
}

std::map<std::string, std::vector<uint8_t>> DeviceProblem::download_outputs() const {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(download)");
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& [name, buf] : host_.buffers) {
    if (!HostProblem::is_output(name)) continue;
    auto& dst = out[name] = std::vector<uint8_t>(buf.size());
    cuda_check(cudaMemcpy(dst.data(), device_.at(name), buf.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
  }
  return out;
}

DeviceBackwardProblem::DeviceBackwardProblem(const BackwardProblem& host) : host_(host) {
  try {
    for (const auto* buffers : {&host.forward.buffers, &host.buffers})
      for (const auto& [name, buf] : *buffers) {
        void* d = nullptr;
        cuda_check(cudaMalloc(&d, buf.empty() ? 1 : buf.size()), "cudaMalloc(problem buffer)");
        device_[name] = d;
        cuda_check(cudaMemcpy(d, buf.data(), buf.size(), cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
      }
    workspace_bytes_ = cuda_backward_workspace_bytes(params());
    cuda_check(cudaMalloc(&workspace_, workspace_bytes_ ? workspace_bytes_ : 1), "cudaMalloc(workspace)");
    if (host.saves_states()) {  // (launch_forward's; refused, as the forward would refuse the call)
      forward_workspace_bytes_ = cuda_workspace_bytes(params().fwd);
      cuda_check(cudaMalloc(&forward_workspace_, forward_workspace_bytes_ ? forward_workspace_bytes_ : 1),
                 "cudaMalloc(forward workspace)");
    }
  } catch (...) {
    for (auto& [name, d] : device_) cudaFree(d);
    cudaFree(workspace_);
    throw;
  }
}

DeviceBackwardProblem::~DeviceBackwardProblem() {
  for (auto& [name, d] : device_) cudaFree(d);
  cudaFree(workspace_);
  cudaFree(forward_workspace_);
}

void DeviceBackwardProblem::launch_forward(void* stream) {
  if (!forward_workspace_) throw Error("DeviceBackwardProblem::launch_forward: the host problem saves no states");
  forward_cuda(params().fwd, forward_workspace_, forward_workspace_bytes_, stream);
}

BackwardParams DeviceBackwardProblem::params() const {
  return host_.params([this](const std::string& name) { return device_.at(name); });
}

void DeviceBackwardProblem::launch(void* stream) { backward_cuda(params(), workspace_, workspace_bytes_, stream); }

void DeviceBackwardProblem::poison_gradients() {
  for (const auto& [grad, view] : host_.gradients)
    cuda_check(cudaMemset(device_.at(view.buffer), 0xff, host_.buffers.at(view.buffer).size()), "cudaMemset(poison)");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(poison)");
}

void DeviceBackwardProblem::poison_forward_outputs() {
  for (const auto& [name, buf] : host_.forward.buffers)
    if (HostProblem::is_output(name)) cuda_check(cudaMemset(device_.at(name), 0xff, buf.size()), "cudaMemset(poison)");
  if (host_.saves_states())
    cuda_check(cudaMemset(device_.at("saved_states"), 0xff, host_.buffers.at("saved_states").size()),
               "cudaMemset(poison)");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(poison)");
}

std::map<std::string, std::vector<uint8_t>> DeviceBackwardProblem::download_forward_outputs() const {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(download)");
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& [name, buf] : host_.forward.buffers) {
    if (!HostProblem::is_output(name)) continue;
    auto& dst = out[name] = std::vector<uint8_t>(buf.size());
    cuda_check(cudaMemcpy(dst.data(), device_.at(name), buf.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
  }
  return out;
}

std::map<std::string, std::vector<uint8_t>> DeviceBackwardProblem::download() const {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(download)");
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& [name, buf] : host_.buffers) {
    auto& dst = out[name] = std::vector<uint8_t>(buf.size());
    cuda_check(cudaMemcpy(dst.data(), device_.at(name), buf.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
  }
  return out;
}

}  // namespace mamba2ssd::testing
