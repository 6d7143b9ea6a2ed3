// The CUDA forward against the fp64 oracle: every feature, dtype and size class, on fresh random
// inputs with the outputs poisoned (NaN) before each run. Also: bitwise-identical reruns (a moving
// result is a race), CUDA graph capture, a second stream, workspace checks, a 1M-token sequence.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/internal.h"
#include "testing/device_problem.h"
#include "device_array.h"
#include "test_matrix.h"

namespace mamba2ssd::testing {
namespace {

// Runs the CUDA forward on a fresh problem and checks it against the oracle and against reruns.
void check_one(const ProblemConfig& config, const std::string& note = "", int reruns = 1) {
  const std::string what = config.describe() + note;
  HostProblem host(config);
  DeviceProblem dev(host);
  dev.poison_outputs();
  dev.launch();
  const auto out = dev.download_outputs();
  expect_pass(compare_with_oracle(host, out), what);

  for (int rerun = 0; rerun < reruns; ++rerun) {
    dev.poison_outputs();
    dev.launch();
    EXPECT_TRUE(dev.download_outputs() == out) << what << ": rerun " << rerun << " differs (race?)";
  }
}

// Every CUDA path that covers the config: three-kernel, fused, hopper, and auto. The fused paths
// also with 1 and 2 segments: their blocks then walk several chunks (the shape's own choice gives
// these small problems one chunk per segment), and with 2 the first pass does too.
void check_config(ProblemConfig config) {
  for (CudaPath path : {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper, CudaPath::kAuto}) {
    if (!path_applies(config, path)) continue;
    config.cuda_path = path;
    check_one(config);
    if (path == CudaPath::kFused || path == CudaPath::kHopper)
      for (int64_t segs : {1, 2}) {
        ForcedSegments forced(segs);
        check_one(config, " segments " + std::to_string(segs));
      }
  }
}

bool is_sm90() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

ProblemConfig base() { return matrix_base(); }
std::vector<ProblemConfig> matrix() { return gpu_test_matrix(100, true); }

class ForwardCuda : public ::testing::TestWithParam<ProblemConfig> {};

TEST_P(ForwardCuda, MatchesOracle) { check_config(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Matrix, ForwardCuda, ::testing::ValuesIn(matrix()),
                         case_name);

TEST(ForwardCudaRuns, PrintsMatrixNames) {
  // The parameterized cases are numbered; this lists what each number is.
  print_matrix(matrix());
}

TEST(ForwardCudaRuns, GraphCaptureReplays) {
  ProblemConfig c = base();
  c.seed = 7;
  HostProblem host(c);
  DeviceProblem dev(host);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  dev.launch(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  dev.poison_outputs();
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  expect_pass(compare_with_oracle(host, dev.download_outputs()), "graph replay");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(ForwardCudaRuns, PathsCoverTheHeadline) {
  // The headline shape's kind (bf16, head dim 64, state 128) runs on the fused path, and on an
  // sm_90 GPU on the hopper path, with and without packed sequences and their varlen states; fp32
  // on hopper with TF32 products up to state size 128 (3xTF32 on the fused path only); state size
  // 256 on hopper only.
  ProblemConfig c = base();
  c.dstate = 128;
  EXPECT_TRUE(path_applies(c, CudaPath::kFused));
  EXPECT_EQ(path_applies(c, CudaPath::kHopper), is_sm90());
  c.dtype = DType::kF16, c.seqlens = {100, 233}, c.seq_idx = true, c.batch = 1, c.varlen_states = false;
  EXPECT_EQ(path_applies(c, CudaPath::kHopper), is_sm90());
  c.varlen_states = true;
  EXPECT_TRUE(path_applies(c, CudaPath::kFused));
  EXPECT_EQ(path_applies(c, CudaPath::kHopper), is_sm90());
  c.dtype = DType::kF32;
  EXPECT_EQ(path_applies(c, CudaPath::kHopper), is_sm90());
  c.fp32_math = Fp32Math::kAccurate;
  EXPECT_FALSE(path_applies(c, CudaPath::kHopper));
  EXPECT_TRUE(path_applies(c, CudaPath::kFused));
  c.fp32_math = Fp32Math::kTf32, c.dstate = 256;
  EXPECT_FALSE(path_applies(c, CudaPath::kHopper));
  // State size 256: the hopper path only (the portable fused kernels stop at 128).
  c = base();
  c.dstate = 256;
  EXPECT_FALSE(path_applies(c, CudaPath::kFused));
  EXPECT_EQ(path_applies(c, CudaPath::kHopper), is_sm90());
}

TEST(ForwardCudaRuns, AnyChunkSizeRunsEveryPath) {
  // chunk_size organizes mamba_ssm's scan, not the function: every path runs its own chunks, and a
  // caller's 17 or 32 gives the oracle's result on each (the three-kernel path at chunk 128).
  ProblemConfig c = base();
  c.chunk_size = 17, c.dstate = 128;
  check_config(c);
  c.chunk_size = 32, c.dtype = DType::kF32, c.seqlens = {100, 233}, c.seq_idx = true, c.batch = 1;
  check_config(c);
}

TEST(ForwardCudaRuns, HopperLeavesUnalignedRowsToTheFusedPath) {
  // TMA moves 16-byte aligned rows only: with odd strides the hopper path refuses, and auto runs
  // the fused path instead.
  ProblemConfig c = base();
  c.dstate = 128, c.misaligned = true;
  EXPECT_FALSE(path_applies(c, CudaPath::kHopper));
  EXPECT_TRUE(path_applies(c, CudaPath::kFused));
  check_one(c);
  // State size 256 has no portable fused form: auto runs the three-kernel path.
  c.dstate = 256;
  EXPECT_FALSE(path_applies(c, CudaPath::kHopper));
  EXPECT_FALSE(path_applies(c, CudaPath::kFused));
  check_one(c);
}

TEST(ForwardCudaRuns, RefusedTmaMapsFallBackOrSayWhy) {
  // A TMA map the driver refuses: the hopper path refuses the call when it is planned (so the
  // workspace is that of the path that runs), auto takes the next path (fused up to state size
  // 128, three-kernel above), and hopper asked for by name throws Error saying why.
  struct Refused {
    Refused() { detail::refuse_tma_maps_for_testing(true); }
    ~Refused() { detail::refuse_tma_maps_for_testing(false); }
  };
  ProblemConfig c = base();
  c.dstate = 128;
  if (!path_applies(c, CudaPath::kHopper)) GTEST_SKIP() << "no hopper path on this GPU";
  Refused refused;
  EXPECT_EQ(explain_cuda(HostProblem(c).params()).chosen, CudaPath::kFused);
  check_one(c, " maps refused");
  c.dstate = 256;
  EXPECT_EQ(explain_cuda(HostProblem(c).params()).chosen, CudaPath::kThreeKernel);
  check_one(c, " maps refused");
  c.cuda_path = CudaPath::kHopper;
  try {
    cuda_workspace_bytes(HostProblem(c).params());
    ADD_FAILURE() << "hopper by name ran with its maps refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the driver refused a TMA map"), std::string::npos) << e.what();
  }
}

TEST(ForwardCudaRuns, ExplainNamesThePathAndEveryRefusal) {
  // explain_cuda answers from the same registry forward_cuda walks: the path it names is the one
  // whose workspace cuda_workspace_bytes returns, every path has a verdict, and a refusal says why.
  ProblemConfig c = base();
  c.dstate = 128;
  const ForwardParams p = HostProblem(c).params();
  const CudaExplanation x = explain_cuda(p);
  EXPECT_EQ(x.chosen, is_sm90() && path_applies(c, CudaPath::kHopper) ? CudaPath::kHopper : CudaPath::kFused);
  EXPECT_EQ(x.workspace_bytes, cuda_workspace_bytes(p));
  ASSERT_EQ(x.paths.size(), 4u);
  for (const CudaPathVerdict& v : x.paths)
    if (v.path == CudaPath::kThreeKernel || v.path == CudaPath::kFused) EXPECT_EQ(v.refusal, "") << to_string(v.path);
  std::printf("%s", x.to_string().c_str());
  c.misaligned = true;  // no TMA
  for (const CudaPathVerdict& v : explain_cuda(HostProblem(c).params()).paths)
    if (v.path == CudaPath::kHopper) EXPECT_NE(v.refusal, "");
  c = base(), c.dstate = 256, c.cuda_path = CudaPath::kFused;
  const CudaExplanation y = explain_cuda(HostProblem(c).params());
  EXPECT_EQ(y.chosen, CudaPath::kAuto);  // the fused path takes state sizes up to 128
  try {
    cuda_workspace_bytes(HostProblem(c).params());
    ADD_FAILURE() << "fused ran state size 256";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dstate 256"), std::string::npos) << e.what();
  }
  // Head dims 32 and 128 run on the walks, as tiles of 64 columns (two blocks per segment for 128).
  c = base(), c.headdim = 128, c.dstate = 128;
  const CudaExplanation wide = explain_cuda(HostProblem(c).params());
  EXPECT_EQ(wide.chosen, is_sm90() && path_applies(c, CudaPath::kHopper) ? CudaPath::kHopper : CudaPath::kFused);
  EXPECT_NE(wide.plan.find("head dim in 2 tiles of 64"), std::string::npos) << wide.plan;
  c.headdim = 32;
  const CudaExplanation narrow = explain_cuda(HostProblem(c).params());
  EXPECT_EQ(narrow.chosen, wide.chosen);
  EXPECT_EQ(narrow.plan.find("tiles"), std::string::npos) << narrow.plan;
}

TEST(ForwardCudaRuns, CallsInARowShareOneWorkspace) {
  // Two problems alternate on one stream and one workspace (filled with NaN bytes first) with no
  // synchronization between the calls: a kernel that read the workspace before the kernel writing
  // it was done, within a call (the programmatic launches) or across calls, would show here.
  for (CudaPath path : {CudaPath::kHopper, CudaPath::kFused}) {
    ProblemConfig c = base();
    c.seqlen = 1000, c.dstate = 128, c.initial_states = true, c.cuda_path = path;
    if (!path_applies(c, path)) continue;
    ForcedSegments forced(3);
    ProblemConfig c2 = c;
    c2.seed = c.seed + 1;
    HostProblem h1(c), h2(c2);
    DeviceProblem d1(h1), d2(h2);
    d1.poison_outputs();
    d2.poison_outputs();
    ASSERT_EQ(cudaMemset(d1.workspace(), 0xff, d1.workspace_bytes()), cudaSuccess);
    const ForwardParams p2 = d2.params();
    for (int i = 0; i < 3; ++i) {
      d1.launch();
      forward_cuda(p2, d1.workspace(), d1.workspace_bytes(), nullptr);
    }
    expect_pass(compare_with_oracle(h1, d1.download_outputs()), std::string("first of two, ") + to_string(path));
    expect_pass(compare_with_oracle(h2, d2.download_outputs()), std::string("second of two, ") + to_string(path));
  }
}

// Inputs broadcast with stride 0, as torch's expand() hands them (validate takes any stride >= 0
// but the last): x and z one batch row for every row, C likewise, B and dt one token's for every
// token, the initial states one row's. The same view for the oracle and for each CUDA path; a path
// may refuse the view by name (the hopper path's TMA boxes need nonzero strides), and the call's
// own choice (auto) must run it.
TEST(ForwardCudaRuns, InputsExpandedWithStrideZero) {
  for (DType t : {DType::kBF16, DType::kF32})
    for (CudaPath path : {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper, CudaPath::kAuto}) {
      ProblemConfig c = base();
      c.batch = 3, c.seqlen = 300, c.dstate = 128, c.dtype = t, c.z = true, c.initial_states = true;
      c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.cuda_path = path;
      if (!path_applies(c, path)) continue;
      const std::string what = std::string("expanded inputs, ") + to_string(t) + " " + to_string(path);
      HostProblem host(c);
      DeviceProblem dev(host);
      ForwardParams hp = host.params(), dp = dev.params();
      for (ForwardParams* p : {&hp, &dp}) {
        p->x_stride.s0 = 0, p->z_stride.s0 = 0, p->C_stride.s0 = 0, p->initial_states_stride.s0 = 0;
        p->B_stride.s1 = 0, p->dt_stride.s1 = 0;
      }
      const reference::Result want = reference::run(hp);
      dev.poison_outputs();
      try {
        forward_cuda(dp, dev.workspace(), dev.workspace_bytes(), nullptr);
      } catch (const Error& e) {
        std::printf("  %s: refused: %s\n", what.c_str(), e.what());
        EXPECT_NE(path, CudaPath::kAuto) << what << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << what << ": " << e.what();
        continue;
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      expect_pass(compare_with(host, dev.download_outputs(), want), what);
    }
}

TEST(ForwardCudaRuns, LongFirstPassWalksRepeatBitwise) {
  // The matrix's problems give the first pass a few steps per block; here each of its blocks walks
  // 64 steps (four times around its buffer ring), with and without sequence starts that end the
  // walk early, and every rerun must match the first bit for bit (a buffer handed on too early
  // would move the result).
  ProblemConfig c = base();
  c.seqlen = 8192, c.nheads = 4, c.ngroups = 1, c.dstate = 128, c.initial_states = true;
  ProblemConfig packed = c;
  packed.batch = 1, packed.seq_idx = true, packed.seqlens = {2000, 4100, 2092}, packed.varlen_states = false;
  ForcedSegments forced(2);
  for (CudaPath path : {CudaPath::kHopper, CudaPath::kFused}) {
    for (ProblemConfig config : {c, packed}) {
      config.cuda_path = path;
      if (path_applies(config, path)) check_one(config, " segments 2", 4);
    }
  }
}

TEST(ForwardCudaRuns, FusedPathRejectsWhatItDoesNotCover) {
  ProblemConfig c = base();
  c.dstate = 160, c.cuda_path = CudaPath::kFused;
  HostProblem host(c);
  try {
    cuda_workspace_bytes(host.params());
    FAIL() << "fused path accepted dstate 160";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dstate 160"), std::string::npos) << e.what();
  }
}

TEST(ForwardCudaRuns, WorkspaceIsChecked) {
  HostProblem host(base());
  DeviceProblem dev(host);
  const ForwardParams p = dev.params();
  EXPECT_THROW(forward_cuda(p, nullptr, dev.workspace_bytes(), nullptr), Error);
  try {
    forward_cuda(p, dev.workspace(), dev.workspace_bytes() - 1, nullptr);
    FAIL() << "a short workspace was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace_bytes"), std::string::npos) << e.what();
  }
}

TEST(ForwardCudaRuns, HostPointersAreRejectedByAuto) {
  // forward() with kAuto on host memory must run the CPU path, never hand host pointers to kernels.
  ProblemConfig c = base();
  c.seqlen = 100;
  HostProblem host(c);
  EXPECT_EQ(forward(host.params()), Backend::kCpu);
  expect_pass(compare_with_oracle(host, host.buffers), "auto on host memory");
}

// The long-sequence case of the issue: 1,048,576 tokens in one sequence. The oracle runs on the last
// head; y is compared on the last 4096 tokens (where index arithmetic is largest) and the final state.
TEST(ForwardCudaLong, OneMillionTokens) {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 1 << 20, c.nheads = 8, c.headdim = 64, c.dstate = 128, c.ngroups = 1;
  c.chunk_size = 128, c.dtype = DType::kBF16, c.seed = 99;
  HostProblem host(c);
  reference::Slice s;
  s.head_begin = 7, s.head_end = 8, s.token_begin = c.seqlen - 4096;
  const reference::Result ref = oracle(host, s);
  DeviceProblem dev(host);
  std::map<std::string, std::vector<uint8_t>> out;
  for (CudaPath path : {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper}) {
    if (!path_applies(c, path)) continue;
    host.config.cuda_path = path;
    dev.poison_outputs();
    dev.launch();
    out = dev.download_outputs();
    expect_pass(compare_with(host, out, ref), std::string("1M tokens, head 7, last 4096 tokens, ") + to_string(path));
  }
  // Every y element was written and finite.
  int64_t nonfinite = 0;
  const auto& y = out.at("y");
  for (std::size_t i = 0; i + 1 < y.size(); i += 2) {
    const uint16_t bits = static_cast<uint16_t>(y[i] | (y[i + 1] << 8));
    if ((bits & 0x7f80) == 0x7f80) ++nonfinite;
  }
  EXPECT_EQ(nonfinite, 0) << "non-finite or unwritten elements of y";
}

// Not a test of speed (run explicitly): times the headline shape with CUDA events, for profiling.
TEST(ForwardCudaTiming, DISABLED_Headline) {
  ProblemConfig c;  // batch 4, 16K tokens, 8 heads, dim 64, state 128, bf16
  const char* chunk = std::getenv("MAMBA2SSD_CHUNK");
  if (chunk) c.chunk_size = std::atoi(chunk);
  HostProblem host(c);
  DeviceProblem dev(host);
  for (CudaPath path : {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper}) {
    if (!path_applies(c, path)) continue;
    host.config.cuda_path = path;
    std::printf("headline %s path %s: median %.1f us\n", c.describe().c_str(), to_string(path),
                median_launch_us([&] { dev.launch(); }));
  }
}

}  // namespace
}  // namespace mamba2ssd::testing
