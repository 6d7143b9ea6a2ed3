// The decode step on the host: the oracle against the forward's oracle (a decode of T tokens is a
// forward of T tokens from the slot's state), decode_cpu and decode_reference against the oracle
// for every feature and state dtype, the slot rules (pads, separate destinations, several tokens,
// bad and aliasing entries), and every rule of validate(DecodeParams).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "helpers.h"
#include "common/host_dtype.h"
#include "reference/reference.h"
#include "testing/decode_problem.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

DecodeConfig small() { return decode_matrix_base(); }

// Runs `backend` on the problem (out poisoned, the cache as drawn) and compares with the oracle.
void check_backend(const DecodeConfig& config, Backend backend, int threads = 0) {
  HostDecodeProblem problem(config);
  const DecodeParams p = problem.params();
  if (backend == Backend::kCpu) decode_cpu(p, threads);
  else decode_reference(p);
  expect_all_pass(compare_decode(problem, problem.buffers, decode_oracle(problem)),
              std::string(to_string(backend)) + " " + config.describe());
}

class DecodeMatrix : public ::testing::TestWithParam<DecodeConfig> {};

TEST_P(DecodeMatrix, CpuMatchesOracle) { check_backend(GetParam(), Backend::kCpu); }
TEST_P(DecodeMatrix, ReferenceBackendMatchesOracle) { check_backend(GetParam(), Backend::kReference); }

INSTANTIATE_TEST_SUITE_P(Features, DecodeMatrix, ::testing::ValuesIn(decode_test_matrix(1)),
                         [](const ::testing::TestParamInfo<DecodeConfig>& info) {
                           return std::to_string(info.index) + "_" + to_string(info.param.state_dtype);
                         });

// The oracle against the forward's: T decode tokens from slot r are a forward of T tokens with
// initial_states = the slot's state (the same x, dt, B, C: both are [b, T, ...]), so out is the
// forward's y and the state after the last token its final state.
TEST(DecodeOracle, AgreesWithTheForwardOracle) {
  for (bool z : {false, true}) {
    DecodeConfig c = small();
    c.ntokens = 5, c.dtype = DType::kF32, c.z = z, c.dt_bias = true, c.dt_softplus = true, c.dt_max = 0.3f;
    c.D_layout = z ? DLayout::kPerHeadDim : DLayout::kPerHead, c.seed = 42;
    HostDecodeProblem d(c);
    const DecodeParams dp = d.params();
    const reference::DecodeResult r = decode_oracle(d);
    const int64_t b = c.batch, T = c.ntokens, H = c.nheads, P = c.headdim, N = c.dstate;

    std::vector<float> init(b * H * P * N), y(b * T * H * P);
    const int32_t* read = dp.state_batch_indices;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t k = 0; k < P * N; ++k)
          init[(i * H + h) * P * N + k] = host::load(dp.state, read[i] * dp.state_stride.s0 + h * dp.state_stride.s1 +
                                                                   (k / N) * dp.state_stride.s2 + k % N,
                                                     c.state_dtype);
    ForwardParams f;
    f.batch = b, f.seqlen = T, f.nheads = H, f.headdim = P, f.ngroups = c.ngroups, f.dstate = N;
    f.dtype = c.dtype, f.dt_dtype = c.dt_dtype;
    f.x = dp.x, f.x_stride = dp.x_stride, f.dt = dp.dt, f.dt_stride = dp.dt_stride, f.A = dp.A;
    f.B = dp.B, f.B_stride = dp.B_stride, f.C = dp.C, f.C_stride = dp.C_stride;
    f.D_layout = dp.D_layout, f.D = dp.D, f.z = dp.z, f.z_stride = dp.z_stride, f.dt_bias = dp.dt_bias;
    f.dt_softplus = dp.dt_softplus, f.dt_min = dp.dt_min, f.dt_max = dp.dt_max;
    f.initial_states = init.data(), f.initial_states_stride = contiguous_strides(b, H, P, N);
    f.y = y.data(), f.y_stride = contiguous_strides(b, T, H, P);
    const reference::Result fr = reference::run(f);

    double worst = 0.0;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t p = 0; p < P; ++p)
            worst = std::max(worst, std::abs(r.out[r.out_at(i, t, h, p)] - fr.y[((i * T + t) * H + h) * P + p]));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t k = 0; k < P * N; ++k)
          worst = std::max(worst, std::abs(r.states[r.state_at(i, T - 1, h) + k] - fr.final_states[(i * H + h) * P * N + k]));
    EXPECT_LT(worst, 1e-9) << "z " << z;
  }
}

