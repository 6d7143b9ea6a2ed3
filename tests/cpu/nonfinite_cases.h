// The non-finite cases shared by the host and the GPU tests (docs/reliability.md, "Non-finite
// inputs"): one element of one input set to NaN, +inf or -inf, in fp32 and bf16, with and without a
// packed-sequence reset, and where that element is.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/host_dtype.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

struct Poison {
  std::string tensor;  // which input gets the value
  float value;
  DType dtype;
  bool packed;         // batch 1, two packed sequences (the config says where the reset is)
};

inline std::string value_name(float v) { return std::isnan(v) ? "NaN" : v > 0 ? "Inf" : "MinusInf"; }

inline std::string poison_name(const Poison& c) {
  return c.tensor + "_" + value_name(c.value) + "_" + to_string(c.dtype) + (c.packed ? "_packed" : "");
}

// Every input that can hold a non-finite value, each value, fp32 and bf16, packed or not: 108 cases.
inline std::vector<Poison> poison_cases() {
  std::vector<Poison> v;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const char* t : {"x", "dt", "B", "C", "z", "initial_states", "A", "D", "dt_bias"})
    for (float value : {nan, inf, -inf})
      for (DType dtype : {DType::kF32, DType::kBF16})
        for (bool packed : {false, true}) v.push_back({t, value, dtype, packed});
  return v;
}

// The poisoned element: batch row 0, token `t`, head 1 (its group 0), dim 5, state column 3.
constexpr int64_t kPoisonHead = 1, kPoisonDim = 5, kPoisonColumn = 3;
inline void put_poison(HostProblem& problem, const Poison& c, int64_t t) {
  const ForwardParams p = problem.params();
  void* buf = problem.buffers.at(c.tensor).data();
  const int64_t h = kPoisonHead, i = kPoisonDim, n = kPoisonColumn;
  if (c.tensor == "x") host::store(buf, t * p.x_stride.s1 + h * p.x_stride.s2 + i, p.dtype, c.value);
  if (c.tensor == "z") host::store(buf, t * p.z_stride.s1 + h * p.z_stride.s2 + i, p.dtype, c.value);
  if (c.tensor == "B") host::store(buf, t * p.B_stride.s1 + n, p.dtype, c.value);
  if (c.tensor == "C") host::store(buf, t * p.C_stride.s1 + n, p.dtype, c.value);
  if (c.tensor == "dt") host::store(buf, t * p.dt_stride.s1 + h, p.dt_dtype, c.value);
  if (c.tensor == "initial_states")
    host::store(buf, h * p.initial_states_stride.s1 + i * p.initial_states_stride.s2 + n, DType::kF32, c.value);
  if (c.tensor == "A" || c.tensor == "dt_bias") host::store(buf, h, DType::kF32, c.value);
  if (c.tensor == "D") host::store(buf, h * p.headdim + i, DType::kF32, c.value);  // D [H, P]
}

// Inputs of one head for every batch row and token (A, D, dt_bias), not of one row's token.
inline bool per_head_input(const std::string& tensor) { return tensor == "A" || tensor == "D" || tensor == "dt_bias"; }

// A value that is clamped away, so that every output stays finite: -inf in dt or dt_bias (the step
// is clamped to dt_min, 0).
inline bool clamped_poison(const Poison& c) {
  return std::isinf(c.value) && c.value < 0 && (c.tensor == "dt" || c.tensor == "dt_bias");
}

// -inf in A: the decay is 0 (the state restarts from each token's input), except at a step clamped
// to 0, where A d = -inf * 0 is NaN; the oracle may have no non-finite output at all.
inline bool minus_inf_A(const Poison& c) { return c.tensor == "A" && std::isinf(c.value) && c.value < 0; }

// The serving calls' inputs (the decode step's and the packed prefill's) that can hold one.
inline constexpr const char* kServingInputs[] = {"x", "dt", "B", "C", "z", "A", "D", "dt_bias"};

// One element of a serving input's buffer (elements of dtype t): element 1 of a per-head input,
// else the one just past the middle (a token past the first). Returns its index.
inline int64_t put_serving(std::vector<uint8_t>& buf, const std::string& tensor, float value,
                           DType t = DType::kF32) {
  const int64_t i = per_head_input(tensor) ? 1 : static_cast<int64_t>(buf.size() / dtype_size(t) / 2 + 3);
  host::store(buf.data(), i, t, value);
  return i;
}

// Elements (of dtype t) finite in one buffer and not in the other.
inline int64_t finiteness_mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, DType t) {
  int64_t bad = 0;
  for (std::size_t i = 0; i < got.size() / dtype_size(t); ++i)
    bad += std::isfinite(host::load(got.data(), static_cast<int64_t>(i), t)) !=
           std::isfinite(host::load(want.data(), static_cast<int64_t>(i), t));
  return bad;
}

}  // namespace mamba2ssd::testing
