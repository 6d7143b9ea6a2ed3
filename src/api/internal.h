// Library-internal declarations shared between the API layer and the backends.
#pragma once

#include <initializer_list>
#include <utility>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::detail {

// validate() with fp64 allowed: the reference backend's own check. An fp64 call has dtype and
// dt_dtype kF64, and every tensor the API declares float* holds doubles.
void validate_reference(const ForwardParams& p);
void validate_reference(const BackwardParams& p);

// The dtype of the tensors the API declares float*: kF64 in an fp64 call, else kF32.
inline DType float_tensor_dtype(const ForwardParams& p) {
  return p.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
}

// Throws Error naming `backend` if p is an fp64 call (every backend but the reference refuses it).
void refuse_f64(const ForwardParams& p, const char* backend);

// Host backends only: cu_seqlens[0] == 0, non-decreasing, cu_seqlens[S] == seqlen. Throws Error.
void validate_cu_seqlens_host(const ForwardParams& p);

// Host backends: validate_cu_seqlens_host, and with check_inputs seq_idx non-decreasing along each
// row (the rule the device check applies, src/common/input_rules.h). Throws Error.
void validate_contents_host(const ForwardParams& p);

// forward_cuda and backward_cuda in checked mode: throws Error unless p.input_status is given (the
// device check can report only through it, without a host sync).
void require_input_status(const ForwardParams& p);

// Throws Error if any pointer of p is device memory (for the host backends).
void require_host_pointers(const ForwardParams& p, const char* backend);
// The same for a list of (name, pointer); null pointers pass.
void require_host_pointers(std::initializer_list<std::pair<const char*, const void*>> ptrs, const char* backend);
void require_host_pointers(const BackwardParams& p, const char* backend);

// Runs forward_cuda with a workspace it allocates, then synchronizes the stream and frees it.
// Defined by the CUDA part of the library (or its stand-in in a build without CUDA).
void forward_cuda_blocking(const ForwardParams& p, void* stream);
void backward_cuda_blocking(const BackwardParams& p, void* stream);

// Tests only: the fused paths split the chunks into n segments (at most one per chunk) instead of
// choosing them from the shape; 0 restores the choice. Small test problems would otherwise always
// get one chunk per segment, so a block would never walk from one chunk to the next.
void set_fused_segments_for_testing(int64_t n);

// Tests only: the hopper path's packed prefill walks `groups` segments of whole requests (> 0; at
// most one a request), never such segments (< 0), or as its plan decides (0; sm90_prefill_plan). A
// count fixed by set_fused_segments_for_testing turns them off unless this forces them.
void set_prefill_request_groups_for_testing(int64_t groups);

// Tests only: decode_cuda runs its rows kernel (1) or its stream kernel (2) whatever the call; 0
// restores the choice (docs/serving.md, "Two kernels"). The decode tests run their problems on both.
// units_per_warp > 0 also fixes the stream kernel's range per warp (else sized to one wave), so
// that small problems walk ranges that cross heads, groups, requests and pads.
void set_decode_kernel_for_testing(int kernel, int64_t units_per_warp = 0);

// Tests only: backward_cuda runs its portable kernels (true: the walks, chunk_grads and chunk_dbc)
// even where the Hopper ones take the call; false restores the choice. The backward tests run their
// cases on both.
void set_portable_backward_for_testing(bool portable);

// Tests only: the hopper path's TMA maps count as refused by the driver (true) at the call, after
// planning, which is the one fallback planning cannot foresee; false restores the driver's answer.
void refuse_tma_maps_for_testing(bool refuse);

// Decode, host backends: every slot entry in range or pad_slot_id, and no aliasing (two requests
// storing to one slot, or one storing to a slot another reads). Throws Error naming the entries.
void check_decode_slots_host(const DecodeParams& p);
void require_host_pointers(const DecodeParams& p, const char* backend);
// Runs decode_cuda, then synchronizes the stream (src/cuda/decode, or the stand-in without CUDA).
void decode_cuda_blocking(const DecodeParams& p, void* stream);

// Packed prefill, host backends: require_host_pointers, the contents of cu_seqlens, seq_idx's ids
// changing exactly at request starts, every slot and intermediate slot in range or pad_slot_id, and
// no slot stored to twice, nor an intermediate state stored to a request's slot (mamba2ssd.h). Throws
// Error naming the entries.
void check_prefill_host(const PrefillParams& p, const char* backend);
// Runs prefill_cuda with a workspace it allocates, then synchronizes the stream and frees it
// (src/cuda/common/runtime.cpp, or the stand-in without CUDA).
void prefill_cuda_blocking(const PrefillParams& p, void* stream);

}  // namespace mamba2ssd::detail
