// The layer's gated RMSNorm on the GPU (gated_rmsnorm_cuda, gated_rmsnorm_backward_cuda) against the
// fp64 oracle: every dtype, both gate orders and no gate, group sizes from 1 to 8192 (one to 16
// features a thread, the forward's at most 8 in blocks of up to 1024 threads; threads left without
// one), rows aligned for 16-byte accesses and strided ones
// (one element an access), row counts below and above the backward's block count (blocks walking
// several rows), the backward writing the forward's output again (every other case) or leaving its
// buffer untouched; outputs poisoned (NaN) first, the padding between strided rows left as it was,
// and a rerun of the backward that must give the same bits.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "device_array.h"
#include "rmsnorm_cases.h"
#include "test_matrix.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

int64_t pad_touched(const HostRmsNorm& h, const std::vector<uint8_t>& buf) {
  int64_t n = 0;
  for (int64_t r = 0; r < h.c.rows; ++r)
    for (int64_t f = h.c.dim; f < h.row; ++f) n += !std::isnan(host::load(buf.data(), r * h.row + f, h.c.dtype));
  return n;
}

void check_case(const RmsNormCase& c) {
  const std::string what = c.describe();
  const HostRmsNorm h(c);
  DeviceArray<uint8_t> y(h.y), z(h.z), dout(h.dout), out(h.y.size()), dy(h.y.size()), dz(h.y.size());
  DeviceArray<uint8_t> out_again(h.y.size());  // the backward's copy of out (fwd.out), every other case
  DeviceArray<float> weight(h.weight), dweight(c.dim);
  out.poison(), dy.poison(), dz.poison(), dweight.poison(), out_again.poison();
  gated_rmsnorm_cuda(h.params(y.p, z.p, weight.p, out.p), nullptr);
  launched();
  const bool with_out = c.seed % 2 == 0;
  const GatedRmsNormBackwardParams bp =
      h.backward_params(y.p, z.p, weight.p, dout.p, dy.p, dz.p, dweight.p, with_out ? out_again.p : nullptr);
  DeviceArray<uint8_t> workspace(cuda_gated_rmsnorm_backward_workspace_bytes(bp));
  gated_rmsnorm_backward_cuda(bp, workspace.p, workspace.n, nullptr);
  launched();

  // fp32 arithmetic: the rounding of each output to the dtype (the decode step's bars, as the
  // convolution's), and dweight's fp32 sums over the rows. dy and dz are differences (dn - n mean):
  // each counts against its terms' scale (a group of one feature cancels them nearly whole).
  const double tol = conv1d_rel_l2_tolerance(c.dtype);
  const reference::RmsNormGrads64 g = h.oracle_grads();
  const std::vector<uint8_t> got_out = out.host(), got_dy = dy.host(), got_dz = dz.host();
  expect_pass(h.compare_rows("out", got_out, h.oracle_out(), tol), what);
  const std::vector<uint8_t> got_out_again = out_again.host();
  if (with_out) expect_pass(h.compare_rows("out (the backward's)", got_out_again, h.oracle_out(), tol), what);
  expect_pass(h.compare_rows("dy", got_dy, g.dy, tol, &g.dy_terms), what);
  if (c.z) expect_pass(h.compare_rows("dz", got_dz, g.dz, tol, &g.dz_terms), what);
  ComparisonBuilder dw("dweight");
  const std::vector<float> got_dweight = dweight.host();
  for (int64_t f = 0; f < c.dim; ++f) dw.add(got_dweight[f], g.dweight[f]);
  expect_pass(dw.done(conv1d_weight_rel_l2_tolerance()), what);
  if (!with_out) {  // not asked for: every element stays the poison
    int64_t written = 0;
    for (std::size_t i = 0; i < got_out_again.size() / dtype_size(c.dtype); ++i)
      written += !std::isnan(host::load(got_out_again.data(), static_cast<int64_t>(i), c.dtype));
    EXPECT_EQ(written, 0) << what << ": out written without being asked";
  }
  if (c.strided && with_out) EXPECT_EQ(pad_touched(h, got_out_again), 0) << what << ": out (the backward's)";
  if (c.strided) {
    EXPECT_EQ(pad_touched(h, got_out), 0) << what << ": out";
    EXPECT_EQ(pad_touched(h, got_dy), 0) << what << ": dy";
  }

  dy.poison(), dweight.poison();
  gated_rmsnorm_backward_cuda(bp, workspace.p, workspace.n, nullptr);
  launched();
  EXPECT_EQ(std::memcmp(dy.host().data(), got_dy.data(), got_dy.size()), 0) << what << ": dy rerun";
  EXPECT_EQ(std::memcmp(dweight.host().data(), got_dweight.data(), got_dweight.size() * sizeof(float)), 0)
      << what << ": dweight rerun";
}

// Every dtype and gate form, rows aligned and strided, at a few rows and at many rows a block (the
// backward's rows staged two in turn): small enough for compute-sanitizer's racecheck.
TEST(RmsNormCuda, EveryDtypeAndGate) {
  uint64_t seed = 300;
  for (int64_t rows : {5, 1200})
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
      for (int form = 0; form < 3; ++form)
        for (bool strided : {false, true}) {
          RmsNormCase c;
          if (rows > 5) c.rows = rows, c.dim = 512, c.group_size = 256;
          c.dtype = t, c.z = form > 0, c.norm_before_gate = form == 1, c.strided = strided, c.seed = seed++;
          check_case(c);
        }
}

// Every dtype with rows aligned for the kernels' 16-byte accesses and without (strided rows of dim + 5
// elements: one element a chunk), so both layouts run at every chunk count.
TEST(RmsNormCuda, GroupSizesAndRows) {
  struct Size {
    int64_t rows, dim, group;
  };
  uint64_t seed = 700;
  for (Size s : {Size{1, 1, 1}, Size{3, 40, 8}, Size{7, 300, 300}, Size{2, 512, 256}, Size{5, 1024, 1024},
                 Size{3, 4096, 4096}, Size{3, 5120, 5120}, Size{2, 8192, 8192}, Size{2, 5120, 640},
                 Size{2500, 64, 64}, Size{1100, 256, 32}, Size{1500, 2048, 1024}, Size{600, 8192, 8192}})
    for (DType t : {DType::kBF16, DType::kF32, DType::kF16})
      for (bool strided : {false, true})
        for (int form = 0; form < 2; ++form) {
          RmsNormCase c;
          c.rows = s.rows, c.dim = s.dim, c.group_size = s.group, c.dtype = t, c.strided = strided;
          c.norm_before_gate = form == 0, c.seed = seed++;
          check_case(c);
        }
}

}  // namespace
}  // namespace mamba2ssd::testing
