// Host memory: how much a run needs and how much this process can have, so that a run too large for
// the machine fails at once with both numbers (exit status 1) instead of swapping or being killed.
#pragma once

#include <stdexcept>
#include <string>

#include "mamba2ssd/mamba2ssd.h"
#include "reference/reference.h"
#include "testing/problem.h"

namespace mamba2ssd::cli {

// A run that this machine cannot hold now (exit status 1: the arguments are valid).
class ResourceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The tightest of the limits that apply to this process, in bytes, and which one it is.
struct HostMemory {
  double bytes = 0.0;
  std::string source;  // e.g. "MemAvailable in /proc/meminfo", "the address-space limit (ulimit -v)"
};
// MemAvailable (/proc/meminfo); the memory cgroup's limit less its usage, at every level from this
// process's cgroup up (v2 memory.max, v1 memory.limit_in_bytes); RLIMIT_AS less VmSize and
// RLIMIT_DATA less VmData. A limit that cannot be read is left out; with none readable, bytes is
// infinity.
HostMemory available_host_memory();

// Bytes of host memory `mamba2ssd run` needs for the config on `backend`, checking the oracle on
// `slice`: the problem's buffers (testing::host_bytes), the outputs downloaded from the GPU, and the
// oracle's fp64 arrays (for the slice; for the whole problem too with the reference backend).
double run_host_bytes(const testing::ProblemConfig& config, Backend backend, const reference::Slice& slice);

// What `mamba2ssd run --exact-prefill` adds: on the reference backend decode_reference keeps, in
// fp64, the state after every token of every batch row and head, b L H P N doubles, and out; the
// other backends only scratch.
double exact_prefill_host_bytes(const testing::ProblemConfig& config, Backend backend);

// The same for `mamba2ssd run --backward`: the forward's buffers, the cotangents and gradients (and
// their copies downloaded from the GPU), and the oracle of the backward on the slice: its inputs and
// gradients in fp64 and the states of one (batch row, head), (L + 1) P N doubles.
double backward_run_host_bytes(const testing::ProblemConfig& config, Backend backend, const reference::Slice& slice);

// Throws ResourceError "this run needs X GiB of host memory, but only Y GiB is available (source)"
// when needed > available.
void require_host_memory(double needed, const HostMemory& available);

// "3.21 GiB", "512 MiB".
std::string fmt_bytes(double bytes);

}  // namespace mamba2ssd::cli
