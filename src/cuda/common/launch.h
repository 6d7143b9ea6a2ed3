// Host helpers every path's launches use: the shared-memory opt-in and one launch call that can
// chain a kernel behind the one before it (programmatic dependent launch, sm_90). Kernels take
// their arguments as one struct by value.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/check.h"

namespace mamba2ssd::cuda {

// Raises a kernel's dynamic shared-memory limit to `bytes` when they and the kernel's static shared
// memory need more than the default 48 KiB, which covers both (the static size is asked for only
// where it decides); max_shared_carveout also asks for all of the multiprocessor's on-chip memory as
// shared memory (so that the Hopper kernels' two blocks per multiprocessor fit).
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes, bool max_shared_carveout = false) {
  constexpr int kDefault = 48 * 1024;
  auto static_bytes = [&] {
    cudaFuncAttributes attr{};
    cuda_check(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes(static shared memory)");
    return static_cast<int>(attr.sharedSizeBytes);
  };
  if (bytes > kDefault || (bytes > 0 && bytes + static_bytes() > kDefault))
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
               "cudaFuncSetAttribute(max dynamic shared memory)");
  if (max_shared_carveout)
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared),
               "cudaFuncSetAttribute(shared memory carveout)");
}

// kernel<<<grid, threads, smem, stream>>>(args); behind: as a programmatic dependent launch, whose
// blocks may start while the kernel before it ends (they call wait_previous_kernel before reading
// its results).
template <typename Args>
void launch(void (*kernel)(Args), const char* name, dim3 grid, int threads, int smem, cudaStream_t stream,
            const Args& args, bool behind = false) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = dim3(threads), config.dynamicSmemBytes = smem, config.stream = stream;
  config.attrs = &attr, config.numAttrs = behind ? 1 : 0;
  cuda_check(cudaLaunchKernelEx(&config, kernel, args), name);
}

}  // namespace mamba2ssd::cuda