TEST(DecodeCpu, SameBitsForAnyThreadCount) {
  DecodeConfig c = small();
  c.ntokens = 3, c.dst_indices = true, c.state_dtype = DType::kBF16, c.z = true, c.seed = 9;
  std::map<std::string, std::vector<uint8_t>> first;
  for (int threads : {1, 3, 8}) {
    HostDecodeProblem p(c);
    decode_cpu(p.params(), threads);
    if (first.empty()) first = p.buffers;
    EXPECT_TRUE(p.buffers == first) << threads << " threads";
  }
}

TEST(DecodeSlots, PadsGiveZerosAndKeepTheirSlots) {
  DecodeConfig c = small();
  c.pads = 2, c.seed = 3;
  HostDecodeProblem p(c);
  decode_cpu(p.params());
  const int32_t* read = reinterpret_cast<const int32_t*>(p.buffers.at("read").data());
  int pads = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    if (read[b] != c.pad_slot_id) continue;
    ++pads;
    for (int64_t h = 0; h < c.nheads; ++h)
      for (int64_t i = 0; i < c.headdim; ++i)
        EXPECT_EQ(host::load(p.buffers.at("out").data(), b * p.out_stride.s0 + h * p.out_stride.s2 + i, c.dtype), 0.0f);
  }
  EXPECT_EQ(pads, 2);
  expect_all_pass(compare_decode(p, p.buffers, decode_oracle(p)), c.describe());  // "state (kept)": pads store nothing
}

// Without state_batch_indices request b reads slot b even where b is pad_slot_id: a pad marks index
// entries only, as in mamba_ssm (before the forty-second session request 1 here was skipped).
TEST(DecodeSlots, PadIdMarksIndexEntriesOnly) {
  DecodeConfig c = small();
  c.indices = false, c.pad_slot_id = 1, c.seed = 5;
  HostDecodeProblem p(c);
  decode_cpu(p.params());
  double out_abs = 0.0;
  for (int64_t h = 0; h < c.nheads; ++h)
    for (int64_t i = 0; i < c.headdim; ++i)
      out_abs += std::abs(host::load(p.buffers.at("out").data(), 1 * p.out_stride.s0 + h * p.out_stride.s2 + i, c.dtype));
  EXPECT_GT(out_abs, 0.0) << "request 1 was skipped";
  const int64_t slot_bytes = p.state_stride.s0 * dtype_size(c.state_dtype);
  EXPECT_NE(std::memcmp(p.buffers.at("state").data() + slot_bytes, p.initial_state.data() + slot_bytes, slot_bytes), 0)
      << "slot 1 was not stored";
  expect_all_pass(compare_decode(p, p.buffers, decode_oracle(p)), c.describe());
}

TEST(DecodeSlots, SeparateDestinationsLeaveTheReadSlots) {
  DecodeConfig c = small();
  c.dst_indices = true, c.seed = 4;
  HostDecodeProblem p(c);
  decode_cpu(p.params());
  const int32_t* read = reinterpret_cast<const int32_t*>(p.buffers.at("read").data());
  const int64_t slot_bytes = p.state_stride.s0 * dtype_size(c.state_dtype);
  for (int64_t b = 0; b < c.batch; ++b)
    EXPECT_EQ(std::memcmp(p.buffers.at("state").data() + read[b] * slot_bytes, p.initial_state.data() + read[b] * slot_bytes,
                          slot_bytes), 0)
        << "request " << b << " wrote its read slot " << read[b];
  expect_all_pass(compare_decode(p, p.buffers, decode_oracle(p)), c.describe());
}

TEST(DecodeSlots, SeveralRequestsMayReadOneSlot) {
  // A forked prefix: requests 0 and 1 read slot 0 and store to slots 1 and 2.
  DecodeConfig c = small();
  c.batch = 2, c.nslots = 3, c.dst_indices = true, c.read_slots = {0, 0}, c.dst_slots = {1, 2};
  check_backend(c, Backend::kCpu);
  check_backend(c, Backend::kReference);
}

