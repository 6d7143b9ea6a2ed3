// The op mamba2ssd::selective_state_update as both backends' kernels see it: the tensors of its
// schema (already in the library's layout: the Python face, mamba2ssd.selective_state_update,
// reshapes mamba_ssm's forms), their checks, and the DecodeParams that points at them.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::binding {

struct DecodeCall {
  DecodeParams params;
  std::vector<at::Tensor> keep;  // converted copies the params point into (A, D, dt_bias, indices)
};

// state [S, H, P, N], x [b, T, H, P], dt [b, T, H], A [H], B and C [b, T, G, N], D [H] or [H, P],
// z like x, dt_bias [H], state_batch_indices [b], dst_state_batch_indices [b, T], out like x.
// Checks devices, dtypes, ranks and shapes (ValueError "selective_state_update: ...").
DecodeCall prepare_decode(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                          const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                          const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                          bool dt_softplus, double dt_min, double dt_max,
                          const std::optional<at::Tensor>& state_batch_indices,
                          const std::optional<at::Tensor>& dst_state_batch_indices, int64_t pad_slot_id,
                          const at::Tensor& out);

// Runs f, turning the library's Error into ValueError and CudaError into RuntimeError, each
// prefixed with "selective_state_update: ".
void decode_translate_errors(const std::function<void()>& f);

// testing::decode_rel_l2_tolerance for torch dtypes (the op mamba2ssd::decode_tolerance).
double decode_tolerance(at::ScalarType dtype, at::ScalarType state_dtype);

}  // namespace mamba2ssd::binding
