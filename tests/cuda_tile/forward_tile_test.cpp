// The CUDA Tile C++ backend (cuda_path tile, src/cuda_tile) on the GPU. Built into
// mamba2ssd_gpu_tests only when MAMBA2SSD_TILE=ON (src/cuda_tile/CMakeLists.txt adds it); every
// test name contains "Tile", so --gtest_filter='*Tile*' runs exactly these.
//
//   ForwardTileStages   each kernel's scratch (dt, g, sequence ids, chunk-entry states) against a
//                       host computation: if the end result is wrong, these say which kernel is.
//   ForwardTile         the matrix: every feature, dtype and size class against the fp64 oracle,
//                       on fresh random inputs with NaN-poisoned outputs, plus a bitwise rerun.
//   ForwardTileRuns     what the backend refuses (by name), workspace checks, CUDA graph capture.
//   ForwardTileLong     one 1,048,576-token sequence.
//
// The tile backend computes no varlen_states and needs seq_idx for packed sequences, so packed
// problems run with seq_idx and without cu_seqlens (the oracle's y and final states are the same).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/dt.h"
#include "common/host_dtype.h"
#include "cuda/common/check.h"
#include "cuda_tile/forward_cuda_tile.h"
#include "testing/device_problem.h"
#include "test_matrix.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

constexpr double kLog2e = 1.4426950408889634;

struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) { cuda_check(cudaMalloc(&ptr, n ? n : 1), "cudaMalloc(test)"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// The problem's device params for the tile path: packed sequences keep seq_idx only.
ForwardParams tile_params(const DeviceProblem& dev) {
  ForwardParams p = dev.params();
  p.cuda_path = CudaPath::kTile;
  p.varlen_states = nullptr;
  p.cu_seqlens = nullptr;
  p.nseqs = 0;
  return p;
}

std::string tile_name(const ProblemConfig& c) { return c.describe() + " [tile]"; }

// One run of the tile path on freshly poisoned outputs; returns y and final_states.
std::map<std::string, std::vector<uint8_t>> run_once(DeviceProblem& dev, const ForwardParams& p,
                                                     const DeviceBuffer& ws, void* stream = nullptr) {
  dev.poison_outputs();
  forward_cuda(p, ws.ptr, ws.bytes, stream);
  cuda_check(cudaGetLastError(), "after forward_cuda (tile)");
  auto out = dev.download_outputs();  // synchronizes: a failing kernel throws CudaError here
  out.erase("varlen_states");
  return out;
}

void check_one(const ProblemConfig& config) {
  HostProblem host(config);
  DeviceProblem dev(host);
  const ForwardParams p = tile_params(dev);
  DeviceBuffer ws(cuda_workspace_bytes(p));
  const auto out = run_once(dev, p, ws);
  expect_pass(compare_with_oracle(host, out), tile_name(config));
  EXPECT_TRUE(run_once(dev, p, ws) == out) << tile_name(config) << ": a rerun differs (race?)";
}

ProblemConfig base() { return matrix_base(); }
// The shared matrix but its head dims past the backend's 32, 64 and 128 (RejectsOtherHeadDims).
std::vector<ProblemConfig> matrix() {
  std::vector<ProblemConfig> v = gpu_test_matrix(700, false);
  auto other = [](const ProblemConfig& c) { return c.headdim != 32 && c.headdim != 64 && c.headdim != 128; };
  v.erase(std::remove_if(v.begin(), v.end(), other), v.end());
  return v;
}

// ---------------------------------------------------------------------------------------------
// Stages: the scratch of each kernel against the host.

std::vector<uint8_t> download(const void* dev_ptr, std::size_t bytes) {
  std::vector<uint8_t> h(bytes);
  cuda_check(cudaMemcpy(h.data(), dev_ptr, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(scratch)");
  return h;
}

void check_scratch(const ProblemConfig& config) {
  HostProblem host(config);
  DeviceProblem dev(host);
  const ForwardParams p = tile_params(dev);
  const ForwardParams hp = host.params();
  DeviceBuffer ws(cuda_workspace_bytes(p));
  run_once(dev, p, ws);
  const cuda_tile::TileLayout lay = cuda_tile::tile_layout(p);
  const int64_t b = p.batch, L = p.seqlen, H = p.nheads, P = p.headdim, N = p.dstate, Q = lay.chunk;
  const int64_t lpad = lay.lpad, nchunks = lay.nchunks;
  const auto* ws_bytes = static_cast<const uint8_t*>(ws.ptr);
  const auto dt_raw = download(ws_bytes + lay.dt, sizeof(float) * b * H * lpad);
  const auto g_raw = download(ws_bytes + lay.g, sizeof(float) * b * H * lpad);
  const auto seq_raw = download(ws_bytes + lay.seq, sizeof(int32_t) * b * lpad);
  const auto st_raw = download(ws_bytes + lay.states, sizeof(float) * b * nchunks * H * P * N);
  const float* dt_dev = reinterpret_cast<const float*>(dt_raw.data());
  const float* g_dev = reinterpret_cast<const float*>(g_raw.data());
  const int32_t* seq_dev = reinterpret_cast<const int32_t*>(seq_raw.data());
  const float* st_dev = reinterpret_cast<const float*>(st_raw.data());

  // Kernel 1: dt, g, sequence ids.
  int64_t bad_dt = 0, bad_g = 0, bad_seq = 0;
  double max_dt_err = 0.0, max_g_err = 0.0;
  std::vector<double> dt_host(b * H * lpad, 0.0);
  std::vector<int32_t> seq_host(b * lpad, 0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t t = 0; t < lpad; ++t) {
      const int64_t tr = std::min(t, L - 1);
      seq_host[bi * lpad + t] = hp.seq_idx ? hp.seq_idx[bi * hp.seq_idx_stride.s0 + tr * hp.seq_idx_stride.s1] : 0;
      if (seq_dev[bi * lpad + t] != seq_host[bi * lpad + t] && bad_seq++ < 3)
        std::printf("    seq[b%ld t%ld]: got %d want %d\n", static_cast<long>(bi), static_cast<long>(t),
                    seq_dev[bi * lpad + t], seq_host[bi * lpad + t]);
    }
    for (int64_t h = 0; h < H; ++h) {
      double g = 0.0;
      for (int64_t t = 0; t < lpad; ++t) {
        if (t % Q == 0) g = 0.0;
        double d = 0.0;
        if (t < L) {
          const float raw = host::load(hp.dt, bi * hp.dt_stride.s0 + t * hp.dt_stride.s1 + h * hp.dt_stride.s2,
                                       hp.dt_dtype);
          d = preprocess_dt(raw, hp.dt_bias ? hp.dt_bias[h] : 0.0f, hp.dt_softplus, hp.dt_min, hp.dt_max);
        }
        g += static_cast<double>(hp.A[h]) * d * kLog2e;
        const int64_t i = (bi * H + h) * lpad + t;
        dt_host[i] = d;
        const double e_dt = std::abs(dt_dev[i] - d), e_g = std::abs(g_dev[i] - g);
        max_dt_err = std::max(max_dt_err, e_dt);
        max_g_err = std::max(max_g_err, e_g);
        if (!(e_dt <= 1e-5 * (1.0 + std::abs(d))) && bad_dt++ < 3)
          std::printf("    dt[b%ld h%ld t%ld]: got %.7g want %.7g\n", static_cast<long>(bi), static_cast<long>(h),
                      static_cast<long>(t), dt_dev[i], d);
        if (!(e_g <= 1e-4 * (1.0 + std::abs(g))) && bad_g++ < 3)
          std::printf("    g[b%ld h%ld t%ld]: got %.7g want %.7g\n", static_cast<long>(bi), static_cast<long>(h),
                      static_cast<long>(t), g_dev[i], g);
      }
    }
  }
  std::printf("  %-100s chunk_cumsum: max |dt err| %.2e, max |g err| %.2e, bad dt %ld g %ld seq %ld\n",
              tile_name(config).c_str(), max_dt_err, max_g_err, static_cast<long>(bad_dt), static_cast<long>(bad_g),
              static_cast<long>(bad_seq));
  EXPECT_EQ(bad_dt, 0) << "chunk_cumsum: dt differs from the host";
  EXPECT_EQ(bad_g, 0) << "chunk_cumsum: g (cumsum of A dt, times log2 e) differs from the host";
  EXPECT_EQ(bad_seq, 0) << "chunk_cumsum: sequence ids differ from seq_idx";

  // Kernel 2: the state entering each chunk = the recurrence's state after the chunk's previous
  // token (chunk 0: the initial state, or zero), in fp64 on the host from the same dt.
  double err2 = 0.0, ref2 = 0.0;
  int64_t nonfinite = 0;
  std::vector<double> hs(P * N);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t grp = h / (H / p.ngroups);
      for (int64_t pi = 0; pi < P; ++pi)
        for (int64_t n = 0; n < N; ++n) {
          const Strides4& s = hp.initial_states_stride;
          hs[pi * N + n] = hp.initial_states ? hp.initial_states[bi * s.s0 + h * s.s1 + pi * s.s2 + n] : 0.0;
        }
      int32_t prev = 0;
      for (int64_t t = 0; t <= L; ++t) {
        if (t % Q == 0) {  // compare the state entering chunk t / Q
          const float* got = st_dev + ((bi * nchunks + t / Q) * H + h) * P * N;
          for (int64_t i = 0; i < P * N; ++i) {
            if (!std::isfinite(got[i])) ++nonfinite;
            err2 += (got[i] - hs[i]) * (got[i] - hs[i]);
            ref2 += hs[i] * hs[i];
          }
        }
        if (t == L) break;
        const int32_t sid = seq_host[bi * lpad + t];
        if (hp.seq_idx && sid != prev) std::fill(hs.begin(), hs.end(), 0.0);
        prev = sid;
        const double d = dt_host[(bi * H + h) * lpad + t];
        const double decay = std::exp(static_cast<double>(hp.A[h]) * d);
        for (int64_t pi = 0; pi < P; ++pi) {
          const double xv = host::load(hp.x, bi * hp.x_stride.s0 + t * hp.x_stride.s1 + h * hp.x_stride.s2 + pi,
                                       hp.dtype);
          for (int64_t n = 0; n < N; ++n) {
            const double bv = host::load(hp.B, bi * hp.B_stride.s0 + t * hp.B_stride.s1 + grp * hp.B_stride.s2 + n,
                                         hp.dtype);
            hs[pi * N + n] = decay * hs[pi * N + n] + d * xv * bv;
          }
        }
      }
    }
  const double rel = ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  std::printf("  %-100s fwd_pass_state: chunk-entry states rel_l2 %.2e, nonfinite %ld\n", tile_name(config).c_str(),
              rel, static_cast<long>(nonfinite));
  EXPECT_EQ(nonfinite, 0) << "fwd_pass_state: non-finite chunk-entry states";
  EXPECT_LE(rel, rel_l2_tolerance(p.dtype)) << "fwd_pass_state: chunk-entry states differ from the recurrence";
}

TEST(ForwardTileStages, ScratchMatchesHostPlain) {
  ProblemConfig c = base();
  c.seqlen = 300, c.headdim = 32, c.dstate = 48, c.chunk_size = 64, c.initial_states = true, c.seed = 11;
  check_scratch(c);
}

TEST(ForwardTileStages, ScratchMatchesHostSoftplusStrided) {
  ProblemConfig c = base();
  c.seqlen = 200, c.dtype = DType::kF32, c.dt_dtype = DType::kBF16, c.dt_bias = true, c.dt_softplus = true;
  c.dt_min = 0.01f, c.dt_max = 0.3f, c.strided = true, c.seed = 12;
  check_scratch(c);
}

TEST(ForwardTileStages, ScratchMatchesHostPackedSequences) {
  ProblemConfig c = base();
  c.batch = 1, c.seqlen = 400, c.chunk_size = 64, c.seq_idx = true, c.initial_states = true;
  c.seqlens = {10, 54, 0, 1, 135, 200}, c.seed = 13;
  check_scratch(c);
}

// ---------------------------------------------------------------------------------------------
// The matrix.

class ForwardTile : public ::testing::TestWithParam<ProblemConfig> {};

TEST_P(ForwardTile, MatchesOracle) { check_one(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Matrix, ForwardTile, ::testing::ValuesIn(matrix()),
                         case_name);

TEST(ForwardTileRuns, PrintsMatrixNames) {
  print_matrix(matrix());
}

// ---------------------------------------------------------------------------------------------
// What the backend refuses, and the workspace contract.

void expect_error_naming(const std::function<void()>& f, const std::string& needle, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no Error thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    std::printf("  %s -> Error: %s\n", what.c_str(), e.what());
  }
}

TEST(ForwardTileRuns, RejectsVarlenStates) {
  ProblemConfig c = base();
  c.batch = 1, c.seqlen = 200, c.seq_idx = true, c.seqlens = {50, 150}, c.seed = 21;
  HostProblem host(c);
  DeviceProblem dev(host);
  ForwardParams p = dev.params();  // with cu_seqlens and varlen_states
  p.cuda_path = CudaPath::kTile;
  expect_error_naming([&] { cuda_workspace_bytes(p); }, "varlen_states", "cuda_workspace_bytes with varlen_states");
  DeviceBuffer ws(1 << 20);
  expect_error_naming([&] { forward_cuda(p, ws.ptr, ws.bytes, nullptr); }, "varlen_states",
                      "forward_cuda with varlen_states");
  // The backend's own interface says the same.
  EXPECT_NE(cuda_tile::refusal(p).find("varlen_states"), std::string::npos) << cuda_tile::refusal(p);
  expect_error_naming([&] { cuda_tile::forward(p, ws.ptr, ws.bytes, nullptr); }, "varlen_states",
                      "cuda_tile::forward with varlen_states");
}

TEST(ForwardTileRuns, RejectsOtherHeadDims) {
  ProblemConfig c = base();
  c.headdim = 80, c.seed = 23;
  HostProblem host(c);
  DeviceProblem dev(host);
  ForwardParams p = dev.params();
  p.cuda_path = CudaPath::kTile;
  expect_error_naming([&] { cuda_workspace_bytes(p); }, "head dim 32, 64 or 128, got 80",
                      "cuda_workspace_bytes with head dim 80");
  EXPECT_NE(cuda_tile::refusal(p).find("got 80"), std::string::npos) << cuda_tile::refusal(p);
}

TEST(ForwardTileRuns, RejectsCuSeqlensWithoutSeqIdx) {
  ProblemConfig c = base();
  c.batch = 1, c.seqlen = 200, c.seq_idx = false, c.seqlens = {50, 150}, c.seed = 22;
  HostProblem host(c);
  DeviceProblem dev(host);
  ForwardParams p = dev.params();
  p.cuda_path = CudaPath::kTile;
  p.varlen_states = nullptr;
  expect_error_naming([&] { cuda_workspace_bytes(p); }, "cu_seqlens", "cu_seqlens without seq_idx");
  EXPECT_NE(cuda_tile::refusal(p).find("cu_seqlens"), std::string::npos) << cuda_tile::refusal(p);
  expect_error_naming([&] { cuda_tile::workspace_bytes(p); }, "cu_seqlens",
                      "cuda_tile::workspace_bytes with cu_seqlens without seq_idx");
}

TEST(ForwardTileRuns, AcceptsCuSeqlensNextToSeqIdx) {
  // cu_seqlens only matters for varlen_states; with seq_idx present the tile path runs.
  ProblemConfig c = base();
  c.batch = 1, c.seqlen = 200, c.seq_idx = true, c.seqlens = {70, 130}, c.seed = 23;
  HostProblem host(c);
  DeviceProblem dev(host);
  ForwardParams p = dev.params();
  p.cuda_path = CudaPath::kTile;
  p.varlen_states = nullptr;
  DeviceBuffer ws(cuda_workspace_bytes(p));
  auto out = run_once(dev, p, ws);
  expect_pass(compare_with_oracle(host, out), tile_name(c) + " with cu_seqlens");
}

TEST(ForwardTileRuns, WorkspaceIsChecked) {
  HostProblem host(base());
  DeviceProblem dev(host);
  const ForwardParams p = tile_params(dev);
  const std::size_t need = cuda_workspace_bytes(p);
  EXPECT_EQ(need, cuda_tile::workspace_bytes(p));
  DeviceBuffer ws(need);
  EXPECT_THROW(forward_cuda(p, nullptr, need, nullptr), Error);
  expect_error_naming([&] { forward_cuda(p, ws.ptr, need - 1, nullptr); }, "workspace_bytes", "short workspace");
  expect_error_naming([&] { forward_cuda(p, static_cast<char*>(ws.ptr) + 16, need, nullptr); }, "aligned",
                      "misaligned workspace");
}

TEST(ForwardTileRuns, CallableDirectly) {
  // cuda_tile::forward itself, whatever cuda_path says.
  ProblemConfig c = base();
  c.seed = 24;
  HostProblem host(c);
  DeviceProblem dev(host);
  ForwardParams p = dev.params();
  p.cuda_path = CudaPath::kAuto;
  EXPECT_EQ(cuda_tile::refusal(p), "");
  DeviceBuffer ws(cuda_tile::workspace_bytes(p));
  dev.poison_outputs();
  cuda_tile::forward(p, ws.ptr, ws.bytes, nullptr);
  expect_pass(compare_with_oracle(host, dev.download_outputs()), tile_name(c) + " cuda_tile::forward");
}

TEST(ForwardTileRuns, GraphCaptureReplaysOnAStream) {
  ProblemConfig c = base();
  c.seed = 25, c.z = true, c.initial_states = true;
  HostProblem host(c);
  DeviceProblem dev(host);
  const ForwardParams p = tile_params(dev);
  DeviceBuffer ws(cuda_workspace_bytes(p));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  forward_cuda(p, ws.ptr, ws.bytes, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  dev.poison_outputs();
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  expect_pass(compare_with_oracle(host, dev.download_outputs()), tile_name(c) + " graph replay");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// One sequence of 1,048,576 tokens: the oracle runs on the last head; y is compared on the last
// 4096 tokens (where index arithmetic is largest) and the final state.
TEST(ForwardTileLong, OneMillionTokens) {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 1 << 20, c.nheads = 8, c.headdim = 64, c.dstate = 128, c.ngroups = 1;
  c.chunk_size = 128, c.dtype = DType::kBF16, c.seed = 99;
  HostProblem host(c);
  reference::Slice s;
  s.head_begin = 7, s.head_end = 8, s.token_begin = c.seqlen - 4096;
  const reference::Result ref = oracle(host, s);
  DeviceProblem dev(host);
  const ForwardParams p = tile_params(dev);
  DeviceBuffer ws(cuda_workspace_bytes(p));
  const auto out = run_once(dev, p, ws);
  expect_pass(compare_with(host, out, ref), tile_name(c) + " head 7, last 4096 tokens");
  int64_t nonfinite = 0;
  const auto& y = out.at("y");
  for (std::size_t i = 0; i + 1 < y.size(); i += 2) {
    const uint16_t bits = static_cast<uint16_t>(y[i] | (y[i + 1] << 8));
    if ((bits & 0x7f80) == 0x7f80) ++nonfinite;
  }
  EXPECT_EQ(nonfinite, 0) << "non-finite or unwritten elements of y";
}

}  // namespace
}  // namespace mamba2ssd::testing
