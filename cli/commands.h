// The subcommands. Each returns the exit status: 0 success, 1 a check or a run failed.
// Bad arguments throw UsageError (exit status 2, see main.cpp).
#pragma once

#include "args.h"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cli {

int run_command(const Args& args);
int run_backward_command(const Args& args);  // run --backward (run_command hands it over)
int check_command(const Args& args);
int bench_command(const Args& args);
int fuzz_command(const Args& args);
int decode_command(const Args& args);
int prefill_command(const Args& args);

// --impl, resolved (auto: cuda when a GPU is visible, else cpu); cuda without a GPU is a UsageError.
Backend impl_flag(const Args& args);
// --path: which kernels the CUDA backend runs (ProblemConfig::cuda_path). Anything but auto with a
// backend other than CUDA (`backend`: impl_flag's answer) is a UsageError naming both flags.
CudaPath path_flag(const Args& args, Backend backend);
// --threads (0: every hardware thread).
int threads_flag(const Args& args);
// --segments K, a tuning knob: the fused and hopper walks cut each sequence into K segments in place
// of the planned count, for this process. With a backend other than CUDA it is a UsageError.
void segments_flag(const Args& args, Backend backend);
// --request-groups K (prefill): the hopper walk's segments of whole requests, K of them.
void request_groups_flag(const Args& args, Backend backend);

}  // namespace mamba2ssd::cli
