// Small helpers shared by the CPU tests: typed access to a HostProblem's buffers and its inputs read
// back in fp64 through the problem's own params (so strided layouts read correctly).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/host_dtype.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

// f() throws Error whose message contains `part`.
inline void expect_error_naming(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no Error; expected one naming \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// validate(p) after change(p), on a copy of p: a bad-parameter case for expect_error_naming.
// d loss / d v by the central difference of step `step`, v restored after (loss reads v).
template <typename Loss>
double central_difference(float& v, float step, Loss&& loss) {
  const float keep = v;
  v = keep + step;
  const double up = loss();
  v = keep - step;
  const double down = loss();
  v = keep;
  return (up - down) / (2.0 * static_cast<double>(step));
}

template <typename Params, typename Change>
std::function<void()> validate_changed(const Params& p, Change change) {
  return [p, change] {
    Params q = p;
    change(q);
    validate(q);
  };
}

template <typename T>
T* buffer(HostProblem& problem, const std::string& name) {
  return reinterpret_cast<T*>(problem.buffers.at(name).data());
}

// Inputs of a problem as fp64, indexed like the contract: x(b, t, h, p), B(b, t, g, n), ...
struct Inputs {
  explicit Inputs(const HostProblem& problem) : p(problem.params()) {}
  ForwardParams p;

  double x(int64_t b, int64_t t, int64_t h, int64_t i) const {
    return host::load(p.x, b * p.x_stride.s0 + t * p.x_stride.s1 + h * p.x_stride.s2 + i, p.dtype);
  }
  double z(int64_t b, int64_t t, int64_t h, int64_t i) const {
    return host::load(p.z, b * p.z_stride.s0 + t * p.z_stride.s1 + h * p.z_stride.s2 + i, p.dtype);
  }
  double B(int64_t b, int64_t t, int64_t g, int64_t n) const {
    return host::load(p.B, b * p.B_stride.s0 + t * p.B_stride.s1 + g * p.B_stride.s2 + n, p.dtype);
  }
  double C(int64_t b, int64_t t, int64_t g, int64_t n) const {
    return host::load(p.C, b * p.C_stride.s0 + t * p.C_stride.s1 + g * p.C_stride.s2 + n, p.dtype);
  }
  // The preprocessed step: bias, softplus, clamp, in fp64.
  double d(int64_t b, int64_t t, int64_t h) const {
    double v = host::load(p.dt, b * p.dt_stride.s0 + t * p.dt_stride.s1 + h * p.dt_stride.s2, p.dt_dtype);
    if (p.dt_bias) v += p.dt_bias[h];
    if (p.dt_softplus) v = v <= 20.0 ? std::log1p(std::exp(v)) : v;
    return std::min<double>(std::max<double>(v, p.dt_min), p.dt_max);
  }
  double D(int64_t h, int64_t i) const {
    if (p.D_layout == DLayout::kPerHead) return p.D[h];
    if (p.D_layout == DLayout::kPerHeadDim) return p.D[h * p.headdim + i];
    return 0.0;
  }
  double init(int64_t b, int64_t h, int64_t i, int64_t n) const {
    const Strides4& s = p.initial_states_stride;
    return p.initial_states[b * s.s0 + h * s.s1 + i * s.s2 + n * s.s3];
  }
  int64_t group(int64_t h) const { return h / (p.nheads / p.ngroups); }
};

// Expects a non-empty list of comparisons, every one within its tolerance (names each failure).
inline void expect_all_pass(const std::vector<Comparison>& cmps, const std::string& what) {
  ASSERT_FALSE(cmps.empty()) << what;
  for (const Comparison& c : cmps)
    EXPECT_TRUE(c.pass()) << what << ": " << c.name << " rel_l2 " << c.rel_l2 << " (tolerance " << c.tolerance
                          << "), max_abs " << c.max_abs << ", " << c.nonfinite << " of " << c.count
                          << " not finite";
}

// Finite elements of an output buffer (padding of strided views stays poisoned with NaN).
inline int64_t finite_elements(const HostProblem& problem, const std::string& name) {
  const DType t = name == "y" ? problem.config.dtype : DType::kF32;
  const std::vector<uint8_t>& buf = problem.buffers.at(name);
  int64_t finite = 0;
  for (std::size_t i = 0; i < buf.size() / dtype_size(t); ++i)
    finite += std::isfinite(host::load(buf.data(), static_cast<int64_t>(i), t)) ? 1 : 0;
  return finite;
}

// Runs the CPU backend on the problem (outputs freshly poisoned) and checks every output against
// the oracle with the project's tolerance, and that nothing was written outside the output views.
inline void expect_cpu_matches_oracle(HostProblem& problem, int threads = 0) {
  problem.poison_outputs();
  forward_cpu(problem.params(), threads);
  for (const Comparison& c : compare_with_oracle(problem, problem.buffers)) {
    EXPECT_TRUE(c.pass()) << problem.config.describe() << ": " << c.name << " rel_l2 " << c.rel_l2
                          << " (tolerance " << c.tolerance << "), max_abs " << c.max_abs << ", "
                          << c.nonfinite << " of " << c.count << " not finite";
    EXPECT_EQ(finite_elements(problem, c.name), c.count - c.nonfinite)
        << problem.config.describe() << ": " << c.name << " written outside its view";
  }
}

}  // namespace mamba2ssd::testing