TEST(DecodeSlots, TheLastTokenStoringToASlotWins) {
  DecodeConfig c = small();
  c.batch = 1, c.ntokens = 3, c.nslots = 2, c.dst_indices = true, c.read_slots = {0}, c.dst_slots = {1, 1, 0};
  HostDecodeProblem p(c);
  decode_cpu(p.params());
  const reference::DecodeResult r = decode_oracle(p);
  // Slot 1 holds the state after token 1, slot 0 the one after token 2 (compare_decode's last-wins
  // rule), and they differ, so a kernel that kept token 0's state in slot 1 fails here.
  expect_all_pass(compare_decode(p, p.buffers, r), c.describe());
  EXPECT_NE(r.states[r.state_at(0, 0, 0)], r.states[r.state_at(0, 1, 0)]);
}

struct SlotError {
  std::string name;
  std::vector<int32_t> read, dst;  // dst empty: none
  int64_t ntokens;
  std::string message;
};

class DecodeSlotErrors : public ::testing::TestWithParam<SlotError> {};

TEST_P(DecodeSlotErrors, HostBackendsRefuseNamingTheEntries) {
  const SlotError& e = GetParam();
  DecodeConfig c = small();
  c.batch = static_cast<int64_t>(e.read.size()), c.ntokens = e.ntokens, c.nslots = 6;
  c.read_slots = e.read;
  c.dst_indices = !e.dst.empty(), c.dst_slots = e.dst;
  for (Backend backend : {Backend::kCpu, Backend::kReference}) {
    HostDecodeProblem p(c);
    try {
      decode(p.params(), backend);
      ADD_FAILURE() << e.name << ": " << to_string(backend) << " accepted it";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(e.message), std::string::npos)
          << e.name << ": " << to_string(backend) << " said: " << err.what();
    }
    EXPECT_TRUE(p.buffers.at("state") == p.initial_state) << e.name << ": the cache changed before the error";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Slots, DecodeSlotErrors,
    ::testing::Values(
        SlotError{"ReadPastTheEnd", {0, 6}, {}, 1, "state_batch_indices[1] = 6 is outside the cache [0, nslots 6)"},
        SlotError{"ReadNegative", {-2, 1}, {}, 1, "state_batch_indices[0] = -2 is outside the cache [0, nslots 6) and is not pad_slot_id -1"},
        SlotError{"DstPastTheEnd", {0, 1}, {2, 99}, 1, "dst_state_batch_indices[1, 0] = 99 is outside the cache"},
        SlotError{"DstOfAPadPastTheEnd", {-1, 1}, {7, 2}, 1, "dst_state_batch_indices[0, 0] = 7 is outside the cache"},
        SlotError{"TwoRequestsStoreToOneSlot", {0, 1}, {2, 2}, 1,
                  "dst_state_batch_indices[0, 0] and dst_state_batch_indices[1, 0] both store to slot 2"},
        SlotError{"TwoRequestsInPlaceOnOneSlot", {3, 3}, {}, 1,
                  "state_batch_indices[0] (stored in place) and state_batch_indices[1] (stored in place) both store to slot 3"},
        SlotError{"StoreToASlotAnotherReads", {0, 1}, {1, 2}, 1,
                  "dst_state_batch_indices[0, 0] stores to slot 1, which request 1 reads"},
        SlotError{"LaterTokenStoresToAnotherReadSlot", {0, 1}, {2, 3, 4, 0}, 2,
                  "dst_state_batch_indices[1, 1] stores to slot 0, which request 0 reads"}),
    [](const ::testing::TestParamInfo<SlotError>& info) { return info.param.name; });

TEST(DecodeSlots, PadRequestsDoNotAlias) {
  // Pads store nothing: their destinations may repeat others' slots.
  DecodeConfig c = small();
  c.batch = 3, c.nslots = 4, c.dst_indices = true, c.read_slots = {-1, 0, -1}, c.dst_slots = {1, 1, 1};
  check_backend(c, Backend::kCpu);
}

// validate(DecodeParams): each rule, with the message naming the parameter and the value.
struct BadDecode {
  std::string name;
  std::function<void(DecodeParams&)> edit;
  std::string message;
};

class DecodeValidate : public ::testing::TestWithParam<BadDecode> {};

TEST_P(DecodeValidate, RefusesNamingTheValue) {
  DecodeConfig c = small();
  c.z = true, c.dt_bias = true, c.dst_indices = true, c.ntokens = 2;
  HostDecodeProblem problem(c);
  DecodeParams p = problem.params();
  ASSERT_NO_THROW(validate(p));
  GetParam().edit(p);
  for (Backend backend : {Backend::kCpu, Backend::kReference}) {
    try {
      decode(p, backend);
      ADD_FAILURE() << GetParam().name << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(GetParam().message), std::string::npos)
          << GetParam().name << ": " << e.what();
    }
  }
  EXPECT_TRUE(problem.buffers.at("state") == problem.initial_state);
}

