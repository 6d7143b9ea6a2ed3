// What the paths ask of the GPU a call runs on (host side): read when a call is planned, from the
// current device.
#pragma once

#include <string>

namespace mamba2ssd::cuda {

struct DeviceInfo {
  int sm_count = 0;          // multiprocessors (segment counts are sized to them)
  int major = 0, minor = 0;  // compute capability
  bool is_sm90() const { return major == 9 && minor == 0; }
  std::string arch() const { return "sm_" + std::to_string(major) + std::to_string(minor); }
};

// The current device's properties; throws CudaError if there is none.
DeviceInfo current_device();

}  // namespace mamba2ssd::cuda
