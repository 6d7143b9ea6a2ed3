#include "testing/device_decode_problem.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda/common/check.h"

namespace mamba2ssd::testing {

DeviceDecodeProblem::DeviceDecodeProblem(const HostDecodeProblem& host) : host_(host) {
  const DecodeConfig& c = host.config;
  // A guard of at least one slot (and one out row block), a multiple of 256 bytes so that every
  // buffer keeps cudaMalloc's alignment.
  const std::size_t slot_bytes = static_cast<std::size_t>(host.state_stride.s0) * dtype_size(c.state_dtype);
  const std::size_t guard = (std::max<std::size_t>(slot_bytes, 4096) + 255) / 256 * 256;
  try {
    for (const auto& [name, buf] : host.buffers) {
      const bool guarded = name == "state" || name == "out";
      const std::size_t g = guarded ? guard : 0;
      void* allocation = nullptr;
      cuda_check(cudaMalloc(&allocation, buf.size() + 2 * g + 1), "cudaMalloc(decode problem buffer)");
      uint8_t* d = static_cast<uint8_t*>(allocation);
      base_[name] = d, guard_[name] = g;
      cuda_check(cudaMemset(d, kGuardByte, buf.size() + 2 * g + 1), "cudaMemset(guard)");
      cuda_check(cudaMemcpy(d + g, buf.data(), buf.size(), cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
    }
  } catch (...) {
    for (auto& [name, d] : base_) cudaFree(d);
    throw;
  }
}

DeviceDecodeProblem::~DeviceDecodeProblem() {
  for (auto& [name, d] : base_) cudaFree(d);
}

DecodeParams DeviceDecodeProblem::params() const {
  return host_.params([this](const std::string& name) -> void* { return ptr(name); });
}

void DeviceDecodeProblem::launch(void* stream) { decode_cuda(params(), stream); }

void DeviceDecodeProblem::poison_outputs() {
  cuda_check(cudaMemset(ptr("out"), 0xff, host_.buffers.at("out").size()), "cudaMemset(poison)");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(poison)");
}

void DeviceDecodeProblem::reset_state() {
  cuda_check(cudaMemcpy(ptr("state"), host_.initial_state.data(), host_.initial_state.size(), cudaMemcpyHostToDevice),
             "cudaMemcpy(reset state)");
}

std::map<std::string, std::vector<uint8_t>> DeviceDecodeProblem::download() const {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(download)");
  std::map<std::string, std::vector<uint8_t>> out;
  for (const char* name : {"out", "state"}) {
    auto& dst = out[name] = std::vector<uint8_t>(host_.buffers.at(name).size());
    cuda_check(cudaMemcpy(dst.data(), ptr(name), dst.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
  }
  return out;
}

std::string DeviceDecodeProblem::guard_damage() const {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(guards)");
  for (const char* name : {"state", "out"}) {
    const std::size_t g = guard_.at(name), n = host_.buffers.at(name).size();
    std::vector<uint8_t> all(n + 2 * g + 1);
    cuda_check(cudaMemcpy(all.data(), base_.at(name), all.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(guards)");
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (i >= g && i < g + n) continue;
      if (all[i] != kGuardByte)
        return std::string(name) + (i < g ? ": the guard before it changed at byte -" + std::to_string(g - i)
                                          : ": the guard after it changed at byte +" + std::to_string(i - g - n));
    }
  }
  return "";
}

}  // namespace mamba2ssd::testing
