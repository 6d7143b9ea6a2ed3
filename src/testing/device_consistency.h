// The consistency rules' ways (testing/consistency.h) on the GPU: the problem mirrored in device
// memory, forward_cuda, decode_cuda and prefill_cuda on the default stream. Built only with the
// CUDA backend.
#pragma once

#include <vector>

#include "testing/consistency.h"

namespace mamba2ssd::testing {

std::vector<WayResult> run_ways_cuda(const ConsistencyConfig& config, const HostProblem& problem);

}  // namespace mamba2ssd::testing