std::vector<BadDecode> bad_decodes() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  return {
      {"BatchZero", [](auto& p) { p.batch = 0; }, "batch must be >= 1, got 0"},
      {"NtokensZero", [](auto& p) { p.ntokens = 0; }, "ntokens must be >= 1, got 0"},
      {"NheadsZero", [](auto& p) { p.nheads = 0; }, "nheads must be >= 1, got 0"},
      {"Headdim40", [](auto& p) { p.headdim = 40; }, "headdim must be a multiple of 16 in [16, 128], got 40"},
      {"Dstate24", [](auto& p) { p.dstate = 24; }, "dstate must be a multiple of 16 in [16, 256], got 24"},
      {"Dstate512", [](auto& p) { p.dstate = 512; }, "dstate must be a multiple of 16 in [16, 256], got 512"},
      {"NgroupsZero", [](auto& p) { p.ngroups = 0; }, "ngroups must be >= 1, got 0"},
      {"NgroupsNotDividing", [](auto& p) { p.ngroups = 3; }, "ngroups must divide nheads, got ngroups 3 for nheads 4"},
      {"NslotsZero", [](auto& p) { p.nslots = 0; }, "nslots must be >= 1, got 0"},
      {"BatchPastInt32", [](auto& p) { p.batch = int64_t{1} << 31; }, "batch must be < 2^31, got 2147483648"},
      {"NslotsPastInt32", [](auto& p) { p.nslots = int64_t{1} << 32; }, "nslots must be < 2^31"},
      {"CacheTooLarge", [](auto& p) { p.nslots = 1 << 30, p.nheads = 1 << 20, p.ngroups = 1; },
       "nslots * nheads * headdim * dstate = 1073741824 * 1048576 * 32 * 32 is more than 2^56 elements"},
      {"UnknownStateDtype", [](auto& p) { p.state_dtype = static_cast<DType>(5); }, "state_dtype: unknown dtype 5"},
      {"UnknownDtype", [](auto& p) { p.dtype = static_cast<DType>(9); }, "dtype: unknown dtype 9"},
      {"UnknownDLayout", [](auto& p) { p.D_layout = static_cast<DLayout>(4); }, "D_layout: unknown value 4"},
      {"DtLimitNaN", [nan](auto& p) { p.dt_max = nan; }, "dt_limit must not be NaN"},
      {"DtLimitNegative", [](auto& p) { p.dt_min = -1.0f; }, "dt_limit lower bound must be >= 0, got -1"},
      {"DtLimitInfLow", [inf](auto& p) { p.dt_min = inf; }, "dt_limit lower bound must be finite, got inf"},
      {"DtLimitReversed", [](auto& p) { p.dt_min = 0.5f, p.dt_max = 0.1f; }, "dt_limit must satisfy lo <= hi, got (0.5, 0.1)"},
      {"StateNull", [](auto& p) { p.state = nullptr; }, "state (the cache) is null"},
      {"XNull", [](auto& p) { p.x = nullptr; }, "x is null"},
      {"DtNull", [](auto& p) { p.dt = nullptr; }, "dt is null"},
      {"ANull", [](auto& p) { p.A = nullptr; }, "A is null"},
      {"BNull", [](auto& p) { p.B = nullptr; }, "B is null"},
      {"CNull", [](auto& p) { p.C = nullptr; }, "C is null"},
      {"OutNull", [](auto& p) { p.out = nullptr; }, "out (the output) is null"},
      {"DWithoutLayout", [](auto& p) { p.D_layout = DLayout::kNone; }, "D is given but D_layout is none"},
      {"LayoutWithoutD", [](auto& p) { p.D = nullptr; }, "D_layout is per-head or per-head-dim but D is null"},
      {"NoIndicesTooFewSlots", [](auto& p) { p.state_batch_indices = nullptr, p.nslots = 3; },
       "without state_batch_indices request b reads slot b, so nslots must be >= batch 5, got 3"},
      {"StateRowsNotContiguous", [](auto& p) { p.state_stride.s3 = 2; }, "state: last dimension must be contiguous"},
      {"StateSlotsAlias", [](auto& p) { p.state_stride.s0 = 0; }, "state: strides"},
      {"XNegativeStride", [](auto& p) { p.x_stride.s1 = -1; }, "x: negative stride"},
      {"DstStrideHuge", [](auto& p) { p.dst_state_batch_indices_stride.s0 = int64_t{1} << 62; }, "dst_state_batch_indices: strides"},
      {"StateMisaligned", [](auto& p) { p.state = static_cast<char*>(p.state) + 1; }, "state: address"},
      {"IndicesMisaligned", [](auto& p) { p.state_batch_indices = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(p.state_batch_indices) + 2); },
       "state_batch_indices: address"},
      {"OutOverlapsState", [](auto& p) { p.out = p.state; }, "output state overlaps output out"},
      {"StateOverlapsX", [](auto& p) { p.x = p.state; }, "output state overlaps input x"},
      {"OutOverlapsB", [](auto& p) { p.B = p.out; }, "output out overlaps input B"},
  };
}

