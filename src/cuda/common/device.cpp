#include "cuda/common/device.h"

#include <cuda_runtime_api.h>

#include "cuda/common/check.h"

namespace mamba2ssd::cuda {

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
  d.major = attribute(cudaDevAttrComputeCapabilityMajor);
  d.minor = attribute(cudaDevAttrComputeCapabilityMinor);
  if (std::string why = unsupported_arch(d.major, d.minor); !why.empty()) throw CudaError(why);
  return d;
}

}  // namespace mamba2ssd::cuda
