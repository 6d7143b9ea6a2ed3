// Programmatic dependent launch (sm_90), the device side; the host side is launch() in launch.h.
// A kernel launched with the programmatic stream serialization attribute may start while the kernel
// before it still runs: it sets up, then calls wait_previous_kernel before it touches anything that
// kernel writes (a no-op for a kernel launched without the attribute, and before sm_90).
// start_next_kernel lets such a next kernel start now.
#pragma once

namespace mamba2ssd::cuda {

__device__ __forceinline__ void wait_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void start_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace mamba2ssd::cuda
