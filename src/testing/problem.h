// Test problems: a description of one call (shape and features), random inputs drawn from a seed,
// the ForwardParams that point at them, and the comparison of a backend's outputs with the oracle.
// Shared by the C++ tests, the GPU tests and the CLI.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"
#include "reference/reference.h"

namespace mamba2ssd::testing {

struct ProblemConfig {
  int64_t batch = 4, seqlen = 16384, nheads = 8, headdim = 64, dstate = 128, ngroups = 1;
  int64_t chunk_size = 128;
  DType dtype = DType::kBF16;
  DType dt_dtype = DType::kF32;
  DLayout D_layout = DLayout::kPerHead;
  bool z = false;
  bool dt_bias = false;
  bool dt_softplus = false;
  float dt_min = 0.0f, dt_max = std::numeric_limits<float>::infinity();
  bool initial_states = false;
  bool final_states = true;
  std::vector<int64_t> seqlens;  // packed sequences (batch 1): lengths summing to seqlen
  bool seq_idx = false;          // with seqlens: pass seq_idx too (else derived from cu_seqlens)
  bool cu_seqlens = true;        // with seqlens: pass cu_seqlens (false: seq_idx alone marks the
                                 // sequences; needs seq_idx, and there are no varlen states)
  bool varlen_states = true;     // with seqlens and cu_seqlens: ask for each sequence's final state
  bool strided = false;          // inputs and outputs as padded, non-contiguous views
  bool misaligned = false;       // like strided, padded by an odd number of elements: no row is
                                 // 16-byte aligned (no TMA, no cp.async)
  float A_scale = 1.0f;          // A times this: above 1, decays fast enough that a 64-token step
                                 // spans more than the Hopper mask's factored range
  CudaPath cuda_path = CudaPath::kAuto;
  Fp32Math fp32_math = Fp32Math::kTf32;  // fp32 on the CUDA forward: TF32 or 3xTF32 products
  uint64_t seed = 0;

  std::string describe() const;  // one line, e.g. "b2 L300 H4 P64 N32 G2 Q64 bf16 z D[H,P] ..."
  bool operator==(const ProblemConfig&) const = default;
};

// The config's sizes and options as a ForwardParams without pointers or strides: what
// validate_sizes() checks. HostProblem refuses (Error) a config that it refuses.
ForwardParams shape_params(const ProblemConfig& config);

// Bytes of host memory the buffers of HostProblem(config) take, padding included: computed (with
// overflow checks, Error naming the sizes) without allocating anything. Throws what
// validate_sizes(shape_params(config)) throws.
std::size_t host_bytes(const ProblemConfig& config);

// Host buffers of one problem, by name ("x", "dt", "A", "B", "C", "D", "z", "dt_bias",
// "initial_states", "seq_idx", "cu_seqlens", "y", "final_states", "varlen_states").
struct HostProblem {
  // Checks the config (validate_sizes and the config's own rules, Error) before it allocates.
  explicit HostProblem(const ProblemConfig& config);

  ProblemConfig config;
  std::map<std::string, std::vector<uint8_t>> buffers;

  // Params pointing into `buffers` (or, through ptr_of, into copies of them elsewhere).
  ForwardParams params() const;
  ForwardParams params(const std::function<void*(const std::string&)>& ptr_of) const;

  // Fills every output with NaN, so that an element a backend forgets to write fails the check.
  void poison_outputs();
  static bool is_output(const std::string& name);
};

// One output compared with the oracle.
struct Comparison {
  std::string name;        // "y", "final_states", "varlen_states"
  double rel_l2 = 0.0;     // ||out - ref|| / ||ref|| (|| out - ref || if ref is all zero)
  double max_abs = 0.0;    // max |out - ref|
  int64_t nonfinite = 0;   // NaN or inf in out (poison left behind counts here)
  int64_t count = 0;
  double tolerance = 0.0;
  bool pass() const { return nonfinite == 0 && rel_l2 <= tolerance; }
};

// Builds one Comparison, element by element.
class ComparisonBuilder {
 public:
  explicit ComparisonBuilder(std::string name) { cmp_.name = std::move(name); }
  void add(double got, double want);   // a non-finite `got` counts as such, not into the error
  // The same for an element that sums terms whose root sum of squares is `terms`: its error counts
  // against the larger of |want| and that (backward_sum_rel_l2_tolerance says why).
  void add(double got, double want, double terms);
  Comparison done(double tolerance);

 private:
  Comparison cmp_;
  double err2_ = 0.0, ref2_ = 0.0;
};

// True if every comparison passes (and there is at least one).
inline bool all_pass(const std::vector<Comparison>& cmps) {
  for (const Comparison& c : cmps)
    if (!c.pass()) return false;
  return !cmps.empty();
}

// Compares the outputs in `out` (host buffers laid out as problem's) with the oracle on `slice`.
std::vector<Comparison> compare_with_oracle(const HostProblem& problem,
                                            const std::map<std::string, std::vector<uint8_t>>& out,
                                            const reference::Slice& slice = {});

// Runs the oracle on the slice (convenience wrapper).
reference::Result oracle(const HostProblem& problem, const reference::Slice& slice = {});
std::vector<Comparison> compare_with(const HostProblem& problem,
                                     const std::map<std::string, std::vector<uint8_t>>& out,
                                     const reference::Result& ref);

}  // namespace mamba2ssd::testing
