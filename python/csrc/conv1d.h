// The ops mamba2ssd::causal_conv1d_fwd and causal_conv1d_bwd (the layer call's convolution) as both
// backends' kernels see them: their checks and the Conv1dBackwardParams that point at their tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <tuple>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::binding {

struct Conv1dCall {
  Conv1dBackwardParams params;   // params.fwd for the forward
  // The converted inputs the params point into, then the outputs: out last (the forward), or dx
  // (empty when written into dx_out), dweight and dbias the last three (the backward).
  std::vector<at::Tensor> keep;
};

// x [b, L, C] (float32, float16 or bfloat16), weight [C, W] and bias [C] (any float dtype: read as
// float32), seq_idx [b, L] (int32 or int64). Checks devices, dtypes and shapes (ValueError
// "causal_conv1d: ..."); allocates out (the forward) or, with dout, dx (or takes dx_out), dweight
// and dbias (float32; dbias [0] unless bias_grad).
Conv1dCall prepare_conv1d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          const std::optional<at::Tensor>& seq_idx, bool silu, const at::Tensor* dout,
                          bool bias_grad, const std::optional<at::Tensor>& dx_out);

// Runs f, turning the library's Error into ValueError and CudaError into RuntimeError, each
// prefixed with "causal_conv1d: ".
void conv1d_translate_errors(const std::function<void()>& f);

}  // namespace mamba2ssd::binding
