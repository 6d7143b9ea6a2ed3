// Checked mode on the GPU (ForwardParams::check_inputs): one small kernel, launched before the
// path's kernels on the same stream, that records the first bad entry of cu_seqlens and seq_idx in
// the caller's input_status (src/common/input_rules.h). No host sync, no allocation.
#pragma once

#include <cuda_runtime_api.h>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

// p is validated, p.check_inputs is set and p.input_status is device memory.
void launch_check_inputs(const ForwardParams& p, cudaStream_t stream);

}  // namespace mamba2ssd::cuda
