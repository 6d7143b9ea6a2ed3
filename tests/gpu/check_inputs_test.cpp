// Checked mode on the GPU (ForwardParams::check_inputs): forward_cuda launches a check kernel that
// records the first bad entry of cu_seqlens or seq_idx in the caller's input_status, with no host
// sync; the status is read after the next synchronization and check_input_status names the entry.
// backward_cuda (BackwardParams::fwd.check_inputs) launches the same check: CheckInputsCudaBackward
// mirrors the forward's cases.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "testing/backward_problem.h"
#include "testing/device_problem.h"

namespace mamba2ssd::testing {
namespace {

ProblemConfig packed(bool seq_idx, bool cu_seqlens) {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 333, c.nheads = 4, c.headdim = 64, c.dstate = 64, c.ngroups = 2, c.dtype = DType::kBF16;
  c.seqlens = {50, 150, 133}, c.seq_idx = seq_idx, c.cu_seqlens = cu_seqlens, c.varlen_states = cu_seqlens;
  c.seed = 77;
  return c;
}

struct Status {
  int64_t* d = nullptr;
  Status() {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int64_t) * kInputStatusWords), cudaSuccess);
    zero();
  }
  ~Status() { cudaFree(d); }
  void zero() { EXPECT_EQ(cudaMemset(d, 0, sizeof(int64_t) * kInputStatusWords), cudaSuccess); }
  std::vector<int64_t> read() const {  // after a synchronization
    std::vector<int64_t> h(kInputStatusWords);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), d, sizeof(int64_t) * kInputStatusWords, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

template <typename T>
void overwrite(HostProblem& host, const std::string& name, const std::vector<T>& values) {
  ASSERT_EQ(host.buffers.at(name).size(), values.size() * sizeof(T));
  std::memcpy(host.buffers.at(name).data(), values.data(), values.size() * sizeof(T));
}

// Runs forward_cuda checked, on every path that takes the call, and returns the status.
std::vector<int64_t> run_checked(const HostProblem& host, Status& status, CudaPath path = CudaPath::kAuto) {
  DeviceProblem dev(host);
  ForwardParams p = dev.params();
  p.cuda_path = path, p.check_inputs = true, p.input_status = status.d;
  forward_cuda(p, dev.workspace(), dev.workspace_bytes(), nullptr);
  return status.read();
}

