// Checked mode (ForwardParams::check_inputs) on the host backends and its host pieces: seq_idx
// must be non-decreasing along each row there (cu_seqlens is checked in every mode), forward and
// backward (BackwardParams::fwd.check_inputs), input_status is refused without check_inputs, and
// check_input_status names the bad entry the device recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

#include "backward_helpers.h"
#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

ProblemConfig packed_seq_idx() {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 100, c.nheads = 2, c.headdim = 32, c.dstate = 16, c.dtype = DType::kF32;
  c.seqlens = {40, 60}, c.seq_idx = true, c.cu_seqlens = false, c.varlen_states = false;
  return c;
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no Error; expected one naming \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(CheckInputs, HostBackendsRefuseDecreasingSeqIdx) {
  HostProblem host(packed_seq_idx());
  buffer<int32_t>(host, "seq_idx")[70] = 0;  // ids 0 x40, 1 x60: a return to 0 at token 70
  ForwardParams p = host.params();
  // Unchecked, the contract accepts it (a change of id starts a sequence): no error.
  EXPECT_NO_THROW(forward_cpu(p));
  EXPECT_NO_THROW(forward_reference(p));
  p.check_inputs = true;
  const std::string want = "seq_idx[0, 70] = 0 is less than the id before it";
  expect_error([&] { forward_cpu(p); }, want);
  expect_error([&] { forward_reference(p); }, want);
  expect_error([&] { forward(p, Backend::kCpu); }, want);
  // Well-formed contents pass the check.
  HostProblem good(packed_seq_idx());
  ForwardParams q = good.params();
  q.check_inputs = true;
  EXPECT_NO_THROW(forward_cpu(q));
}

// The backward, by the forward's rules: both host backends and backward(), the gradients untouched.
void expect_backward_refused(BackwardProblem& problem, bool check_inputs, const std::string& want) {
  problem.poison_gradients();
  const auto before = problem.buffers;
  BackwardParams p = problem.params();
  p.fwd.check_inputs = check_inputs;
  expect_error([&] { backward_cpu(p); }, want);
  expect_error([&] { backward_reference(p); }, want);
  expect_error([&] { backward(p, Backend::kCpu); }, want);
  EXPECT_TRUE(problem.buffers == before) << "a gradient was written before the refusal";
}

TEST(CheckInputs, HostBackwardRefusesDecreasingSeqIdx) {
  BackwardProblem problem(packed_seq_idx());
  buffer<int32_t>(problem.forward, "seq_idx")[70] = 0;  // as the forward's case: a return to 0
  // Unchecked, the contract accepts it: no error.
  EXPECT_NO_THROW(backward_cpu(problem.params()));
  EXPECT_NO_THROW(backward_reference(problem.params()));
  expect_backward_refused(problem, true, "seq_idx[0, 70] = 0 is less than the id before it");
}

TEST(CheckInputs, HostBackwardRefusesBadCuSeqlensInEveryMode) {
  ProblemConfig c = packed_seq_idx();
  c.seq_idx = false, c.cu_seqlens = true;  // seqlens {40, 60}: cu_seqlens {0, 40, 100}
  const std::pair<std::vector<int64_t>, std::string> cases[] = {
      {{5, 40, 100}, "cu_seqlens [0] must be 0, got 5"},
      {{0, 100, 40}, "cu_seqlens must be non-decreasing, got [1] = 100 > [2] = 40"},
      {{0, 40, 99}, "cu_seqlens [2] must equal seqlen 100, got 99"},
  };
  for (const auto& [offsets, want] : cases) {
    BackwardProblem problem(c);
    std::copy(offsets.begin(), offsets.end(), buffer<int64_t>(problem.forward, "cu_seqlens"));
    for (bool checked : {false, true}) expect_backward_refused(problem, checked, want);
  }
}

TEST(CheckInputs, HostBackwardCheckedGivesTheSameGradients) {
  // The check only reads: on good contents, checked and unchecked gradients are the same bits.
  BackwardProblem problem(packed_seq_idx());
  problem.poison_gradients();
  backward_cpu(problem.params());
  const auto plain = problem.buffers;
  problem.poison_gradients();
  BackwardParams p = problem.params();
  p.fwd.check_inputs = true;
  backward_cpu(p);
  EXPECT_TRUE(problem.buffers == plain);
}

TEST(CheckInputs, BackwardInputStatusRules) {
  // The forward's rules, through validate(BackwardParams): only with check_inputs, 8-byte aligned,
  // and an output of the call (overlapping nothing).
  BackwardProblem problem(packed_seq_idx());
  BackwardParams p = problem.params();
  int64_t status[kInputStatusWords] = {};
  p.fwd.input_status = status;
  expect_error([&] { validate(p); }, "input_status is given but check_inputs is false");
  p.fwd.check_inputs = true;
  EXPECT_NO_THROW(validate(p));
  p.fwd.input_status = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(status) + 4);
  expect_error([&] { validate(p); }, "input_status");  // not 8-byte aligned
  p.fwd.input_status = reinterpret_cast<int64_t*>(p.dx);
  expect_error([&] { validate(p); }, "overlaps output input_status");
}

TEST(CheckInputs, InputStatusNeedsCheckInputs) {
  HostProblem host(packed_seq_idx());
  ForwardParams p = host.params();
  int64_t status[kInputStatusWords] = {};
  p.input_status = status;
  expect_error([&] { validate(p); }, "input_status is given but check_inputs is false");
  p.check_inputs = true;
  EXPECT_NO_THROW(validate(p));
  p.input_status = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(status) + 4);
  expect_error([&] { validate(p); }, "input_status");  // not 8-byte aligned
}

TEST(CheckInputs, StatusNamesTheEntry) {
  const int64_t good[kInputStatusWords] = {0, 0, 0, 0};
  EXPECT_NO_THROW(check_input_status(good));
  const int64_t decreasing[kInputStatusWords] = {2, 0, 2, 100};
  expect_error([&] { check_input_status(decreasing); },
               "cu_seqlens[2] = 100 is less than the entry before it: cu_seqlens must be non-decreasing");
  const int64_t first[kInputStatusWords] = {1, 0, 0, -5};
  expect_error([&] { check_input_status(first); }, "cu_seqlens[0] = -5: cu_seqlens must start at 0");
  const int64_t past[kInputStatusWords] = {3, 0, 1, int64_t{1} << 62};
  expect_error([&] { check_input_status(past); }, "cu_seqlens[1] = 4611686018427387904 is past the end");
  const int64_t last[kInputStatusWords] = {4, 0, 3, 30};
  expect_error([&] { check_input_status(last); }, "cu_seqlens[3] = 30: the last offset must equal seqlen");
  const int64_t ids[kInputStatusWords] = {5, 1, 17, -3};
  expect_error([&] { check_input_status(ids); }, "seq_idx[1, 17] = -3 is less than the id before it");
  const int64_t junk[kInputStatusWords] = {99, 0, 0, 0};
  expect_error([&] { check_input_status(junk); }, "unknown rule 99");
}

}  // namespace
}  // namespace mamba2ssd::testing
