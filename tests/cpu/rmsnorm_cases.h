// The layer's gated RMSNorm as a test problem (CPU and GPU tests): random y, z, dout and weight in
// host buffers (rows padded when strided: the layer's z is a slice of zxbcdt's columns).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/host_dtype.h"
#include "mamba2ssd/mamba2ssd.h"
#include "reference/rmsnorm.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

struct RmsNormCase {
  int64_t rows = 5, dim = 96, group_size = 48;
  DType dtype = DType::kBF16;
  bool z = true, norm_before_gate = true, strided = false;
  uint64_t seed = 1;
  std::string describe() const {
    return "rows" + std::to_string(rows) + " dim" + std::to_string(dim) + " group" + std::to_string(group_size) + " " +
           to_string(dtype) + (z ? (norm_before_gate ? " z after" : " z before") : "") + (strided ? " strided" : "") +
           " seed" + std::to_string(seed);
  }
};

struct HostRmsNorm {
  RmsNormCase c;
  int64_t row = 0;  // elements between rows
  std::vector<uint8_t> y, z, dout;
  std::vector<float> weight;

  explicit HostRmsNorm(const RmsNormCase& cc) : c(cc), row(cc.dim + (cc.strided ? 5 : 0)) {
    std::mt19937_64 rng(c.seed);
    std::normal_distribution<float> normal;
    const std::size_t es = dtype_size(c.dtype), n = static_cast<std::size_t>(c.rows * row);
    for (std::vector<uint8_t>* v : {&y, &z, &dout}) {
      v->assign(n * es, 0);
      for (std::size_t i = 0; i < n; ++i) host::store(v->data(), static_cast<int64_t>(i), c.dtype, normal(rng));
    }
    weight.resize(c.dim);
    for (float& w : weight) w = 1.0f + 0.2f * normal(rng);
  }
  Strides2 strides() const { return {row, 1}; }

  GatedRmsNormParams params(const void* y_ptr, const void* z_ptr, const float* w, void* out) const {
    GatedRmsNormParams p;
    p.rows = c.rows, p.dim = c.dim, p.group_size = c.group_size, p.dtype = c.dtype, p.eps = 1e-5f;
    p.norm_before_gate = c.norm_before_gate;
    p.y = y_ptr, p.y_stride = strides(), p.z = c.z ? z_ptr : nullptr, p.z_stride = strides(), p.weight = w;
    p.out = out, p.out_stride = strides();
    return p;
  }
  // out: where the backward writes the forward's output again (fwd.out), or null.
  GatedRmsNormBackwardParams backward_params(const void* y_ptr, const void* z_ptr, const float* w,
                                             const void* dout_ptr, void* dy, void* dz, float* dweight,
                                             void* out = nullptr) const {
    GatedRmsNormBackwardParams p;
    p.fwd = params(y_ptr, z_ptr, w, out);
    p.dout = dout_ptr, p.dout_stride = strides(), p.dy = dy, p.dy_stride = strides();
    p.dz = c.z ? dz : nullptr, p.dz_stride = strides(), p.dweight = dweight;
    return p;
  }
  std::vector<double> oracle_out() const {
    return reference::gated_rmsnorm64(params(y.data(), z.data(), weight.data(), nullptr));
  }
  reference::RmsNormGrads64 oracle_grads() const {
    return reference::gated_rmsnorm_backward64(
        backward_params(y.data(), z.data(), weight.data(), dout.data(), nullptr, nullptr, nullptr));
  }
  // A [rows, dim] buffer laid out as y against the dense oracle values; with terms (the oracle's
  // dy_terms or dz_terms), each element's error against the larger of its value and its terms' scale.
  Comparison compare_rows(const std::string& name, const std::vector<uint8_t>& got, const std::vector<double>& want,
                          double tolerance, const std::vector<double>* terms = nullptr) const {
    ComparisonBuilder acc(name);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t f = 0; f < c.dim; ++f) {
        const int64_t i = r * c.dim + f;
        acc.add(host::load(got.data(), r * row + f, c.dtype), want[i], terms ? (*terms)[i] : 0.0);
      }
    return acc.done(tolerance);
  }
};

}  // namespace mamba2ssd::testing