std::string message(const std::vector<int64_t>& s) {
  try {
    check_input_status(s.data());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckInputsCuda, GoodInputsLeaveTheStatusClean) {
  for (auto [idx, cu] : {std::pair{false, true}, {true, false}, {true, true}}) {
    const HostProblem host(packed(idx, cu));
    Status status;
    EXPECT_EQ(run_checked(host, status), std::vector<int64_t>(kInputStatusWords, 0)) << host.config.describe();
  }
}

struct BadCuSeqlens {
  std::vector<int64_t> cu;
  std::vector<int64_t> want;  // {rule, row, index, value}
  std::string text;
};

// Hostile cu_seqlens for packed(): seqlen 333, three sequences.
std::vector<BadCuSeqlens> bad_cu_seqlens() {
  return {
      {{0, 300, 100, 333}, {2, 0, 2, 100}, "cu_seqlens[2] = 100 is less than the entry before it"},
      {{0, -7, -1000000, 333}, {2, 0, 1, -7}, "cu_seqlens[1] = -7"},
      {{-50, 20, 40, 333}, {1, 0, 0, -50}, "cu_seqlens[0] = -50: cu_seqlens must start at 0"},
      {{0, 100, 5000, int64_t{1} << 40}, {3, 0, 2, 5000}, "cu_seqlens[2] = 5000 is past the end"},
      {{0, int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62}, {3, 0, 1, int64_t{1} << 62}, "past the end"},
      {{0, 10, 20, 30}, {4, 0, 3, 30}, "cu_seqlens[3] = 30: the last offset must equal seqlen"},
  };
}

// seq_idx for packed(): ids 0, 1, 2 that decrease at 250 (2 -> 1) and 300 (2 -> -4); the first is
// named, as {5, 0, 250, 1}.
std::vector<int32_t> decreasing_ids() {
  std::vector<int32_t> ids(333, 0);
  for (int t = 50; t < 333; ++t) ids[t] = t < 200 ? 1 : 2;
  ids[250] = 1, ids[300] = -4;
  return ids;
}
const std::vector<int64_t> kDecreasingIdsStatus = {5, 0, 250, 1};
const char kDecreasingIdsText[] = "seq_idx[0, 250] = 1 is less than the id before it";

TEST(CheckInputsCuda, NamesTheFirstBadCuSeqlensEntry) {
  for (const BadCuSeqlens& c : bad_cu_seqlens()) {
    HostProblem host(packed(false, true));
    overwrite(host, "cu_seqlens", c.cu);
    Status status;
    const std::vector<int64_t> got = run_checked(host, status, CudaPath::kThreeKernel);
    EXPECT_EQ(got, c.want) << c.text;
    EXPECT_NE(message(got).find(c.text), std::string::npos) << message(got);
  }
}

TEST(CheckInputsCuda, NamesTheFirstDecreasingSeqIdx) {
  HostProblem host(packed(true, false));
  overwrite(host, "seq_idx", decreasing_ids());
  for (CudaPath path : {CudaPath::kThreeKernel, CudaPath::kAuto}) {
    Status status;
    const std::vector<int64_t> got = run_checked(host, status, path);
    EXPECT_EQ(got, kDecreasingIdsStatus) << to_string(path);
    EXPECT_NE(message(got).find(kDecreasingIdsText), std::string::npos);
  }
}

TEST(CheckInputsCuda, StatusIsStickyAndNeedsNoSync) {
  // Two bad calls queued back to back before one synchronization: the first one's entry stays.
  HostProblem first(packed(false, true)), second(packed(false, true));
  overwrite(first, "cu_seqlens", std::vector<int64_t>{0, 300, 100, 333});
  overwrite(second, "cu_seqlens", std::vector<int64_t>{-1, 10, 20, 333});
  DeviceProblem a(first), b(second);
  Status status;
  for (DeviceProblem* dev : {&a, &b}) {
    ForwardParams p = dev->params();
    p.check_inputs = true, p.input_status = status.d;
    forward_cuda(p, dev->workspace(), dev->workspace_bytes(), nullptr);
  }
  EXPECT_EQ(status.read(), (std::vector<int64_t>{2, 0, 2, 100}));
}

TEST(CheckInputsCuda, BlockingForwardThrows) {
  // forward() synchronizes anyway: checked, it reads its own status and throws the Error.
  HostProblem host(packed(false, true));
  overwrite(host, "cu_seqlens", std::vector<int64_t>{0, 300, 100, 333});
  DeviceProblem dev(host);
  ForwardParams p = dev.params();
  p.check_inputs = true;
  try {
    forward(p, Backend::kCuda);
    ADD_FAILURE() << "no Error for decreasing cu_seqlens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cu_seqlens[2] = 100"), std::string::npos) << e.what();
  }
  p.check_inputs = false;  // unchecked: runs (the kernels are safe), no error
  EXPECT_NO_THROW(forward(p, Backend::kCuda));
}

