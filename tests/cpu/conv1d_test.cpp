// The layer's causal convolution on the host: validation naming each bad parameter, the fp64 oracle
// against what its formula implies (identity and shift weights, taps cut at sequence starts) and its
// backward against central differences of its forward, and conv1d_reference as a backend (strided
// outputs, the padding between rows untouched).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "conv1d_cases.h"
#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

struct Buffers {
  HostConv1d h;
  std::vector<uint8_t> out, dx;
  std::vector<float> dweight, dbias;
  explicit Buffers(const Conv1dCase& c)
      : h(c), out(h.x.size()), dx(h.x.size()), dweight(c.channels * c.width), dbias(c.channels) {}
  Conv1dParams fwd() { return h.params(h.x.data(), h.weight.data(), h.bias.data(), h.seq.data(), out.data()); }
  Conv1dBackwardParams bwd() {
    return h.backward_params(h.x.data(), h.weight.data(), h.bias.data(), h.seq.data(), h.dout.data(), dx.data(),
                             dweight.data(), dbias.data());
  }
};

TEST(Conv1dValidate, NamesEachBadParameter) {
  Conv1dCase c;
  c.seq_idx = true;
  Buffers b(c);
  EXPECT_NO_THROW(validate(b.fwd()));
  EXPECT_NO_THROW(validate(b.bwd()));
  auto fwd_with = [&](auto change) { return validate_changed(b.fwd(), change); };
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.width = 5; }), "width must be 2, 3 or 4, got 5");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.width = 1; }), "width must be 2, 3 or 4, got 1");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.batch = 0; }), "batch must be >= 1, got 0");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.seqlen = -3; }), "seqlen must be >= 1, got -3");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.channels = 0; }), "channels must be >= 1, got 0");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.dtype = DType::kF64; }), "dtype fp64");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.x = nullptr; }), "x is null");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.weight = nullptr; }), "weight is null");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.out = nullptr; }), "out (the output) is null");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.x_stride.s2 = 2; }), "x: last dimension must be contiguous");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.seq_idx_stride.s1 = -1; }), "seq_idx: negative stride");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.out = const_cast<void*>(p.x); }), "output out overlaps input x");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.out_stride.s1 = 1; }), "out: strides");
  expect_error_naming(fwd_with([](Conv1dParams& p) {
                 p.batch = int64_t{1} << 30, p.seqlen = int64_t{1} << 30;
               }),
               "batch must be at most 65535");
  expect_error_naming(fwd_with([](Conv1dParams& p) { p.seqlen = int64_t{1} << 40, p.channels = int64_t{1} << 20; }),
               "batch * seqlen * channels = 2 * 1099511627776 * 1048576 is more than 2^56 elements");

  auto bwd_with = [&](auto change) { return validate_changed(b.bwd(), change); };
  expect_error_naming(bwd_with([](Conv1dBackwardParams& p) { p.dout = nullptr; }), "dout is null");
  expect_error_naming(bwd_with([](Conv1dBackwardParams& p) { p.dx = nullptr; }), "dx is null");
  expect_error_naming(bwd_with([](Conv1dBackwardParams& p) { p.dweight = nullptr; }), "dweight is null");
  expect_error_naming(bwd_with([](Conv1dBackwardParams& p) { p.dx = const_cast<void*>(p.dout); }),
               "output dx overlaps input dout");
  expect_error_naming(bwd_with([](Conv1dBackwardParams& p) { p.dbias = p.dweight + 1; }),
               "output dweight overlaps output dbias");
  expect_error_naming(bwd_with([](Conv1dBackwardParams& p) { p.fwd.width = 7; }), "width must be 2, 3 or 4, got 7");
}

