#include "cuda/common/device.h"

#include <cuda_runtime_api.h>

#include "cuda/common/check.h"

namespace mamba2ssd::cuda {

std::string smem_refusal(int need, const DeviceInfo& d, const std::string& what) {
  if (need <= d.smem_per_block) return "";
  return "its kernels need " + std::to_string(need) + " bytes of shared memory per block (" + what + "), this " +
         d.arch() + " GPU allows " + std::to_string(d.smem_per_block);
}

std::string unsupported_arch(int major, int minor) {
  if (major >= 8) return "";
  return "this GPU is sm_" + std::to_string(major) + std::to_string(minor) +
         "; mamba2ssd's CUDA backend needs sm_80 or newer";
}

DeviceInfo current_device() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  auto attribute = [device](cudaDeviceAttr attr) {
    int value = 0;
    cuda_check(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
    return value;
  };
  DeviceInfo d;
  d.sm_count = attribute(cudaDevAttrMultiProcessorCount);
  d.smem_per_sm = attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  d.smem_per_block = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  d.major = attribute(cudaDevAttrComputeCapabilityMajor);
  d.minor = attribute(cudaDevAttrComputeCapabilityMinor);
  if (std::string why = unsupported_arch(d.major, d.minor); !why.empty()) throw CudaError(why);
  return d;
}

}  // namespace mamba2ssd::cuda
