// The layer's causal convolution as a test problem (CPU and GPU tests): random x, dout, weight and
// bias in host buffers (x, dout in dtype, rows padded when strided), packed sequences for seq_idx
// (ones of one token among them), and the comparison of outputs with the fp64 oracle.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/host_dtype.h"
#include "mamba2ssd/mamba2ssd.h"
#include "reference/conv1d.h"
#include "testing/problem.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {

struct Conv1dCase {
  int64_t batch = 2, seqlen = 37, channels = 130, width = 4;
  DType dtype = DType::kBF16;
  bool silu = true, bias = true, seq_idx = false, strided = false;
  uint64_t seed = 1;
  std::string describe() const {
    return "b" + std::to_string(batch) + " L" + std::to_string(seqlen) + " C" + std::to_string(channels) + " W" +
           std::to_string(width) + " " + to_string(dtype) + (silu ? " silu" : "") + (bias ? " bias" : "") +
           (seq_idx ? " seq_idx" : "") + (strided ? " strided" : "") + " seed" + std::to_string(seed);
  }
};

// Host buffers of one case. A strided case pads each token's row of x, dout, out and dx by 3
// elements (the layer's xBC is a slice of zxbcdt's columns).
struct HostConv1d {
  Conv1dCase c;
  int64_t row = 0;  // elements between tokens
  std::vector<uint8_t> x, dout;
  std::vector<float> weight, bias;
  std::vector<int32_t> seq;

  explicit HostConv1d(const Conv1dCase& cc) : c(cc), row(cc.channels + (cc.strided ? 3 : 0)) {
    std::mt19937_64 rng(c.seed);
    std::normal_distribution<float> normal;
    const std::size_t es = dtype_size(c.dtype), n = static_cast<std::size_t>(c.batch * c.seqlen * row);
    x.assign(n * es, 0), dout.assign(n * es, 0);
    for (std::size_t i = 0; i < n; ++i) host::store(x.data(), static_cast<int64_t>(i), c.dtype, normal(rng));
    for (std::size_t i = 0; i < n; ++i) host::store(dout.data(), static_cast<int64_t>(i), c.dtype, normal(rng));
    weight.resize(c.channels * c.width);
    for (float& w : weight) w = 0.5f * normal(rng);
    if (c.bias) {
      bias.resize(c.channels);
      for (float& b : bias) b = 0.1f * normal(rng);
    }
    if (c.seq_idx) {  // sequences of 1 to 12 tokens, ids counting up along each row
      seq.resize(c.batch * c.seqlen);
      std::uniform_int_distribution<int> len(1, 12);
      for (int64_t b = 0; b < c.batch; ++b) {
        int32_t id = 0;
        for (int64_t t = 0, left = len(rng); t < c.seqlen; ++t, --left) {
          if (left == 0) ++id, left = len(rng);
          seq[b * c.seqlen + t] = id;
        }
      }
    }
  }
  Strides3 strides() const { return {c.seqlen * row, row, 1}; }
  int64_t elements() const { return c.batch * c.seqlen * row; }

  // The call's parameters on the given buffers (host or device copies of these).
  Conv1dParams params(const void* x_ptr, const float* w, const float* b, const int32_t* s, void* out) const {
    Conv1dParams p;
    p.batch = c.batch, p.seqlen = c.seqlen, p.channels = c.channels, p.width = c.width, p.dtype = c.dtype;
    p.x = x_ptr, p.x_stride = strides(), p.weight = w, p.bias = c.bias ? b : nullptr;
    p.seq_idx = c.seq_idx ? s : nullptr, p.seq_idx_stride = {c.seqlen, 1};
    p.silu = c.silu, p.out = out, p.out_stride = strides();
    return p;
  }
  Conv1dBackwardParams backward_params(const void* x_ptr, const float* w, const float* b, const int32_t* s,
                                       const void* dout_ptr, void* dx, float* dweight, float* dbias) const {
    Conv1dBackwardParams p;
    p.fwd = params(x_ptr, w, b, s, nullptr);
    p.dout = dout_ptr, p.dout_stride = strides(), p.dx = dx, p.dx_stride = strides();
    p.dweight = dweight, p.dbias = c.bias ? dbias : nullptr;
    return p;
  }
  // The oracle on the host buffers.
  std::vector<double> oracle_out() const {
    return reference::conv1d64(params(x.data(), weight.data(), bias.data(), seq.data(), nullptr));
  }
  reference::Conv1dGrads64 oracle_grads() const {
    return reference::conv1d_backward64(
        backward_params(x.data(), weight.data(), bias.data(), seq.data(), dout.data(), nullptr, nullptr, nullptr));
  }
  // A [b, L, C] buffer laid out as x (dtype) against the dense oracle values.
  Comparison compare_rows(const std::string& name, const std::vector<uint8_t>& got, const std::vector<double>& want,
                          double tolerance) const {
    ComparisonBuilder acc(name);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t t = 0; t < c.seqlen; ++t)
        for (int64_t ch = 0; ch < c.channels; ++ch)
          acc.add(host::load(got.data(), (b * c.seqlen + t) * row + ch, c.dtype),
                  want[(b * c.seqlen + t) * c.channels + ch]);
    return acc.done(tolerance);
  }
  static Comparison compare_dense(const std::string& name, const std::vector<float>& got,
                                  const std::vector<double>& want, double tolerance) {
    ComparisonBuilder acc(name);
    for (std::size_t i = 0; i < want.size(); ++i) acc.add(i < got.size() ? got[i] : 0.0 / 0.0, want[i]);
    return acc.done(tolerance);
  }
};

}  // namespace mamba2ssd::testing
