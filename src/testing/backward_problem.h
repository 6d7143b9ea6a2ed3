// Backward test problems: a forward problem's inputs, random cotangents (dout, dfinal_states,
// dvarlen_states), gradient buffers in one of three layouts, the BackwardParams that point at them,
// and the comparison of a backend's gradients with the oracle. Shared by the C++ tests (and, later,
// the GPU tests).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"
#include "reference/reference.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

enum class GradLayout {
  kContiguous,  // each gradient its own contiguous buffer
  kPadded,      // each its own buffer, dims 1 and 2 padded (and dout, dfinal, dvarlen likewise)
  kFused,       // dz, dx, dB, dC, ddt as slices of one [b, L, W] buffer, as mamba_ssm's fused layer
                // hands them (W = z, x, B, C, dt widths plus padding; needs dt_dtype == dtype)
};
const char* to_string(GradLayout l);

// One line: the config's and the layout, e.g. "b2 L300 ... seed0 grads:fused".
std::string describe(const ProblemConfig& config, GradLayout layout);

// Where one gradient lives: a 4-d view (leading dims of size 1 for [H] and the like) of a buffer.
struct GradView {
  std::string buffer;
  int64_t offset = 0;               // elements
  std::array<int64_t, 4> size{}, stride{};
  DType dtype = DType::kF32;
  int64_t count() const { return size[0] * size[1] * size[2] * size[3]; }
};

struct BackwardProblem {
  // Inputs from HostProblem(config) (whose outputs are unused), cotangents drawn from config.seed:
  // dfinal_states when config.final_states, dvarlen_states when it has packed sequences and
  // varlen_states. Gradient buffers start poisoned with NaN.
  explicit BackwardProblem(const ProblemConfig& config, GradLayout layout = GradLayout::kContiguous);

  HostProblem forward;
  GradLayout layout;
  // "dout", "dfinal_states", "dvarlen_states" and the gradient buffers ("dx", ... or one "dzxbcdt").
  std::map<std::string, std::vector<uint8_t>> buffers;
  std::map<std::string, GradView> cotangents;  // "dout" and, when given, "dfinal_states", "dvarlen_states"
  std::map<std::string, GradView> gradients;   // by gradient name: "dx", "ddt", "dA", ...

  std::string describe() const;  // the config's line and the layout
  BackwardParams params() const;
  // Params pointing into copies of the buffers elsewhere (a GPU): ptr_of(name) is the copy of the
  // buffer `name`, of the forward problem's buffers or of this problem's.
  BackwardParams params(const std::function<void*(const std::string&)>& ptr_of) const;
  void poison_gradients();       // every element of every gradient buffer NaN, padding included
  // The forward saves the states for the backward (ForwardParams::saved_states): a buffer
  // "saved_states" (zeros), which params() names in fwd.saved_states. For the CUDA backend only (the
  // host backends refuse it); the forward that fills it is DeviceBackwardProblem::launch_forward.
  void save_states();
  bool saves_states() const { return buffers.count("saved_states") != 0; }
};

// The oracle's gradients for the problem (fp64).
reference::Grads64 backward_oracle(const BackwardProblem& problem);

// The oracle's array of one gradient, by its name in BackwardParams ("dx", "ddt", ...).
const std::vector<double>& oracle_gradient(const reference::Grads64& g, const std::string& name);
// The gradients that sum over every token of the call (dA, ddt_bias, dD): their bar is
// backward_sum_rel_l2_tolerance.
bool sums_over_tokens(const std::string& name);
// For a gradient whose elements are sums the oracle keeps the terms' scale of (dA, ddt_bias, dD, ddt):
// the root sums of squares of those terms (reference::Grads64::dA_terms, ...); null for the others.
const std::vector<double>* oracle_terms(const reference::Grads64& g, const std::string& name);

// One gradient read from `out` (buffers laid out as problem's), dense in the oracle's order.
std::vector<double> read_gradient(const BackwardProblem& problem,
                                  const std::map<std::string, std::vector<uint8_t>>& out, const std::string& name);

// Each gradient in `out` (buffers laid out as problem's) against the oracle, with the tolerance of
// tolerance.h; names as in BackwardParams.
std::vector<Comparison> compare_gradients(const BackwardProblem& problem,
                                          const std::map<std::string, std::vector<uint8_t>>& out,
                                          const reference::Grads64& ref);

// On a slice (the CLI's check of a large problem): batch rows and heads, every token (the adjoint runs
// from the last one back; Error otherwise). dA, dD, ddt_bias sum over batch rows and dB, dC over a
// group's heads, so a backend's gradients are comparable with the slice's oracle only when the
// cotangents outside the slice are zero: restrict_cotangents() makes them so, and then every gradient,
// sums included, is the slice's alone.
reference::Slice backward_slice(const ProblemConfig& config, reference::Slice slice);
void restrict_cotangents(BackwardProblem& problem, const reference::Slice& slice);
// The oracle's gradients for the slice's batch rows and heads (and the groups those heads read), from
// the cotangents there. Memory: the slice's inputs in fp64 and one (batch row, head)'s states,
// (L + 1) P N doubles.
reference::Grads64 backward_oracle(const BackwardProblem& problem, const reference::Slice& slice);
// Each gradient in `out` on the slice against ref = backward_oracle(problem, slice).
std::vector<Comparison> compare_gradients(const BackwardProblem& problem,
                                          const std::map<std::string, std::vector<uint8_t>>& out,
                                          const reference::Grads64& ref, const reference::Slice& slice);

// Finite elements of the gradient buffers in `out` outside every gradient's view: a backend that
// writes past a view (into padding or a neighbour's slice) leaves one behind the NaN poison.
int64_t written_outside_gradients(const BackwardProblem& problem,
                                  const std::map<std::string, std::vector<uint8_t>>& out);

}  // namespace mamba2ssd::testing
