// Library-internal declarations shared between the API layer and the backends.
#pragma once

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::detail {

// Host backends only: cu_seqlens[0] == 0, non-decreasing, cu_seqlens[S] == seqlen. Throws Error.
void validate_cu_seqlens_host(const ForwardParams& p);

// Host backends: validate_cu_seqlens_host, and with check_inputs seq_idx non-decreasing along each
// row (the rule the device check applies, src/common/input_rules.h). Throws Error.
void validate_contents_host(const ForwardParams& p);

// Throws Error if any pointer of p is device memory (for the host backends).
void require_host_pointers(const ForwardParams& p, const char* backend);
void require_host_pointers(const BackwardParams& p, const char* backend);

// Runs forward_cuda with a workspace it allocates, then synchronizes the stream and frees it.
// Defined by the CUDA part of the library (or its stand-in in a build without CUDA).
void forward_cuda_blocking(const ForwardParams& p, void* stream);
void backward_cuda_blocking(const BackwardParams& p, void* stream);

// Tests only: the fused paths split the chunks into n segments (at most one per chunk) instead of
// choosing them from the shape; 0 restores the choice. Small test problems would otherwise always
// get one chunk per segment, so a block would never walk from one chunk to the next.
void set_fused_segments_for_testing(int64_t n);

// Tests only: the hopper path's TMA maps count as refused by the driver (true) at the call, after
// planning, which is the one fallback planning cannot foresee; false restores the driver's answer.
void refuse_tma_maps_for_testing(bool refuse);

}  // namespace mamba2ssd::detail