// weight [0, .., 0, 1]: out = x (no bias, no activation); [1, 0, .., 0]: out[t] = x[t - (W - 1)],
// zero where that token is before 0 or of another sequence.
TEST(Conv1dOracle, IdentityAndShiftWeights) {
  for (int64_t W : {2, 3, 4}) {
    Conv1dCase c;
    c.width = W, c.dtype = DType::kF32, c.silu = false, c.bias = false, c.seq_idx = true, c.seqlen = 50;
    HostConv1d h(c);
    for (int64_t ch = 0; ch < c.channels; ++ch)
      for (int64_t k = 0; k < W; ++k) h.weight[ch * W + k] = k == W - 1 ? 1.0f : 0.0f;
    std::vector<double> out = h.oracle_out();
    auto x_at = [&](int64_t b, int64_t t, int64_t ch) {
      return static_cast<double>(host::load(h.x.data(), (b * c.seqlen + t) * h.row + ch, c.dtype));
    };
    int64_t wrong = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t t = 0; t < c.seqlen; ++t)
        for (int64_t ch = 0; ch < c.channels; ++ch)
          wrong += out[(b * c.seqlen + t) * c.channels + ch] != x_at(b, t, ch);
    EXPECT_EQ(wrong, 0) << "identity, W " << W;

    for (int64_t ch = 0; ch < c.channels; ++ch)
      for (int64_t k = 0; k < W; ++k) h.weight[ch * W + k] = k == 0 ? 1.0f : 0.0f;
    out = h.oracle_out();
    wrong = 0;
    int64_t cut = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t t = 0; t < c.seqlen; ++t) {
        const int64_t s = t - (W - 1);
        const bool reads = s >= 0 && h.seq[b * c.seqlen + s] == h.seq[b * c.seqlen + t];
        cut += s >= 0 && !reads;
        for (int64_t ch = 0; ch < c.channels; ++ch)
          wrong += out[(b * c.seqlen + t) * c.channels + ch] != (reads ? x_at(b, s, ch) : 0.0);
      }
    EXPECT_EQ(wrong, 0) << "shift, W " << W;
    EXPECT_GT(cut, 0) << "the case has taps cut at sequence starts";
  }
}

// The loss sum(dout * out) in fp64 as a function of one input element, by central differences.
TEST(Conv1dOracle, BackwardIsTheForwardsDerivative) {
  Conv1dCase c;
  c.batch = 2, c.seqlen = 19, c.channels = 3, c.width = 4, c.dtype = DType::kF32, c.seq_idx = true, c.seed = 5;
  HostConv1d h(c);
  const reference::Conv1dGrads64 g = h.oracle_grads();
  auto loss = [&] {
    const std::vector<double> out = h.oracle_out();
    double l = 0.0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t t = 0; t < c.seqlen; ++t)
        for (int64_t ch = 0; ch < c.channels; ++ch)
          l += out[(b * c.seqlen + t) * c.channels + ch] * host::load(h.dout.data(), (b * c.seqlen + t) * h.row + ch,
                                                                       c.dtype);
    return l;
  };
  auto derivative = [&](float& v) { return central_difference(v, 1e-2f, loss); };
  auto check = [&](const char* name, double got, double want) {
    EXPECT_NEAR(got, want, 2e-3 * (1.0 + std::abs(want))) << name;
  };
  float* x = reinterpret_cast<float*>(h.x.data());
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t t = 0; t < c.seqlen; ++t)
      for (int64_t ch = 0; ch < c.channels; ++ch)
        check("dx", g.dx[(b * c.seqlen + t) * c.channels + ch], derivative(x[(b * c.seqlen + t) * h.row + ch]));
  for (int64_t i = 0; i < c.channels * c.width; ++i) check("dweight", g.dweight[i], derivative(h.weight[i]));
  for (int64_t ch = 0; ch < c.channels; ++ch) check("dbias", g.dbias[ch], derivative(h.bias[ch]));
}

// conv1d_reference and conv1d_backward_reference: the oracle rounded into the caller's (strided)
// buffers, the padding between rows as it was.
TEST(Conv1dReference, WritesTheOracleIntoStridedOutputs) {
  Conv1dCase c;
  c.strided = true, c.seq_idx = true, c.dtype = DType::kBF16;
  Buffers b(c);
  const float poison = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < b.h.elements(); ++i) {
    host::store(b.out.data(), i, c.dtype, poison);
    host::store(b.dx.data(), i, c.dtype, poison);
  }
  conv1d_reference(b.fwd());
  conv1d_backward_reference(b.bwd());
  const std::vector<double> out = b.h.oracle_out();
  const reference::Conv1dGrads64 g = b.h.oracle_grads();
  int64_t wrong = 0, pad_touched = 0;
  for (int64_t r = 0; r < c.batch * c.seqlen; ++r)
    for (int64_t ch = 0; ch < b.h.row; ++ch) {
      const int64_t at = r * b.h.row + ch;
      const float o = host::load(b.out.data(), at, c.dtype), d = host::load(b.dx.data(), at, c.dtype);
      if (ch >= c.channels) {
        pad_touched += !std::isnan(o) || !std::isnan(d);
        continue;
      }
      wrong += o != host::round_to(c.dtype, static_cast<float>(out[r * c.channels + ch]));
      wrong += d != host::round_to(c.dtype, static_cast<float>(g.dx[r * c.channels + ch]));
    }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(pad_touched, 0);
  for (int64_t i = 0; i < c.channels * c.width; ++i) EXPECT_EQ(b.dweight[i], static_cast<float>(g.dweight[i]));
  for (int64_t ch = 0; ch < c.channels; ++ch) EXPECT_EQ(b.dbias[ch], static_cast<float>(g.dbias[ch]));
}

}  // namespace
}  // namespace mamba2ssd::testing
