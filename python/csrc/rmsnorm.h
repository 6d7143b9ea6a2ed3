// The ops mamba2ssd::gated_rmsnorm_fwd and gated_rmsnorm_bwd (the layer call's norm) as both
// backends' kernels see them: their checks and the GatedRmsNormBackwardParams that point at their
// tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <tuple>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::binding {

struct RmsNormCall {
  GatedRmsNormBackwardParams params;  // params.fwd for the forward
  // The views and converted inputs the params point into, then the outputs: out last (the forward),
  // or out (the forward's output, written again), dy, dz and dweight the last four (the backward).
  std::vector<at::Tensor> keep;
};

// y [..., dim] (float32, float16 or bfloat16), z like y or none, weight [dim] (any float dtype: read
// as float32). Checks devices, dtypes and shapes (ValueError "gated_rmsnorm: ..."); allocates out
// (the forward) or, with dout, out, dy, dz (empty [0] without z; or takes dz_out, and dz comes back
// empty) and dweight (float32).
RmsNormCall prepare_rmsnorm(const at::Tensor& y, const std::optional<at::Tensor>& z, const at::Tensor& weight,
                            int64_t group_size, double eps, bool norm_before_gate, const at::Tensor* dout,
                            const std::optional<at::Tensor>& dz_out);

// The backward's outputs in the op's order: out, dy, dz, dweight.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_outputs(const RmsNormCall& call);

// Runs f, turning the library's Error into ValueError and CudaError into RuntimeError, each
// prefixed with "gated_rmsnorm: ".
void rmsnorm_translate_errors(const std::function<void()>& f);

}  // namespace mamba2ssd::binding