TEST(CheckInputsCuda, NeedsAStatusPointer) {
  const HostProblem host(packed(false, true));
  DeviceProblem dev(host);
  ForwardParams p = dev.params();
  p.check_inputs = true;
  try {
    forward_cuda(p, dev.workspace(), dev.workspace_bytes(), nullptr);
    ADD_FAILURE() << "checked forward_cuda ran without input_status";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs input_status"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// The backward: backward_cuda with fwd.check_inputs runs the forward's check kernel first.

// packed() for the backward: no varlen states (the CUDA backward does not take dvarlen_states).
ProblemConfig packed_bwd(bool seq_idx, bool cu_seqlens) {
  ProblemConfig c = packed(seq_idx, cu_seqlens);
  c.varlen_states = false;
  return c;
}

// Runs backward_cuda checked (gradients poisoned first) and returns the status; `grads` gets the
// gradient buffers when given.
std::vector<int64_t> run_backward_checked(const BackwardProblem& problem, Status& status,
                                          std::map<std::string, std::vector<uint8_t>>* grads = nullptr) {
  DeviceBackwardProblem dev(problem);
  dev.poison_gradients();
  BackwardParams p = dev.params();
  p.fwd.check_inputs = true, p.fwd.input_status = status.d;
  backward_cuda(p, dev.workspace(), dev.workspace_bytes(), nullptr);
  const std::vector<int64_t> got = status.read();
  if (grads) *grads = dev.download();
  return got;
}

TEST(CheckInputsCudaBackward, GoodInputsLeaveTheStatusCleanAndTheGradients) {
  // The check only reads: the gradients are the unchecked run's bits.
  for (auto [idx, cu] : {std::pair{false, true}, {true, false}, {true, true}}) {
    const BackwardProblem problem(packed_bwd(idx, cu));
    DeviceBackwardProblem plain(problem);
    plain.poison_gradients();
    plain.launch();
    Status status;
    std::map<std::string, std::vector<uint8_t>> checked;
    EXPECT_EQ(run_backward_checked(problem, status, &checked), std::vector<int64_t>(kInputStatusWords, 0))
        << problem.describe();
    EXPECT_TRUE(checked == plain.download()) << problem.describe();
  }
}

TEST(CheckInputsCudaBackward, NamesTheFirstBadCuSeqlensEntry) {
  for (const BadCuSeqlens& c : bad_cu_seqlens()) {
    BackwardProblem problem(packed_bwd(false, true));
    overwrite(problem.forward, "cu_seqlens", c.cu);
    Status status;
    const std::vector<int64_t> got = run_backward_checked(problem, status);
    EXPECT_EQ(got, c.want) << c.text;
    EXPECT_NE(message(got).find(c.text), std::string::npos) << message(got);
  }
}

TEST(CheckInputsCudaBackward, NamesTheFirstDecreasingSeqIdx) {
  BackwardProblem problem(packed_bwd(true, false));
  overwrite(problem.forward, "seq_idx", decreasing_ids());
  Status status;
  const std::vector<int64_t> got = run_backward_checked(problem, status);
  EXPECT_EQ(got, kDecreasingIdsStatus);
  EXPECT_NE(message(got).find(kDecreasingIdsText), std::string::npos);
}

TEST(CheckInputsCudaBackward, StatusIsStickyAndNeedsNoSync) {
  // A training step's forward and backward sharing one status, and a second bad backward, all
  // queued before one synchronization: the forward's entry stays.
  BackwardProblem first(packed_bwd(false, true)), second(packed_bwd(false, true));
  overwrite(first.forward, "cu_seqlens", std::vector<int64_t>{0, 300, 100, 333});
  overwrite(second.forward, "cu_seqlens", std::vector<int64_t>{-1, 10, 20, 333});
  DeviceProblem fwd(first.forward);
  DeviceBackwardProblem a(first), b(second);
  Status status;
  ForwardParams f = fwd.params();
  f.check_inputs = true, f.input_status = status.d;
  forward_cuda(f, fwd.workspace(), fwd.workspace_bytes(), nullptr);
  for (DeviceBackwardProblem* dev : {&a, &b}) {
    BackwardParams p = dev->params();
    p.fwd.check_inputs = true, p.fwd.input_status = status.d;
    backward_cuda(p, dev->workspace(), dev->workspace_bytes(), nullptr);
  }
  EXPECT_EQ(status.read(), (std::vector<int64_t>{2, 0, 2, 100}));
  // Zeroed again, the backward alone reports its own bad entry.
  status.zero();
  BackwardParams p = b.params();
  p.fwd.check_inputs = true, p.fwd.input_status = status.d;
  backward_cuda(p, b.workspace(), b.workspace_bytes(), nullptr);
  EXPECT_EQ(status.read(), (std::vector<int64_t>{1, 0, 0, -1}));
}

TEST(CheckInputsCudaBackward, BlockingBackwardThrows) {
  // backward() synchronizes anyway: checked, it reads its own status and throws the Error.
  BackwardProblem problem(packed_bwd(false, true));
  overwrite(problem.forward, "cu_seqlens", std::vector<int64_t>{0, 300, 100, 333});
  DeviceBackwardProblem dev(problem);
  BackwardParams p = dev.params();
  p.fwd.check_inputs = true;
  try {
    backward(p, Backend::kCuda);
    ADD_FAILURE() << "no Error for decreasing cu_seqlens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cu_seqlens[2] = 100"), std::string::npos) << e.what();
  }
  p.fwd.check_inputs = false;  // unchecked: runs (the kernels are safe), no error
  EXPECT_NO_THROW(backward(p, Backend::kCuda));
}

TEST(CheckInputsCudaBackward, NeedsAStatusPointer) {
  const BackwardProblem problem(packed_bwd(false, true));
  DeviceBackwardProblem dev(problem);
  BackwardParams p = dev.params();
  p.fwd.check_inputs = true;
  try {
    backward_cuda(p, dev.workspace(), dev.workspace_bytes(), nullptr);
    ADD_FAILURE() << "checked backward_cuda ran without input_status";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs input_status"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mamba2ssd::testing
