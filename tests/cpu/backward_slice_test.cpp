// The backward's check on a slice (what `mamba2ssd run --backward` uses on large problems): with the
// cotangents zero outside the slice, the oracle on the slice's batch rows and heads gives exactly the
// whole oracle's gradients there (sums over batch rows and a group's heads included), and the
// comparison reads only the slice.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backward_helpers.h"
#include "common/host_dtype.h"

namespace mamba2ssd::testing {
namespace {

ProblemConfig config() {
  ProblemConfig c;
  c.batch = 3, c.seqlen = 150, c.nheads = 6, c.ngroups = 3, c.headdim = 32, c.dstate = 16, c.chunk_size = 64;
  c.dtype = DType::kF32, c.z = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true;
  c.initial_states = true;
  return c;
}

reference::Slice rows_and_heads(int64_t b0, int64_t b1, int64_t h0, int64_t h1) {
  reference::Slice s;
  s.batch_begin = b0, s.batch_end = b1, s.head_begin = h0, s.head_end = h1;
  return s;
}

TEST(BackwardSlice, NeedsEveryToken) {
  reference::Slice tokens = rows_and_heads(0, 1, 0, 2);
  tokens.token_end = 10;
  EXPECT_THROW(backward_slice(config(), tokens), Error);
  const reference::Slice all = backward_slice(config(), reference::Slice{});
  EXPECT_EQ(all.batch_end, 3);
  EXPECT_EQ(all.head_end, 6);
}

// The slice's oracle equals the whole oracle's gradients on the slice, element for element.
TEST(BackwardSlice, OracleOnSliceIsTheWholeOraclesSlice) {
  BackwardProblem problem(config());
  const reference::Slice slice = rows_and_heads(1, 2, 1, 4);  // part of group 0, all of group 1
  restrict_cotangents(problem, slice);
  problem.poison_gradients();
  backward_reference(problem.params());  // the whole oracle, rounded to fp32 in the buffers
  const std::vector<Comparison> cmps =
      compare_gradients(problem, problem.buffers, backward_oracle(problem, slice), slice);
  ASSERT_EQ(cmps.size(), problem.gradients.size());
  for (const Comparison& c : cmps) {
    EXPECT_TRUE(c.pass()) << c.name << " rel_l2 " << c.rel_l2;
    EXPECT_LT(c.rel_l2, 1e-6) << c.name << ": more than fp32 rounding";
  }
}

// Poison outside the slice goes unseen; one wrong element inside it fails that gradient. And without
// restricting the cotangents, the sums over batch rows (dA) would not match the slice's oracle.
TEST(BackwardSlice, ReadsOnlyTheSlice) {
  BackwardProblem problem(config());
  const reference::Slice slice = rows_and_heads(0, 1, 0, 2);
  restrict_cotangents(problem, slice);
  problem.poison_gradients();
  const reference::Grads64 ref = backward_oracle(problem, slice);
  backward_cpu(problem.params());
  // Spoil dx of batch row 2 (outside) everywhere: still passes.
  const GradView& dx = problem.gradients.at("dx");
  uint8_t* buf = problem.buffers.at(dx.buffer).data();
  for (int64_t t = 0; t < dx.size[1]; ++t)
    host::store(buf, dx.offset + 2 * dx.stride[0] + t * dx.stride[1], dx.dtype, NAN);
  for (const Comparison& c : compare_gradients(problem, problem.buffers, ref, slice))
    EXPECT_TRUE(c.pass()) << c.name;
  // One element of dx inside the slice: fails dx only.
  host::store(buf, dx.offset + 5 * dx.stride[1] + 1 * dx.stride[2], dx.dtype, 1e3f);
  for (const Comparison& c : compare_gradients(problem, problem.buffers, ref, slice))
    EXPECT_EQ(c.pass(), c.name != "dx") << c.name;

  BackwardProblem whole(config());
  backward_cpu(whole.params());
  for (const Comparison& c : compare_gradients(whole, whole.buffers, backward_oracle(whole, slice), slice))
    if (c.name == "dA") EXPECT_FALSE(c.pass()) << "dA sums over every batch row";
}

}  // namespace
}  // namespace mamba2ssd::testing
