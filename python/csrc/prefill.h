// The op mamba2ssd::prefill as both backends' kernels see it: the tensors of its schema (the Python
// face, mamba2ssd.prefill, has taken off the packed form's leading 1), their checks, and the
// PrefillParams that points at them.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::binding {

struct PrefillCall {
  PrefillParams params;
  std::vector<at::Tensor> keep;  // converted copies the params point into (A, D, dt_bias, cu_seqlens, ...)
};

// state [nslots, H, P, N], x [T, H, P], dt [T, H], A [H], B and C [T, G, N], cu_seqlens [S+1],
// seq_idx [T], D [H] or [H, P], z like x, dt_bias [H], slots [S] int32, has_initial_state [S] bool
// or uint8, out like x, intermediate_slots [S, M] int32. Checks devices (every tensor on the
// state's), dtypes, ranks, shapes and the strides the library needs of the tensors written in place
// (ValueError "prefill: ..."); the rest (chunk_size, headdim, dstate, overlaps) is
// validate(PrefillParams)'s, inside the library's call.
PrefillCall prepare_prefill(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                            const at::Tensor& B, const at::Tensor& C, int64_t chunk_size, const at::Tensor& cu_seqlens,
                            const std::optional<at::Tensor>& seq_idx, const std::optional<at::Tensor>& D,
                            const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                            bool dt_softplus, double dt_min, double dt_max, const at::Tensor& slots,
                            const std::optional<at::Tensor>& has_initial_state, int64_t pad_slot_id,
                            const at::Tensor& out, int64_t state_every,
                            const std::optional<at::Tensor>& intermediate_slots);

// Runs f, turning the library's Error into ValueError and CudaError into RuntimeError, each
// prefixed with "prefill: ".
void prefill_translate_errors(const std::function<void()>& f);

}  // namespace mamba2ssd::binding
