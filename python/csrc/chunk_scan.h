// The op mamba2ssd::chunk_scan_fwd as both backends' kernels see it: the arguments of its schema,
// their checks, the outputs, and the mamba2ssd::ForwardParams that points at them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::binding {

using OptTensor = std::optional<at::Tensor>;
using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;  // y, final_states, varlen_states

// The schema's arguments, in its order (see TORCH_LIBRARY in ops.cpp).
struct Args {
  const at::Tensor& x;
  const at::Tensor& dt;
  const at::Tensor& A;
  const at::Tensor& B;
  const at::Tensor& C;
  int64_t chunk_size;
  const OptTensor& D;
  const OptTensor& z;
  const OptTensor& dt_bias;
  const OptTensor& initial_states;
  const OptTensor& seq_idx;
  const OptTensor& cu_seqlens;
  bool dt_softplus;
  double dt_min;
  double dt_max;
  bool return_final_states;
  bool return_varlen_states;
  c10::string_view cuda_path;  // "auto", "three-kernel", "fused", "hopper" or "tile"
};

// One checked call: params points into x..cu_seqlens (or the converted copies kept in `inputs`)
// and into the freshly allocated outputs. An output not asked for is an empty tensor.
struct Call {
  ForwardParams params;
  std::vector<at::Tensor> inputs;
  at::Tensor y, final_states, varlen_states;

  Outputs outputs() const { return {y, final_states, varlen_states}; }
};

// Checks the arguments (one device, dtypes, ranks, consistent sizes; every message names the
// argument), allocates the outputs on x's device and fills params. Small inputs (A, D, dt_bias,
// cu_seqlens) are made contiguous in the type the library wants; a tensor whose last dimension is
// not contiguous is copied; everything else is passed through with its strides. The library's own
// validate() runs later, inside the backend.
Call prepare(const Args& args);

// chunk_scan_fwd's kernel for one backend: prepare(), then run(call) (the backend's forward, under
// translate_errors), then the outputs. Instantiated once per dispatch key.
template <void (*run)(Call&)>
Outputs chunk_scan_fwd(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                       const at::Tensor& C, int64_t chunk_size, const OptTensor& D, const OptTensor& z,
                       const OptTensor& dt_bias, const OptTensor& initial_states, const OptTensor& seq_idx,
                       const OptTensor& cu_seqlens, bool dt_softplus, double dt_min, double dt_max,
                       bool return_final_states, bool return_varlen_states, c10::string_view cuda_path) {
  Call call = prepare({x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                       dt_min, dt_max, return_final_states, return_varlen_states, cuda_path});
  run(call);
  return call.outputs();
}

// ValueError / RuntimeError with the message "mamba_chunk_scan_combined: <what>".
[[noreturn]] void throw_value_error(const char* what);
[[noreturn]] void throw_runtime_error(const char* what);

// Runs f, turning the library's exceptions into PyTorch's: mamba2ssd::Error (bad input) becomes a
// ValueError, CudaError a RuntimeError, each prefixed with the Python function's name.
template <typename F>
void translate_errors(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    throw_value_error(e.what());
  } catch (const CudaError& e) {
    throw_runtime_error(e.what());
  }
}

}  // namespace mamba2ssd::binding
