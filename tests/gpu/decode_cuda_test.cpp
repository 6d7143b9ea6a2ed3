// The CUDA decode step against the fp64 oracle: the CPU tests' matrix (every feature, slot rule
// and cache dtype) and the kernel's own layouts (state sizes that give 1 to 32 lanes a row and two
// chunks a lane, the element-wise path for unaligned caches), each with out poisoned (NaN) first,
// the cache and out between guard regions that must stay intact, and a rerun from the same cache
// that must give the same bits (a moving result is a race). Also: slot entries outside the cache
// (skipped, nothing touched outside it), aliasing entries (undefined slot, nothing else), CUDA
// graph capture, the blocking decode() and serving-sized problems checked on a slice. Every problem
// runs on both of decode_cuda's kernels (rows and stream, forced), the serving sizes on its own
// choice (the rows kernel) too, and the stream kernel's ranges with fixed sizes that cross every
// boundary.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "api/internal.h"
#include "test_matrix.h"
#include "testing/decode_problem.h"
#include "testing/device_decode_problem.h"

namespace mamba2ssd::testing {
namespace {

// decode_cuda's kernel forced for a scope (0: its own choice, 1: rows, 2: stream; decode_kernel.cuh),
// and with units_per_warp > 0 the stream kernel's range a warp.
struct ForcedDecodeKernel {
  explicit ForcedDecodeKernel(int kernel, int64_t units_per_warp = 0) {
    detail::set_decode_kernel_for_testing(kernel, units_per_warp);
  }
  ~ForcedDecodeKernel() { detail::set_decode_kernel_for_testing(0); }
  ForcedDecodeKernel(const ForcedDecodeKernel&) = delete;
  ForcedDecodeKernel& operator=(const ForcedDecodeKernel&) = delete;
};

// Launches on the problem (out poisoned, cache as drawn), checks against the oracle on each slice
// (the whole problem by default), the guards, and a rerun from the same cache; on each of
// decode_cuda's two kernels, whichever the call would get.
void check_decode_on(const DecodeConfig& config, const std::vector<reference::DecodeSlice>& slices, int kernel,
                     int64_t units_per_warp = 0) {
  const ForcedDecodeKernel forced(kernel, units_per_warp);
  const char* names[] = {"(its choice) ", "(rows kernel) ", "(stream kernel) "};
  std::string what = "decode " + std::string(names[kernel]) + config.describe();
  if (units_per_warp > 0) what += " units_per_warp " + std::to_string(units_per_warp);
  HostDecodeProblem host(config);
  DeviceDecodeProblem dev(host);
  dev.poison_outputs();
  dev.launch();
  const auto first = dev.download();
  for (const reference::DecodeSlice& slice : slices)
    expect_pass(compare_decode(host, first, decode_oracle(host, slice)),
                what + " requests [" + std::to_string(slice.batch_begin) + ", " + std::to_string(slice.batch_end) + ")");
  EXPECT_EQ(dev.guard_damage(), "") << what;

  dev.reset_state();
  dev.poison_outputs();
  dev.launch();
  EXPECT_TRUE(dev.download() == first) << what << ": a rerun from the same cache differs (race?)";
}

void check_decode(const DecodeConfig& config, const std::vector<reference::DecodeSlice>& slices = {{}}) {
  for (int kernel : {1, 2}) check_decode_on(config, slices, kernel);
}

class DecodeCuda : public ::testing::TestWithParam<DecodeConfig> {};

TEST_P(DecodeCuda, MatchesOracle) { check_decode(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Features, DecodeCuda, ::testing::ValuesIn(decode_test_matrix(1)),
                         [](const ::testing::TestParamInfo<DecodeConfig>& info) {
                           return "case" + std::to_string(info.index) + "_" + to_string(info.param.state_dtype);
                         });

TEST(DecodeCudaRuns, PrintsMatrixNames) {
  const std::vector<DecodeConfig> v = decode_test_matrix(1);
  for (std::size_t i = 0; i < v.size(); ++i) std::printf("  case%zu: %s\n", i, v[i].describe().c_str());
}

// The kernel's thread layouts: lanes per row L = 16-byte chunks of a row (N 16 fp32: 4 lanes; N 48
// bf16: 6 chunks on 8 lanes; N 256 fp32: 64 chunks, two per lane), head dims whose rows do not
// fill a tile, several tiles per (request, head), and the element-wise path (misaligned).
TEST(DecodeCudaRuns, EveryThreadLayout) {
  uint64_t seed = 500;
  for (DType s : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t N : {16, 32, 48, 64, 80, 128, 144, 192, 256})
      for (int64_t P : {32, 64, 80, 128})
        for (bool misaligned : {false, true}) {
          DecodeConfig c;
          c.batch = 3, c.nheads = 2, c.ngroups = 1, c.headdim = P, c.dstate = N, c.state_dtype = s;
          c.dtype = DType::kBF16, c.misaligned = misaligned, c.seed = seed++;
          check_decode(c);
        }
}

TEST(DecodeCudaRuns, MultiTokenEveryLayout) {
  uint64_t seed = 700;
  for (DType s : {DType::kF32, DType::kBF16})
    for (int64_t N : {16, 128, 256}) {
      DecodeConfig c;
      c.batch = 4, c.ntokens = 5, c.nheads = 3, c.headdim = 64, c.dstate = N, c.state_dtype = s;
      c.dst_indices = true, c.pad_dsts = 3, c.pads = 1, c.z = true, c.seed = seed++;
      check_decode(c);
    }
}

// The stream kernel's ranges with a fixed number of units a warp (3, 7, 13: none divides the 16
// units of a head), so that ranges cross heads, groups (2 heads each) and requests, pads sit next
// to real requests inside one range (a pad's stage must drain before a real unit reuses it), the
// pipeline runs past its prologue and the B and C rows are restaged mid-range. Whole problem
// against the oracle, every cache dtype, one and three tokens, the element path once.
TEST(DecodeCudaRuns, StreamRangesCrossEveryBoundary) {
  uint64_t seed = 940;
  for (DType s : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t T : {1, 3})
      for (int64_t per_warp : {3, 7, 13}) {
        DecodeConfig c;
        c.batch = 11, c.nheads = 6, c.ngroups = 3, c.headdim = 64, c.dstate = 128, c.state_dtype = s;
        c.ntokens = T, c.dst_indices = T > 1, c.pad_dsts = T > 1 ? 4 : 0, c.pads = 4, c.z = true;
        c.dt_bias = true, c.dt_softplus = true, c.misaligned = s == DType::kF16 && T > 1 && per_warp == 7;
        c.seed = seed++;
        check_decode_on(c, {{}}, 2, per_warp);
      }
}

// Several units a warp at the kernel's own sizing (one wave of warps: ~3200 on an H200, so ~4
// units a warp here). Whole problem against the oracle, every cache dtype.
TEST(DecodeCudaRuns, SeveralUnitsAWarp) {
  uint64_t seed = 950;
  for (DType s : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t T : {1, 3}) {
      DecodeConfig c;
      c.batch = 48, c.nheads = 16, c.ngroups = 4, c.headdim = 64, c.dstate = 128, c.state_dtype = s;
      c.ntokens = T, c.dst_indices = T > 1, c.pad_dsts = T > 1 ? 7 : 0, c.pads = 5, c.z = true;
      c.dt_bias = true, c.dt_softplus = true, c.misaligned = s == DType::kF16 && T > 1, c.seed = seed++;
      check_decode(c);
    }
}

// With an fp32 cache the two kernels do the same arithmetic in the same order (4 chunks a lane,
// the same row sum), so a call gives the same bits on either: what the exact prefill mode relies on
// if its pieces take different kernels (a call's own choice is the rows kernel since perf-log
// "Decode d7"; before, one token on a large fp32 cache took the stream kernel).
TEST(DecodeCudaRuns, KernelsAgreeBitForBitOnFp32Caches) {
  for (int64_t T : {1, 3}) {
    DecodeConfig c;
    c.batch = 9, c.nheads = 6, c.ngroups = 2, c.headdim = 64, c.dstate = 128, c.state_dtype = DType::kF32;
    c.dtype = DType::kF32, c.ntokens = T, c.dst_indices = T > 1, c.pads = 2, c.z = true, c.D_layout = DLayout::kPerHeadDim;
    c.seed = 960 + static_cast<uint64_t>(T);
    HostDecodeProblem host(c);
    DeviceDecodeProblem dev(host);
    std::map<std::string, std::vector<uint8_t>> results[2];
    for (int kernel : {1, 2}) {
      const ForcedDecodeKernel forced(kernel, kernel == 2 ? 5 : 0);
      dev.reset_state();
      dev.poison_outputs();
      dev.launch();
      results[kernel - 1] = dev.download();
    }
    EXPECT_TRUE(results[0] == results[1]) << "T " << T << ": the rows and stream kernels differ";
    expect_pass(compare_decode(host, results[1], decode_oracle(host)), "stream kernel T " + std::to_string(T));
  }
}

// Entries outside the cache: the request (read slot) or the store (destination) is skipped, its
// out rows are zero, and the guards around the cache (one slot or more each side, so that slot -1
// or nslots would land in them) stay intact. The oracle's rule is the same, so compare_decode
// checks all of it, "state (kept)" included.
TEST(DecodeCudaRuns, SlotsOutsideTheCacheAreSkipped) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max(), kMin = std::numeric_limits<int32_t>::min();
  for (DType s : {DType::kF32, DType::kBF16}) {
    DecodeConfig c;
    c.batch = 8, c.ntokens = 2, c.nheads = 4, c.headdim = 64, c.dstate = 128, c.state_dtype = s;
    c.nslots = 12, c.dst_indices = true, c.seed = 900;
    c.read_slots = {0, 12, -2, kMax, kMin, 1, 2, 3};
    c.dst_slots = {4, 5, 6, 6, 7, 7, 8, 8, 12, 12, -1, -7, kMax, 9, kMin, 10};
    check_decode(c);
    c.dst_indices = false, c.dst_slots.clear(), c.read_slots = {-1, 12, 13, 3, 4, -3, 5, 6};  // in place
    check_decode(c);
  }
}

// Without state_batch_indices request b reads slot b even where b is pad_slot_id (a pad marks index
// entries only; DecodeSlots.PadIdMarksIndexEntriesOnly checks the rule on the host).
TEST(DecodeCudaRuns, PadIdMarksIndexEntriesOnly) {
  for (DType s : {DType::kF32, DType::kBF16}) {
    DecodeConfig c;
    c.batch = 5, c.ntokens = 1, c.nheads = 4, c.headdim = 64, c.dstate = 128, c.state_dtype = s;
    c.indices = false, c.pad_slot_id = 1, c.seed = 905;
    check_decode(c);
  }
}

// Aliasing is undefined on the GPU for the slot in question (and out of the request reading it),
// but nothing else may suffer: requests 0 and 1 both store to slot 20, request 2 stores to the
// slot request 3 reads; the others (4..7) must match the oracle and the guards stay intact.
void aliasing_stays_inside_the_slots_named(int kernel) {
  const ForcedDecodeKernel forced(kernel);
  SCOPED_TRACE(kernel == 1 ? "rows kernel" : "stream kernel");
  DecodeConfig c;
  c.batch = 8, c.nheads = 4, c.headdim = 64, c.dstate = 128, c.state_dtype = DType::kBF16, c.nslots = 24;
  c.dst_indices = true, c.seed = 901;
  c.read_slots = {0, 1, 2, 3, 4, 5, 6, 7};
  c.dst_slots = {20, 20, 3, 8, 9, 10, 11, 12};
  HostDecodeProblem host(c);
  DeviceDecodeProblem dev(host);
  dev.poison_outputs();
  dev.launch();
  reference::DecodeSlice others;
  others.batch_begin = 4;
  expect_pass(compare_decode(host, dev.download(), decode_oracle(host, others)), "aliasing, requests 4..7");
  EXPECT_EQ(dev.guard_damage(), "");
  // And the host backends refuse the same call.
  EXPECT_THROW(decode_cpu(HostDecodeProblem(c).params()), Error);
}

TEST(DecodeCudaRuns, AliasingStaysInsideTheSlotsNamed) {
  for (int kernel : {1, 2}) aliasing_stays_inside_the_slots_named(kernel);
}

void graph_capture_replays(int kernel) {
  const ForcedDecodeKernel forced(kernel);
  DecodeConfig c;
  c.batch = 16, c.ntokens = 2, c.nheads = 8, c.headdim = 64, c.dstate = 128, c.dst_indices = true;
  c.pads = 2, c.seed = 902;
  SCOPED_TRACE(kernel == 1 ? "rows kernel" : "stream kernel");
  HostDecodeProblem host(c);
  DeviceDecodeProblem dev(host);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  dev.launch(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  dev.reset_state();  // capture ran nothing; reset anyway, the cache is read by the replay
  dev.poison_outputs();
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  expect_pass(compare_decode(host, dev.download(), decode_oracle(host)), "graph replay");
  EXPECT_EQ(dev.guard_damage(), "");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// On both kernels: the launch reads only device attributes on the host (no occupancy query, no
// synchronization), so it captures; the replay then matches the oracle.
TEST(DecodeCudaRuns, GraphCaptureReplays) {
  for (int kernel : {1, 2}) graph_capture_replays(kernel);
}

TEST(DecodeCudaRuns, BlockingDecodePicksTheGpu) {
  DecodeConfig c;
  c.seed = 903, c.z = true, c.dt_bias = true, c.dt_softplus = true;
  HostDecodeProblem host(c);
  DeviceDecodeProblem dev(host);
  dev.poison_outputs();
  EXPECT_EQ(decode(dev.params()), Backend::kCuda);
  expect_pass(compare_decode(host, dev.download(), decode_oracle(host)), "decode(auto)");
  // The host backends refuse device memory.
  EXPECT_THROW(decode(dev.params(), Backend::kCpu), Error);
}

// Serving sizes (batch x heads = 4096 and 8192, the benchmark's), checked on the first requests
// and the last one (the grid's far end) against the oracle, with the guards.
TEST(DecodeCudaRuns, ServingSizesOnASlice) {
  struct Size {
    int64_t b, H;
    DType s;
    int64_t T;
  };
  for (const Size& z : {Size{64, 64, DType::kF32, 1}, Size{128, 64, DType::kBF16, 1}, Size{256, 32, DType::kF16, 1},
                        Size{32, 128, DType::kF32, 4}}) {
    DecodeConfig c;
    c.batch = z.b, c.nheads = z.H, c.ngroups = 8, c.headdim = 64, c.dstate = 128, c.state_dtype = z.s;
    c.ntokens = z.T, c.dst_indices = z.T > 1, c.dt_bias = true, c.dt_softplus = true, c.seed = 904;
    reference::DecodeSlice head, tail;
    head.batch_end = 2, tail.batch_begin = z.b - 1, tail.batch_end = z.b;
    for (int kernel : {0, 1, 2}) check_decode_on(c, {head, tail}, kernel);  // 0: the call's own choice
  }
}

// More requests than a grid's y dimension holds (65535): the rows kernel's blocks go on to request
// b + 65535 (its slot loaded after the first request's work), the stream kernel's ranges run past
// it. Checked on the first requests, those around the limit and the last, with pads among them.
TEST(DecodeCudaRuns, MoreRequestsThanTheGridHolds) {
  DecodeConfig c;
  c.batch = 65535 + 40, c.nheads = 1, c.ngroups = 1, c.headdim = 32, c.dstate = 16, c.state_dtype = DType::kBF16;
  c.pads = 3000, c.z = true, c.seed = 960;
  reference::DecodeSlice first, limit, last;
  first.batch_end = 3;
  limit.batch_begin = 65533, limit.batch_end = 65539;
  last.batch_begin = c.batch - 3, last.batch_end = c.batch;
  for (int kernel : {1, 2}) check_decode_on(c, {first, limit, last}, kernel);
}

}  // namespace
}  // namespace mamba2ssd::testing
