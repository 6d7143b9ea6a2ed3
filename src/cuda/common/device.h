// What the paths ask of the GPU a call runs on (host side): read when a call is planned, from the
// current device.
#pragma once

#include <string>

namespace mamba2ssd::cuda {

struct DeviceInfo {
  int sm_count = 0;          // multiprocessors (segment counts are sized to them)
  int smem_per_sm = 0;       // shared memory bytes a multiprocessor holds (all its blocks together)
  int smem_per_block = 0;    // shared memory bytes one block may take (the opt-in limit)
  int major = 0, minor = 0;  // compute capability
  bool is_sm90() const { return major == 9 && minor == 0; }
  std::string arch() const { return "sm_" + std::to_string(major) + std::to_string(minor); }
};

// Empty if the library's kernels run on a GPU of compute capability major.minor, else the message
// of the CudaError current_device() throws: "this GPU is sm_75; mamba2ssd's CUDA backend needs
// sm_80 or newer" (mma.sync on bf16, cp.async). A pure function, so that a test needs no such GPU.
std::string unsupported_arch(int major, int minor);

// Empty if a block of `need` bytes of shared memory fits the device, else why not: "its kernels need
// `need` bytes of shared memory per block (`what`), this GPU allows ..." (sm_80 allows 163 KiB, sm_86
// and sm_89 99 KiB, sm_90 227 KiB), so that a path refuses the call instead of failing its launch.
std::string smem_refusal(int need, const DeviceInfo& d, const std::string& what);

// The current device's properties; throws CudaError if there is none, or if it is older than sm_80
// (unsupported_arch): the first call that plans or launches says so, instead of a "no kernel image"
// from the first launch.
DeviceInfo current_device();

}  // namespace mamba2ssd::cuda