INSTANTIATE_TEST_SUITE_P(Rules, DecodeValidate, ::testing::ValuesIn(bad_decodes()),
                         [](const ::testing::TestParamInfo<BadDecode>& info) { return info.param.name; });

// validate_sizes(DecodeParams): the sizes alone, no pointer (a caller sizes out with it before
// allocating), with validate()'s messages.
TEST(DecodeValidateSizes, NeedsNoPointers) {
  DecodeParams p;
  p.batch = 5, p.ntokens = 2, p.nheads = 4, p.headdim = 32, p.ngroups = 2, p.dstate = 16, p.nslots = 8;
  EXPECT_NO_THROW(validate_sizes(p));
  EXPECT_THROW(validate(p), Error);  // the pointers are null
  p.batch = int64_t{1} << 31;
  try {
    validate_sizes(p);
    ADD_FAILURE() << "accepted batch 2^31";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "batch must be < 2^31, got 2147483648");
  }
}

TEST(DecodeApi, AutoRunsHostMemoryOnTheCpu) {
  DecodeConfig c = small();
  c.seed = 11;
  HostDecodeProblem p(c);
  EXPECT_EQ(decode(p.params()), Backend::kCpu);
  expect_all_pass(compare_decode(p, p.buffers, decode_oracle(p)), c.describe());
}

TEST(DecodeTolerance, IsTheCoarserOfInputsAndCache) {
  EXPECT_EQ(decode_rel_l2_tolerance(DType::kF32, DType::kBF16), decode_rel_l2_tolerance_of(DType::kBF16));
  EXPECT_EQ(decode_rel_l2_tolerance(DType::kBF16, DType::kF32), decode_rel_l2_tolerance_of(DType::kBF16));
  EXPECT_EQ(decode_rel_l2_tolerance(DType::kF16, DType::kF32), decode_rel_l2_tolerance_of(DType::kF16));
  EXPECT_EQ(decode_rel_l2_tolerance(DType::kF32, DType::kF32), decode_rel_l2_tolerance_of(DType::kF32));
}

TEST(DecodeCompare, CatchesAWrongStateAndAMovedSlot) {
  // The comparison itself can fail: a stored state off by 5%, and a slot nobody stores to changed.
  DecodeConfig c = small();
  c.seed = 12, c.dst_indices = true;
  HostDecodeProblem p(c);
  decode_cpu(p.params());
  const reference::DecodeResult r = decode_oracle(p);
  auto spoiled = p.buffers;
  const int32_t dst0 = r.dst[0];
  float* s = reinterpret_cast<float*>(spoiled.at("state").data());
  for (int64_t k = 0; k < c.headdim * c.dstate; ++k) s[dst0 * p.state_stride.s0 + k] *= 1.05f;
  auto cmps = compare_decode(p, spoiled, r);
  EXPECT_FALSE(cmps[2].pass()) << cmps[2].name;
  spoiled = p.buffers;
  const int32_t read0 = reinterpret_cast<const int32_t*>(p.buffers.at("read").data())[0];
  reinterpret_cast<float*>(spoiled.at("state").data())[read0 * p.state_stride.s0 + 7] += 1.0f;
  cmps = compare_decode(p, spoiled, r);
  EXPECT_FALSE(cmps[3].pass()) << cmps[3].name;
  spoiled = p.buffers;
  host::store(spoiled.at("out").data(), 0, c.dtype, std::numeric_limits<float>::quiet_NaN());
  EXPECT_FALSE(compare_decode(p, spoiled, r)[0].pass()) << "NaN in out";
}

}  // namespace
}  // namespace mamba2ssd::testing
