// Library-internal declarations shared between the API layer and the backends.
#pragma once

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::detail {

// Host backends only: cu_seqlens[0] == 0, non-decreasing, cu_seqlens[S] == seqlen. Throws Error.
void validate_cu_seqlens_host(const ForwardParams& p);

// Throws Error if any pointer of p is device memory (for the host backends).
void require_host_pointers(const ForwardParams& p, const char* backend);

// Runs forward_cuda with a workspace it allocates, then synchronizes the stream and frees it.
// Defined by the CUDA part of the library (or its stand-in in a build without CUDA).
void forward_cuda_blocking(const ForwardParams& p, void* stream);

}  // namespace mamba2ssd::detail
