// The layer's causal convolution on the GPU (conv1d_cuda, conv1d_backward_cuda) against the fp64
// oracle: every dtype and width, with and without silu, bias and seq_idx, rows whose channels allow
// the kernels' 16-byte copies and strided ones that do not, and sizes that give one 64-token tile or
// hundreds, in segments of one to several tiles (each tile's halo of W - 1 tokens on both sides),
// channel counts that leave a tile part empty; outputs poisoned (NaN) first, the padding
// between strided rows left as it was, and a rerun of the backward that must give the same bits.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "conv1d_cases.h"
#include "device_array.h"
#include "test_matrix.h"

namespace mamba2ssd::testing {
namespace {

// Padding elements (strided rows) that are no longer the poison.
int64_t pad_touched(const HostConv1d& h, const std::vector<uint8_t>& buf) {
  int64_t n = 0;
  for (int64_t r = 0; r < h.c.batch * h.c.seqlen; ++r)
    for (int64_t ch = h.c.channels; ch < h.row; ++ch) n += !std::isnan(host::load(buf.data(), r * h.row + ch, h.c.dtype));
  return n;
}

void check_case(const Conv1dCase& c) {
  const std::string what = c.describe();
  const HostConv1d h(c);
  DeviceArray<uint8_t> x(h.x), dout(h.dout), out(h.x.size()), dx(h.x.size());
  DeviceArray<float> weight(h.weight), bias(c.bias ? h.bias : std::vector<float>(1)),
      dweight(h.weight.size()), dbias(c.channels);
  DeviceArray<int32_t> seq(c.seq_idx ? h.seq : std::vector<int32_t>(1));
  out.poison(), dx.poison(), dweight.poison(), dbias.poison();

  conv1d_cuda(h.params(x.p, weight.p, bias.p, seq.p, out.p), nullptr);
  launched();
  const Conv1dBackwardParams bp = h.backward_params(x.p, weight.p, bias.p, seq.p, dout.p, dx.p, dweight.p, dbias.p);
  DeviceArray<uint8_t> workspace(cuda_conv1d_backward_workspace_bytes(bp) + 1);
  conv1d_backward_cuda(bp, workspace.p, workspace.n, nullptr);
  launched();

  const double tol = conv1d_rel_l2_tolerance(c.dtype), wtol = conv1d_weight_rel_l2_tolerance();
  const std::vector<uint8_t> got_out = out.host(), got_dx = dx.host();
  const reference::Conv1dGrads64 g = h.oracle_grads();
  expect_pass(h.compare_rows("out", got_out, h.oracle_out(), tol), what);
  expect_pass(h.compare_rows("dx", got_dx, g.dx, tol), what);
  expect_pass(HostConv1d::compare_dense("dweight", dweight.host(), g.dweight, wtol), what);
  if (c.bias) expect_pass(HostConv1d::compare_dense("dbias", dbias.host(), g.dbias, wtol), what);
  if (c.strided) {
    EXPECT_EQ(pad_touched(h, got_out), 0) << what << ": out";
    EXPECT_EQ(pad_touched(h, got_dx), 0) << what << ": dx";
  }

  // Again from poison: the same bits (the sums in a fixed order; a moving result is a race).
  const std::vector<float> first_dweight = dweight.host();
  dx.poison(), dweight.poison();
  conv1d_backward_cuda(bp, workspace.p, workspace.n, nullptr);
  launched();
  EXPECT_EQ(std::memcmp(dx.host().data(), got_dx.data(), got_dx.size()), 0) << what << ": dx rerun";
  EXPECT_EQ(std::memcmp(dweight.host().data(), first_dweight.data(), first_dweight.size() * sizeof(float)), 0)
      << what << ": dweight rerun";
}

TEST(Conv1dCuda, EveryDtypeWidthAndFeature) {
  uint64_t seed = 100;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t W : {2, 3, 4})
      for (int features = 0; features < 8; ++features) {
        Conv1dCase c;
        c.dtype = t, c.width = W, c.seed = seed++;
        c.silu = features & 1, c.bias = features & 2, c.seq_idx = features & 4, c.strided = (features + W) % 2;
        check_case(c);
      }
}

TEST(Conv1dCuda, SizesAndSegments) {
  struct Size {
    int64_t b, L, C;
  };
  uint64_t seed = 500;
  for (Size s : {Size{1, 1, 1}, Size{1, 2, 129}, Size{3, 5, 300}, Size{1, 5000, 64}, Size{2, 777, 257},
                 Size{8, 300, 1000}, Size{1, 17, 128}, Size{8, 5000, 1000},  // several token tiles a block
                 Size{16, 700, 2048}})  // the forward's segments of two tiles: the last tile partial, the
                                        // last segment one tile
    for (int form = 0; form < 3; ++form) {  // plain; seq_idx; seq_idx with strided rows (one channel a thread)
      Conv1dCase c;
      c.batch = s.b, c.seqlen = s.L, c.channels = s.C, c.seq_idx = form > 0, c.strided = form == 2, c.seed = seed++;
      check_case(c);
    }
}

TEST(Conv1dCuda, RefusesASmallWorkspace) {
  Conv1dCase c;
  const HostConv1d h(c);
  DeviceArray<uint8_t> x(h.x), dout(h.dout), dx(h.x.size());
  DeviceArray<float> weight(h.weight), bias(h.bias), dweight(h.weight.size()), dbias(c.channels);
  const Conv1dBackwardParams bp =
      h.backward_params(x.p, weight.p, bias.p, nullptr, dout.p, dx.p, dweight.p, dbias.p);
  const std::size_t need = cuda_conv1d_backward_workspace_bytes(bp);
  ASSERT_GT(need, 0u);
  DeviceArray<uint8_t> workspace(need);
  try {
    conv1d_backward_cuda(bp, workspace.p, need - 1, nullptr);
    ADD_FAILURE() << "no Error for a workspace one byte short";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace: the convolution's backward needs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mamba2ssd::testing
