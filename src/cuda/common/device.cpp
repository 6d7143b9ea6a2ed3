#include "cuda/common/device.h"

#include <cuda_runtime_api.h>

#include "cuda/common/check.h"

namespace mamba2ssd::cuda {

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
  d.major = attribute(cudaDevAttrComputeCapabilityMajor);
  d.minor = attribute(cudaDevAttrComputeCapabilityMinor);
  return d;
}

}  // namespace mamba2ssd::cuda
