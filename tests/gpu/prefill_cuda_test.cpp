// The CUDA packed prefill against the fp64 oracle: the CPU tests' matrix (every feature, slot rule,
// intermediate states and cache dtype) and the padded layout's own edges (requests of exactly one
// chunk and of one token more or less, chunk sizes 64, 128 and 256, long requests with many
// boundaries, fp32 with 3xTF32), each with y poisoned (NaN) first, the cache between guard regions
// that must stay intact, and a rerun from the same cache that must give the same bits (a moving
// result is a race). Also: slot entries outside the cache (treated as pads, nothing touched outside
// it), CUDA graph capture and replay, the blocking prefill(), and the refusals.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api/internal.h"
#include "test_matrix.h"
#include "testing/device_prefill_problem.h"
#include "testing/prefill_problem.h"

namespace mamba2ssd::testing {
namespace {

// The hopper path's segments forced for a scope: n > 0 segments over the padded chunks, n < 0
// segments of whole requests, -n of them (kRequestEach: one a request), 0 its own choice.
constexpr int64_t kRequestEach = -(int64_t{1} << 40);
struct ForcedSegments {
  explicit ForcedSegments(int64_t n) {
    detail::set_fused_segments_for_testing(n > 0 ? n : 0);
    detail::set_prefill_request_groups_for_testing(n < 0 ? -n : 0);
  }
  ~ForcedSegments() {
    detail::set_fused_segments_for_testing(0);
    detail::set_prefill_request_groups_for_testing(0);
  }
  ForcedSegments(const ForcedSegments&) = delete;
  ForcedSegments& operator=(const ForcedSegments&) = delete;
};

// y and the cache of the device problem after one launch (y poisoned, the cache as drawn first).
HostPrefillProblem run_once(const HostPrefillProblem& host, DevicePrefillProblem& dev,
                            CudaPath path = CudaPath::kAuto) {
  dev.reset();
  dev.launch(nullptr, path);
  HostPrefillProblem got = host;
  dev.download(got);
  return got;
}

// Whether the hopper path takes the problem's call (16-bit, aligned, an sm_90 GPU and build).
bool hopper_takes(const DevicePrefillProblem& dev) {
  PrefillParams p = dev.params();
  p.fwd.cuda_path = CudaPath::kHopper;
  try {
    (void)cuda_prefill_workspace_bytes(p);
  } catch (const Error&) {
    return false;
  }
  return true;
}

// On the three-kernel path, and on the hopper path where it takes the call with its own segments,
// with one and three forced (requests entering a segment from an earlier one, segment ends
// holding a request's start, final states deferred past the walk), with a segment per request and
// with two segments of whole requests (a block walking from one request into the next, a segment
// perhaps empty); each run against the oracle, the guards, and a rerun's bits.
void check_prefill(const PrefillConfig& config) {
  HostPrefillProblem host(config);
  const PrefillOracle ref = prefill_oracle(host);
  DevicePrefillProblem dev(host);
  auto check_on = [&](CudaPath path, int64_t segments) {
    const ForcedSegments forced(segments);
    std::string what = std::string("prefill ") + to_string(path) + " " + config.describe();
    if (segments > 0) what += " segments " + std::to_string(segments);
    if (segments == kRequestEach) what += " a segment per request";
    else if (segments < 0) what += " " + std::to_string(-segments) + " segments of whole requests";
    const HostPrefillProblem first = run_once(host, dev, path);
    expect_pass(compare_prefill(first, ref), what);
    EXPECT_EQ(dev.guard_damage(), "") << what;
    const HostPrefillProblem again = run_once(host, dev, path);
    EXPECT_TRUE(again.fwd.buffers.at("y") == first.fwd.buffers.at("y")) << what << ": a rerun's y differs (race?)";
    EXPECT_TRUE(again.state == first.state) << what << ": a rerun's cache differs (race?)";
  };
  check_on(CudaPath::kThreeKernel, 0);
  if (hopper_takes(dev))
    for (int64_t segments : {int64_t{0}, int64_t{1}, int64_t{3}, kRequestEach, int64_t{-2}})
      check_on(CudaPath::kHopper, segments);
}

std::vector<PrefillConfig> padded_layout_cases() {
  std::vector<PrefillConfig> v;
  uint64_t seed = 500;
  auto add = [&](auto&& edit) {
    PrefillConfig c;
    c.headdim = 64, c.dstate = 64, c.nheads = 4, c.ngroups = 2;
    edit(c);
    c.seed = seed++;
    v.push_back(c);
  };
  for (int64_t chunk : {64, 128, 256}) {
    // Requests of one chunk, one token less and one more, at each chunk size; one request of many.
    add([&](PrefillConfig& c) { c.chunk_size = chunk, c.seqlens = {128, 127, 129, 1, 255, 256, 257}; });
    add([&](PrefillConfig& c) { c.chunk_size = chunk, c.seqlens = {1500}, c.state_every = 2 * chunk; });
    add([&](PrefillConfig& c) {
      c.chunk_size = chunk, c.seqlens = {chunk * 3, 5, 0, chunk * 2 + 7, 700}, c.state_every = chunk, c.pads = 1;
      c.z = true, c.dt_bias = true, c.dt_softplus = true, c.D_layout = DLayout::kPerHeadDim;
    });
  }
  // fp32 on 3xTF32, head dims 32 and 128, state 256, bf16 cache with intermediate states.
  add([](PrefillConfig& c) { c.dtype = DType::kF32, c.seqlens = {300, 2, 130}; });
  add([](PrefillConfig& c) { c.headdim = 32, c.dstate = 128, c.seqlens = {90, 400, 17}; });
  add([](PrefillConfig& c) { c.headdim = 128, c.dstate = 256, c.nheads = 2, c.seqlens = {200, 64, 333}; });
  // Head dims no power of two (Nemotron-H's 80; 16), with intermediate states and every feature.
  add([](PrefillConfig& c) {
    c.headdim = 80, c.dstate = 128, c.seqlens = {300, 0, 1, 130, 700}, c.state_every = 128, c.chunk_size = 128;
    c.z = true, c.dt_bias = true, c.dt_softplus = true, c.D_layout = DLayout::kPerHeadDim;
  });
  add([](PrefillConfig& c) { c.headdim = 16, c.dstate = 48, c.dtype = DType::kF32, c.seqlens = {90, 400, 17}; });
  add([](PrefillConfig& c) {
    c.state_dtype = DType::kBF16, c.seqlens = {1000, 0, 1, 300, 2047, 64}, c.state_every = 128, c.chunk_size = 128;
  });
  add([](PrefillConfig& c) { c.dtype = DType::kF16, c.state_dtype = DType::kF16, c.seqlens = {64, 64, 64, 64, 1}; });
  return v;
}

class PrefillCuda : public ::testing::TestWithParam<PrefillConfig> {};
TEST_P(PrefillCuda, MatchesOracle) { check_prefill(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Features, PrefillCuda, ::testing::ValuesIn(prefill_test_matrix(1)),
                         [](const ::testing::TestParamInfo<PrefillConfig>& info) {
                           return "case" + std::to_string(info.index);
                         });
INSTANTIATE_TEST_SUITE_P(PaddedLayout, PrefillCuda, ::testing::ValuesIn(padded_layout_cases()),
                         [](const ::testing::TestParamInfo<PrefillConfig>& info) {
                           return "case" + std::to_string(info.index);
                         });

TEST(PrefillCudaRuns, Fp32On3xTf32MatchesOracle) {
  PrefillConfig c;
  c.dtype = DType::kF32, c.seqlens = {300, 2, 130}, c.state_every = 64, c.seed = 77;
  HostPrefillProblem host(c);
  const PrefillOracle ref = prefill_oracle(host);
  DevicePrefillProblem dev(host);
  dev.reset();
  PrefillParams p = dev.params();
  p.fwd.fp32_math = Fp32Math::kAccurate;
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, cuda_prefill_workspace_bytes(p)), cudaSuccess);
  prefill_cuda(p, ws, cuda_prefill_workspace_bytes(p), nullptr);
  HostPrefillProblem got = host;
  dev.download(got);
  cudaFree(ws);
  expect_pass(compare_prefill(got, ref), "prefill fp32 3xTF32 " + c.describe());
}

// Slot entries outside the cache (not pad_slot_id): the GPU cannot report them without a sync, so it
// treats them as pads, which is what the oracle computes for the same problem with pads in their
// place. (The problem is drawn with pads, then they are turned into bad entries, negative and past
// the cache, for the requests' slots and the intermediate ones.)
TEST(PrefillCudaRuns, SlotsOutsideTheCacheAreSkipped) {
  PrefillConfig c;
  c.seqlens = {37, 0, 1, 70, 5, 90, 200}, c.pads = 3, c.state_every = 64, c.seed = 91;
  HostPrefillProblem as_pads(c);
  HostPrefillProblem bad = as_pads;
  const int32_t n = static_cast<int32_t>(c.cache_slots());
  int32_t k = 0;
  for (int32_t& v : bad.slots)
    if (v == c.pad_slot_id) v = ++k % 2 ? n + 7 * k : -3 - k;
  for (int32_t& v : bad.intermediate_slots)
    if (v == c.pad_slot_id) v = ++k % 2 ? n + k : -100 - k;
  ASSERT_GT(k, 3);
  const PrefillOracle ref = prefill_oracle(as_pads);
  DevicePrefillProblem dev(bad);
  const HostPrefillProblem got = run_once(bad, dev);
  as_pads.fwd.buffers.at("y") = got.fwd.buffers.at("y");
  as_pads.state = got.state;
  expect_pass(compare_prefill(as_pads, ref), "prefill, slots outside the cache " + c.describe());
  EXPECT_EQ(dev.guard_damage(), "");
}

// Captured in a CUDA graph and replayed: the same bits as a direct launch (no host sync, no
// allocation inside the call, the chunk map rebuilt on the device every replay).
TEST(PrefillCudaRuns, GraphReplayGivesTheSameBits) {
  PrefillConfig c;
  c.seqlens = {1000, 0, 1, 300, 64}, c.headdim = 64, c.dstate = 128, c.state_every = 128, c.seed = 13;
  HostPrefillProblem host(c);
  DevicePrefillProblem dev(host);
  const HostPrefillProblem direct = run_once(host, dev);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  dev.reset();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  dev.launch(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    dev.reset();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    HostPrefillProblem got = host;
    dev.download(got);
    EXPECT_TRUE(got.fwd.buffers.at("y") == direct.fwd.buffers.at("y")) << "replay " << replay;
    EXPECT_TRUE(got.state == direct.state) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(PrefillCudaRuns, BlockingPrefillRunsOnTheGpu) {
  PrefillConfig c;
  c.seqlens = {130, 7, 0, 64}, c.seed = 5;
  HostPrefillProblem host(c);
  const PrefillOracle ref = prefill_oracle(host);
  DevicePrefillProblem dev(host);
  dev.reset();
  EXPECT_EQ(prefill(dev.params()), Backend::kCuda);  // auto: the cache is on the GPU
  HostPrefillProblem got = host;
  dev.download(got);
  expect_pass(compare_prefill(got, ref), "blocking prefill " + c.describe());
}

TEST(PrefillCudaRuns, Refusals) {
  PrefillConfig c;
  c.seqlens = {40, 3};
  HostPrefillProblem host(c);
  DevicePrefillProblem dev(host);
  const std::size_t bytes = dev.workspace_bytes();
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
  auto message = [&](const PrefillParams& p, std::size_t have) -> std::string {
    try {
      prefill_cuda(p, ws, have, nullptr);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(dev.params(), cuda_prefill_workspace_bytes(dev.params()) - 1).find("needs at least"),
            std::string::npos);
  PrefillParams fused = dev.params();
  fused.fwd.cuda_path = CudaPath::kFused;
  EXPECT_NE(message(fused, bytes).find("fwd.cuda_path fused does not run the packed prefill"), std::string::npos);
  HostPrefillProblem host_copy = host;
  PrefillParams on_host = dev.params();
  on_host.state = host_copy.state.data();
  EXPECT_NE(message(on_host, bytes).find("state is not device memory"), std::string::npos);
  cudaFree(ws);
  // The hopper path, asked for, says why it cannot take a call: it takes 16-bit inputs only, and
  // caches whose rows allow pairs of elements (auto runs those on three_kernel).
  auto hopper_refusal = [](const PrefillConfig& config) -> std::string {
    HostPrefillProblem problem_host(config);
    DevicePrefillProblem problem_dev(problem_host);
    PrefillParams p = problem_dev.params();
    p.fwd.cuda_path = CudaPath::kHopper;
    try {
      (void)cuda_prefill_workspace_bytes(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "(taken)";
  };
  PrefillConfig f32 = c;
  f32.dtype = DType::kF32;
  const std::string fp32_why = hopper_refusal(f32);
  EXPECT_NE(fp32_why.find("fwd.cuda_path hopper cannot run this packed prefill: it needs bf16 or fp16"),
            std::string::npos) << fp32_why;
  PrefillConfig odd = c;
  odd.odd_cache = true;
  const std::string odd_why = hopper_refusal(odd);
  EXPECT_NE(odd_why.find("it needs a state cache whose rows hold pairs of elements"), std::string::npos) << odd_why;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace mamba2ssd::testing
