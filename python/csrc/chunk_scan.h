// The ops mamba2ssd::chunk_scan_fwd and chunk_scan_bwd as both backends' kernels see them: the
// arguments of their schemas, their checks, the outputs, and the mamba2ssd::ForwardParams /
// BackwardParams that point at them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::binding {

using OptTensor = std::optional<at::Tensor>;
using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;  // y, final_states, varlen_states, saved_states
// dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states; an absent input's gradient is empty.
using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                         at::Tensor, at::Tensor>;

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
  bool check_inputs;           // ForwardParams::check_inputs (the backward's: BackwardParams::fwd)
  c10::string_view fp32_math;  // "tf32" or "accurate" (ForwardParams::fp32_math; the backward passes "tf32")
  bool save_states = false;    // the forward keeps the states for its backward (ForwardParams::saved_states)
};

// One checked call: params points into x..cu_seqlens (or the converted copies kept in `inputs`)
// and into the freshly allocated outputs. An output not asked for is an empty tensor.
struct Call {
  ForwardParams params;
  std::vector<at::Tensor> inputs;
  at::Tensor y, final_states, varlen_states, saved_states;

  Outputs outputs() const { return {y, final_states, varlen_states, saved_states}; }
};

// Checks the arguments (one device, dtypes, ranks, consistent sizes; every message names the
// argument) and the library's size limits and dt_limit (validate_sizes, before anything is
// allocated), allocates the outputs on x's device and fills params. Small inputs (A, D, dt_bias,
// cu_seqlens) are made contiguous in the type the library wants; a tensor whose last dimension is
// not contiguous is copied; everything else is passed through with its strides. The library's own
// validate() runs later, inside the backend. float64 x makes an fp64 call (CPU only: the reference
// backend): every floating tensor is taken as float64, the states come back float64.
Call prepare(const Args& args);

// One checked backward call: params.fwd as prepare() fills it (without outputs), the cotangents, and
// the gradients, freshly allocated (an absent input's gradient is an empty tensor).
struct BwdCall {
  BackwardParams params;
  std::vector<at::Tensor> inputs;
  at::Tensor dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states;

  Grads outputs() const { return {dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states}; }
};

// The caller's buffers for the per-token gradients (chunk_scan_bwd_into's): each, when given, is
// written in place instead of a new tensor, and its output in BwdCall is empty.
struct GradsInto {
  const OptTensor& dx;
  const OptTensor& ddt;
  const OptTensor& dB;
  const OptTensor& dC;
  const OptTensor& dz;
};

// prepare()'s checks of the forward's arguments, then the cotangents': dout as y ([b, L, H, P], x's
// dtype); dfinal_states [b, H, P, N] and dvarlen_states [S, H, P, N] (needs cu_seqlens), each taken
// when given and not empty; and the states the forward saved (saved_states, chunk_scan_fwd's fourth
// output), taken when given and not empty. All on x's device. Then the buffers of `into`: each with
// its gradient's shape and dtype on x's device, a contiguous last dimension (any other strides: a
// slice of a larger gradient, say), dz only with z.
BwdCall prepare_backward(const Args& args, const at::Tensor& dout, const OptTensor& dfinal_states,
                         const OptTensor& dvarlen_states, const OptTensor& saved_states, const GradsInto& into);

// chunk_scan_fwd's kernel for one backend: prepare(), then run(call) (the backend's forward, under
// translate_errors), then the outputs. Instantiated once per dispatch key.
template <void (*run)(Call&)>
Outputs chunk_scan_fwd(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                       const at::Tensor& C, int64_t chunk_size, const OptTensor& D, const OptTensor& z,
                       const OptTensor& dt_bias, const OptTensor& initial_states, const OptTensor& seq_idx,
                       const OptTensor& cu_seqlens, bool dt_softplus, double dt_min, double dt_max,
                       bool return_final_states, bool return_varlen_states, c10::string_view cuda_path,
                       bool check_inputs, c10::string_view fp32_math, bool save_states) {
  Call call = prepare({x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                       dt_min, dt_max, return_final_states, return_varlen_states, cuda_path, check_inputs,
                       fp32_math, save_states});
  run(call);
  return call.outputs();
}

// chunk_scan_bwd's kernel for one backend, as chunk_scan_fwd's.
template <void (*run)(BwdCall&)>
Grads chunk_scan_bwd(const at::Tensor& dout, const OptTensor& dfinal_states, const OptTensor& dvarlen_states,
                     const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                     const at::Tensor& C, int64_t chunk_size, const OptTensor& D, const OptTensor& z,
                     const OptTensor& dt_bias, const OptTensor& initial_states, const OptTensor& seq_idx,
                     const OptTensor& cu_seqlens, bool dt_softplus, double dt_min, double dt_max,
                     c10::string_view cuda_path, bool check_inputs, const OptTensor& saved_states) {
  const OptTensor none;
  BwdCall call = prepare_backward({x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                                   dt_softplus, dt_min, dt_max, false, false, cuda_path, check_inputs, "tf32"},
                                  dout, dfinal_states, dvarlen_states, saved_states, {none, none, none, none, none});
  run(call);
  return call.outputs();
}

// chunk_scan_bwd_into's kernel: chunk_scan_bwd's, writing the per-token gradients into the caller's
// buffers; returns the rest (dA, dD, ddt_bias, dinitial_states).
template <void (*run)(BwdCall&)>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> chunk_scan_bwd_into(
    const at::Tensor& dout, const OptTensor& dfinal_states, const OptTensor& dvarlen_states, const at::Tensor& x,
    const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
    const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias, const OptTensor& initial_states,
    const OptTensor& seq_idx, const OptTensor& cu_seqlens, bool dt_softplus, double dt_min, double dt_max,
    c10::string_view cuda_path, bool check_inputs, const OptTensor& saved_states, const at::Tensor& dx,
    const at::Tensor& ddt, const at::Tensor& dB, const at::Tensor& dC, const OptTensor& dz) {
  BwdCall call = prepare_backward({x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                                   dt_softplus, dt_min, dt_max, false, false, cuda_path, check_inputs, "tf32"},
                                  dout, dfinal_states, dvarlen_states, saved_states, {dx, ddt, dB, dC, dz});
  run(call);
  return {call.dA, call.dD, call.ddt_bias, call.dinitial_states};
}

// ValueError / RuntimeError with the message "mamba_chunk_scan_combined: <what>".
[[noreturn]] void throw_value_error(const char* what);
[[noreturn]] void throw_runtime_error(const char* what);

// Runs f, turning the library's exceptions into PyTorch's: mamba2ssd::Error (bad input) becomes a
// ValueError, CudaError a RuntimeError, each prefixed with the Python function's name and `context`
// (the backward's: "backward: ").
template <typename F>
void translate_errors(F&& f, const std::string& context = "") {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    throw_value_error((context + e.what()).c_str());
  } catch (const CudaError& e) {
    throw_runtime_error((context + e.what()).c_str());
  }
}

}  // namespace mamba2ssd::binding
