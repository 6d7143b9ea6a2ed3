// The packed prefill on the host: the oracle against an independent plain recurrence,
// prefill_cpu (and the reference backend through prefill()) against the oracle on the test matrix,
// the same bits for any thread count, a request prefilled in two calls against one call, the
// intermediate states (every k tokens), and every rule of validate(PrefillParams) and of the host
// backends' slot and seq_idx checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/host_dtype.h"
#include "testing/prefill_problem.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

void expect_pass(const std::vector<Comparison>& cmps, const std::string& what) {
  ASSERT_FALSE(cmps.empty()) << what;
  for (const Comparison& c : cmps)
    EXPECT_TRUE(c.pass()) << what << ": " << c.name << " rel_l2 " << c.rel_l2 << " (tolerance " << c.tolerance
                          << "), max_abs " << c.max_abs << ", " << c.nonfinite << " of " << c.count
                          << " not finite";
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no Error; expected one naming \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "expected \"" << part << "\", got: " << e.what();
  }
}

// prefill(p, Backend::kCuda) on a valid call in host memory, refused as the situation the test runs
// in says: a build without CUDA has no backend (CudaError), a CUDA build on a machine without a GPU
// finds no device (CudaError), and on a GPU prefill_cuda refuses the host pointers (Error naming
// device memory). Each situation's own exception type and words: a call that ran, or failed for
// another reason, fails the test.
void expect_cuda_refuses_host_memory(const std::function<void()>& f) {
  const bool built = build_info().cuda, gpu = built && cuda_available();
  const std::string part = !built ? "backend cuda: this build of mamba2ssd has no CUDA backend"
                           : !gpu ? "backend cuda: no CUDA device is available"
                                  : "device memory";
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming \"" << part << "\"";
  } catch (const CudaError& e) {
    EXPECT_FALSE(gpu) << "expected Error naming \"" << part << "\", got CudaError: " << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "expected \"" << part << "\", got: " << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(gpu) << "expected CudaError naming \"" << part << "\", got Error: " << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "expected \"" << part << "\", got: " << e.what();
  }
}

// `offset` elements of dtype t past p.
template <typename T>
T* advance(T* p, int64_t offset, DType t) {
  using Byte = std::conditional_t<std::is_const_v<T>, const uint8_t, uint8_t>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + offset * static_cast<int64_t>(dtype_size(t)));
}

// ---------------------------------------------------------------------------------------------
// The oracle against the recurrence written out here from the contract, on tiny fp32 problems.

TEST(PrefillOracle, AgreesWithAPlainRecurrence) {
  for (int variant = 0; variant < 4; ++variant) {
    PrefillConfig c;
    c.seqlens = {3, 0, 1, 4, 2}, c.nheads = 2, c.headdim = 32, c.dstate = 16, c.ngroups = 1;
    c.dtype = DType::kF32, c.state_dtype = DType::kF32, c.seed = 7 + variant;
    c.initial = {1, 0, 1, 0, 1}, c.slots = {4, 0, 2, 1, -1};  // request 4 a pad
    if (variant == 1) c.z = true, c.dt_bias = true, c.dt_softplus = true, c.D_layout = DLayout::kPerHeadDim;
    if (variant == 2) c.dt_min = 0.05f, c.dt_max = 0.1f, c.ngroups = 2, c.seq_idx = true;
    if (variant == 3) {  // intermediate states every 64 tokens, two a request at most
      c.seqlens = {130, 64, 0, 200, 20}, c.state_every = 64, c.max_intermediate = 2, c.nslots = 18;
      // Request 0: two boundaries; 1: one, at its last token, in its own slot 0 (entry 12 unused);
      // 2: none (13, 14 unused); 3: three, the first a pad entry, the third past max_intermediate;
      // 4: a pad request, storing nothing (15, 16 unused).
      c.intermediate_slots = {10, 11, 0, 12, 13, 14, -1, 17, 15, 16};
    }
    HostPrefillProblem problem(c);
    prefill_reference(problem.params());

    const ForwardParams f = problem.fwd.params();
    const int64_t H = c.nheads, P = c.headdim, N = c.dstate;
    auto in = [&](const void* base, const Strides4& s, int64_t t, int64_t j, int64_t k) {
      return static_cast<double>(static_cast<const float*>(base)[t * s.s1 + j * s.s2 + k]);
    };
    auto cache = [&](const std::vector<uint8_t>& buf, int64_t slot, int64_t h, int64_t i, int64_t n) {
      const Strides4& s = problem.state_stride;
      return static_cast<double>(reinterpret_cast<const float*>(buf.data())[slot * s.s0 + h * s.s1 + i * s.s2 + n]);
    };
    double worst = 0.0;
    auto expect_close = [&](double got, double want, const std::string& what) {
      worst = std::max(worst, std::abs(got - want) / (1.0 + std::abs(want)));
      ASSERT_NEAR(got, want, 1e-5 * (1.0 + std::abs(want))) << what << " " << c.describe();
    };
    for (int64_t r = 0, t0 = 0; r < c.requests(); t0 += c.seqlens[r], ++r) {
      const int32_t slot = problem.slots[r];
      const bool reads = slot >= 0 && problem.has_initial_state[r];
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / c.ngroups);
        std::vector<double> S(P * N, 0.0);
        if (reads)
          for (int64_t i = 0; i < P; ++i)
            for (int64_t n = 0; n < N; ++n) S[i * N + n] = cache(problem.initial_state, slot, h, i, n);
        for (int64_t t = t0; t < t0 + c.seqlens[r]; ++t) {
          double d = static_cast<const float*>(f.dt)[t * f.dt_stride.s1 + h];
          if (f.dt_bias) d += f.dt_bias[h];
          if (f.dt_softplus && d <= 20.0) d = std::log1p(std::exp(d));
          d = std::min<double>(std::max<double>(d, f.dt_min), f.dt_max);
          for (int64_t i = 0; i < P; ++i) {
            const double x = in(f.x, f.x_stride, t, h, i);
            double y = 0.0;
            for (int64_t n = 0; n < N; ++n) {
              S[i * N + n] = std::exp(f.A[h] * d) * S[i * N + n] + d * x * in(f.B, f.B_stride, t, g, n);
              y += S[i * N + n] * in(f.C, f.C_stride, t, g, n);
            }
            if (f.D) y += (c.D_layout == DLayout::kPerHead ? f.D[h] : f.D[h * P + i]) * x;
            if (f.z) {
              const double z = in(f.z, f.z_stride, t, h, i);
              y *= z / (1.0 + std::exp(-z));
            }
            expect_close(in(f.y, f.y_stride, t, h, i), y, "y at token " + std::to_string(t));
          }
          const int64_t done = t + 1 - t0, M = c.max_intermediate;  // intermediate states after token k*m
          if (c.state_every && slot >= 0 && done % c.state_every == 0 && done / c.state_every <= M)
            if (const int32_t to = problem.intermediate_slots[r * M + done / c.state_every - 1]; to != -1)
              for (int64_t i = 0; i < P; ++i)
                for (int64_t n = 0; n < N; ++n)
                  expect_close(cache(problem.state, to, h, i, n), S[i * N + n],
                               "request " + std::to_string(r) + "'s state after " + std::to_string(done) + " tokens");
        }
        for (int64_t i = 0; i < P; ++i)
          for (int64_t n = 0; n < N; ++n) {
            const double want = slot >= 0 ? S[i * N + n] : cache(problem.initial_state, slot < 0 ? 3 : slot, h, i, n);
            if (slot >= 0) expect_close(cache(problem.state, slot, h, i, n), want, "state of request " + std::to_string(r));
          }
      }
    }
    // The pad's slot -1 names none: slot 3 is nobody's, and must be untouched; so must the slots of
    // intermediate entries that are not stored.
    for (int untouched : {3, 12, 13, 14, 15, 16}) {
      if (untouched > 3 && variant != 3) break;
      const int64_t bytes = problem.state_stride.s0 * 4;
      EXPECT_EQ(std::memcmp(problem.state.data() + untouched * bytes, problem.initial_state.data() + untouched * bytes,
                            bytes), 0) << "slot " << untouched;
    }
    EXPECT_GT(worst, 0.0);  // the comparison compared something
  }
}

// ---------------------------------------------------------------------------------------------
// The backends against the oracle on the test matrix; y poisoned with NaN before each run.

class PrefillMatrix : public ::testing::TestWithParam<PrefillConfig> {};

TEST_P(PrefillMatrix, CpuMatchesOracle) {
  HostPrefillProblem problem(GetParam());
  const PrefillOracle ref = prefill_oracle(problem);
  problem.reset();
  prefill_cpu(problem.params());
  expect_pass(compare_prefill(problem, ref), "cpu " + GetParam().describe());
}

// prefill() on host memory: auto runs the CPU backend, reference the oracle (which then equals it).
TEST_P(PrefillMatrix, DispatchRunsTheHostBackends) {
  HostPrefillProblem problem(GetParam());
  const PrefillOracle ref = prefill_oracle(problem);
  problem.reset();
  EXPECT_EQ(prefill(problem.params(), Backend::kReference), Backend::kReference);
  EXPECT_EQ(problem.fwd.buffers.at("y"), ref.y);
  EXPECT_EQ(problem.state, ref.state);
  problem.reset();
  EXPECT_EQ(prefill(problem.params()), Backend::kCpu);
  expect_pass(compare_prefill(problem, ref), "auto " + GetParam().describe());
}

INSTANTIATE_TEST_SUITE_P(Features, PrefillMatrix, ::testing::ValuesIn(prefill_test_matrix(1)),
                         [](const ::testing::TestParamInfo<PrefillConfig>& info) {
                           return std::to_string(info.index) + "_" + to_string(info.param.state_dtype);
                         });

TEST(PrefillCpu, SameBitsForAnyThreadCount) {
  PrefillConfig c;
  c.seqlens = {0, 130, 1, 64, 7}, c.z = true, c.dt_bias = true, c.dt_softplus = true, c.state_dtype = DType::kBF16;
  c.state_every = 64, c.seed = 99;
  HostPrefillProblem problem(c);
  prefill_cpu(problem.params(), 1);
  const std::vector<uint8_t> y1 = problem.fwd.buffers.at("y"), s1 = problem.state;
  for (int threads : {2, 3, 7}) {
    problem.reset();
    prefill_cpu(problem.params(), threads);
    EXPECT_EQ(problem.fwd.buffers.at("y"), y1) << threads << " threads";
    EXPECT_EQ(problem.state, s1) << threads << " threads";
  }
}

// A NaN in a slot reaches that request's y and state only: the slot's state is really read.
TEST(PrefillCpu, ReadsTheSlotOnlyWhenAsked) {
  PrefillConfig c;
  c.seqlens = {4, 4}, c.slots = {0, 1}, c.initial = {1, 0}, c.nslots = 2, c.dtype = DType::kF32, c.seed = 5;
  HostPrefillProblem problem(c);
  for (int slot : {0, 1}) reinterpret_cast<float*>(problem.initial_state.data())[slot * problem.state_stride.s0] = NAN;
  problem.reset();
  prefill_cpu(problem.params());
  const float* y = reinterpret_cast<const float*>(problem.fwd.buffers.at("y").data());
  const int64_t row = problem.fwd.params().y_stride.s1;
  EXPECT_TRUE(std::isnan(y[0]));          // request 0 reads its slot (NaN at head 0, dim 0)
  EXPECT_FALSE(std::isnan(y[4 * row]));   // request 1 starts from zero
  EXPECT_FALSE(std::isnan(reinterpret_cast<const float*>(problem.state.data())[problem.state_stride.s0]));
}

// ---------------------------------------------------------------------------------------------
// Consistency: a request prefilled in two calls (the second reading the slot the first wrote)
// against one call, fp32 cache, within the tolerance table.

TEST(PrefillConsistency, TwoCallsEqualOne) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t split : {1, 37, 64, 99})
      for (uint8_t cached : {0, 1}) {
        PrefillConfig c;
        c.seqlens = {100, 6}, c.slots = {2, 0}, c.initial = {cached, 1}, c.nslots = 3, c.dtype = dtype;
        c.state_dtype = DType::kF32, c.z = true, c.dt_bias = true, c.dt_softplus = true, c.seed = 300 + split;
        const std::string what = c.describe() + " split " + std::to_string(split);
        HostPrefillProblem whole(c), pieces(c);
        prefill_cpu(whole.params());

        PrefillParams first = pieces.params();
        const ForwardParams f = first.fwd;
        const int64_t cu_first[2] = {0, split}, cu_second[2] = {0, 100 - split};
        const int32_t slot[1] = {2};
        const uint8_t reads_first[1] = {cached}, reads_second[1] = {1};
        first.fwd.seqlen = split, first.fwd.nseqs = 1, first.fwd.cu_seqlens = cu_first;
        first.slots = slot, first.has_initial_state = reads_first;
        prefill_cpu(first);
        PrefillParams second = first;
        second.fwd.seqlen = 100 - split, second.fwd.cu_seqlens = cu_second, second.has_initial_state = reads_second;
        second.fwd.x = advance(f.x, split * f.x_stride.s1, f.dtype);
        second.fwd.dt = advance(f.dt, split * f.dt_stride.s1, f.dt_dtype);
        second.fwd.B = advance(f.B, split * f.B_stride.s1, f.dtype);
        second.fwd.C = advance(f.C, split * f.C_stride.s1, f.dtype);
        second.fwd.z = advance(f.z, split * f.z_stride.s1, f.dtype);
        second.fwd.y = advance(f.y, split * f.y_stride.s1, f.dtype);
        prefill_cpu(second);

        const double tol = consistency_rel_l2_tolerance(dtype);
        ComparisonBuilder y("y"), state("state");
        for (int64_t t = 0; t < 100; ++t)
          for (int64_t h = 0; h < c.nheads; ++h)
            for (int64_t i = 0; i < c.headdim; ++i) {
              const int64_t off = t * f.y_stride.s1 + h * f.y_stride.s2 + i;
              y.add(host::load(pieces.fwd.buffers.at("y").data(), off, dtype),
                    host::load(whole.fwd.buffers.at("y").data(), off, dtype));
            }
        const int64_t s0 = 2 * whole.state_stride.s0;
        for (int64_t e = 0; e < whole.state_stride.s0; ++e)
          state.add(reinterpret_cast<const float*>(pieces.state.data())[s0 + e],
                    reinterpret_cast<const float*>(whole.state.data())[s0 + e]);
        expect_pass({y.done(tol), state.done(tol)}, what);
      }
}

// ---------------------------------------------------------------------------------------------
// Refusals: every rule of validate(PrefillParams), and the host backends' checks of the contents.
// Nothing is written before an Error.

PrefillConfig small() {
  PrefillConfig c;
  c.seqlens = {3, 0, 5, 2}, c.nheads = 2, c.dstate = 16, c.ngroups = 1, c.nslots = 8, c.seq_idx = true;
  c.slots = {4, 5, 1, 2};
  return c;
}

// With intermediate states every 64 tokens, two entries a request: request 0 stores to 8 and 9,
// request 2 (64 tokens) to 12; the other entries are not stored.
PrefillConfig small_intermediate() {
  PrefillConfig c = small();
  c.seqlens = {130, 0, 64, 10}, c.nslots = 16, c.state_every = 64, c.max_intermediate = 2;
  c.intermediate_slots = {8, 9, 10, 11, 12, 13, 14, 15};
  return c;
}

struct Refusal {
  const char* name;
  std::function<void(PrefillParams&, HostPrefillProblem&)> edit;
  const char* message;
  bool intermediate = false;  // on small_intermediate() rather than small()
};

std::vector<Refusal> refusals() {
  static float spare_state[64];
  static int64_t bad_cu[5] = {0, 3, 2, 8, 10};
  return {
      {"initial_states", [](PrefillParams& p, auto&) { p.fwd.initial_states = spare_state; },
       "fwd.initial_states must be null in a prefill"},
      {"final_states", [](PrefillParams& p, auto&) { p.fwd.final_states = spare_state; },
       "fwd.final_states must be null in a prefill"},
      {"varlen_states", [](PrefillParams& p, auto&) { p.fwd.varlen_states = spare_state; },
       "fwd.varlen_states must be null in a prefill"},
      {"saved_states", [](PrefillParams& p, auto&) { p.fwd.saved_states = spare_state; },
       "fwd.saved_states must be null in a prefill"},
      {"f64", [](PrefillParams& p, auto&) { p.fwd.dtype = DType::kF64; }, "fwd.dtype fp64 is not taken by the prefill"},
      {"dt_f64", [](PrefillParams& p, auto&) { p.fwd.dt_dtype = DType::kF64; },
       "fwd.dt_dtype fp64 is not taken by the prefill"},
      {"batch", [](PrefillParams& p, auto&) { p.fwd.batch = 2; }, "fwd.batch must be 1 in a prefill"},
      {"no_cu_seqlens", [](PrefillParams& p, auto&) { p.fwd.cu_seqlens = nullptr, p.fwd.nseqs = 0; },
       "fwd.cu_seqlens is null"},
      {"fwd_rule", [](PrefillParams& p, auto&) { p.fwd.x = nullptr; }, "fwd: x is null"},
      {"fwd_headdim", [](PrefillParams& p, auto&) { p.fwd.headdim = 40; },
       "fwd: headdim must be a multiple of 16 in [16, 128]"},
      {"fwd_y", [](PrefillParams& p, auto&) { p.fwd.y = nullptr; }, "fwd: y (the output) is null"},
      {"state_dtype_f64", [](PrefillParams& p, auto&) { p.state_dtype = DType::kF64; },
       "state_dtype fp64 is not taken by the prefill"},
      {"state_dtype_unknown", [](PrefillParams& p, auto&) { p.state_dtype = static_cast<DType>(9); },
       "state_dtype: unknown dtype 9"},
      {"nslots_zero", [](PrefillParams& p, auto&) { p.nslots = 0; }, "nslots must be >= 1, got 0"},
      {"nslots_int32", [](PrefillParams& p, auto&) { p.nslots = int64_t{1} << 31; }, "nslots must be < 2^31"},
      {"state_null", [](PrefillParams& p, auto&) { p.state = nullptr; }, "state (the cache) is null"},
      {"slots_null", [](PrefillParams& p, auto&) { p.slots = nullptr; }, "slots is null"},
      {"state_misaligned", [](PrefillParams& p, auto&) { p.state = static_cast<uint8_t*>(p.state) + 2; },
       "state: address"},
      {"slots_misaligned",
       [](PrefillParams& p, auto&) { p.slots = reinterpret_cast<const int32_t*>(reinterpret_cast<const uint8_t*>(p.slots) + 1); },
       "slots: address"},
      {"state_last_stride", [](PrefillParams& p, auto&) { p.state_stride.s3 = 2; },
       "state: last dimension must be contiguous"},
      {"state_negative_stride", [](PrefillParams& p, auto&) { p.state_stride.s1 = -1; }, "state: negative stride"},
      {"state_aliases_itself", [](PrefillParams& p, auto&) { p.state_stride.s0 = 0; },
       "state: strides [0, "},
      {"state_over_x", [](PrefillParams& p, auto&) { p.state = const_cast<void*>(p.fwd.x); },
       "output state overlaps input x"},
      {"y_in_state", [](PrefillParams& p, auto&) { p.fwd.y = p.state; }, "output state overlaps output y"},
      {"slots_in_y", [](PrefillParams& p, auto&) { p.slots = static_cast<const int32_t*>(p.fwd.y); },
       "output y overlaps input slots"},
      {"has_initial_state_in_state",
       [](PrefillParams& p, auto&) { p.has_initial_state = static_cast<const uint8_t*>(p.state); },
       "output state overlaps input has_initial_state"},
      // The host backends' checks of the contents.
      {"slot_out_of_range", [](PrefillParams&, HostPrefillProblem& h) { h.slots[2] = 17; },
       "slots[2] = 17 is outside the cache [0, nslots 8) and is not pad_slot_id -1"},
      {"slot_negative", [](PrefillParams&, HostPrefillProblem& h) { h.slots[0] = -2; },
       "slots[0] = -2 is outside the cache"},
      {"slot_pad_id_moved", [](PrefillParams& p, HostPrefillProblem& h) { p.pad_slot_id = 7, h.slots[3] = -1; },
       "slots[3] = -1 is outside the cache [0, nslots 8) and is not pad_slot_id 7"},
      {"slot_twice", [](PrefillParams&, HostPrefillProblem& h) { h.slots[3] = 5; },
       "slots[1] and slots[3] are both slot 5: two requests may not share a slot"},
      {"seq_idx_inside", [](PrefillParams&, HostPrefillProblem& h) { reinterpret_cast<int32_t*>(h.fwd.buffers.at("seq_idx").data())[1] = 7; },
       "seq_idx[1] = 7 after 0 inside request 0"},
      {"seq_idx_start", [](PrefillParams&, HostPrefillProblem& h) { reinterpret_cast<int32_t*>(h.fwd.buffers.at("seq_idx").data())[3] = 0; },
       "seq_idx[3] = 0 after 0 at the start of request 2"},
      {"cu_seqlens_contents", [](PrefillParams& p, auto&) { p.fwd.cu_seqlens = bad_cu; }, "cu_seqlens must be non-decreasing"},
      // The CUDA backend on host memory, after validating (message null: expect_cuda_refuses_host_memory).
      {"cuda", [](PrefillParams&, auto&) {}, nullptr},
      // Intermediate states: the fields together, then the entries (host backends).
      {"state_every_negative", [](PrefillParams& p, auto&) { p.state_every = -64; },
       "state_every must be >= 0 (0: no intermediate states), got -64", true},
      {"state_every_not_a_multiple", [](PrefillParams& p, auto&) { p.state_every = 96; },
       "state_every must be a multiple of fwd.chunk_size 64, got 96", true},
      {"chunk_size_32", [](PrefillParams& p, auto&) { p.fwd.chunk_size = 32; },
       "fwd.chunk_size must be 64, 128 or 256 in a prefill (its chunks and state_every's boundaries), got 32"},
      {"intermediate_slots_null", [](PrefillParams& p, auto&) { p.intermediate_slots = nullptr; },
       "intermediate_slots is null but state_every is 64", true},
      {"max_intermediate_zero", [](PrefillParams& p, auto&) { p.max_intermediate = 0; },
       "max_intermediate must be >= 1 with state_every 64, got 0", true},
      {"intermediate_slots_without_state_every", [](PrefillParams& p, auto&) { p.state_every = 0; },
       "intermediate_slots is given but state_every is 0", true},
      {"max_intermediate_too_large", [](PrefillParams& p, auto&) { p.max_intermediate = int64_t{1} << 60; },
       "nseqs * max_intermediate = 4 * 1152921504606846976 is more than 2^56 elements", true},
      {"intermediate_slots_misaligned",
       [](PrefillParams& p, auto&) {
         p.intermediate_slots = reinterpret_cast<const int32_t*>(reinterpret_cast<const uint8_t*>(p.intermediate_slots) + 2);
       },
       "intermediate_slots: address", true},
      {"intermediate_slots_in_y", [](PrefillParams& p, auto&) { p.intermediate_slots = static_cast<const int32_t*>(p.fwd.y); },
       "output y overlaps input intermediate_slots", true},
      {"intermediate_slots_in_state",
       [](PrefillParams& p, auto&) { p.intermediate_slots = static_cast<const int32_t*>(p.state); },
       "output state overlaps input intermediate_slots", true},
      {"intermediate_out_of_range", [](PrefillParams&, HostPrefillProblem& h) { h.intermediate_slots[3] = 16; },
       "intermediate_slots[1, 1] = 16 is outside the cache [0, nslots 16) and is not pad_slot_id -1", true},
      {"intermediate_negative", [](PrefillParams&, HostPrefillProblem& h) { h.intermediate_slots[0] = -3; },
       "intermediate_slots[0, 0] = -3 is outside the cache [0, nslots 16)", true},
      {"intermediate_on_a_read_slot", [](PrefillParams&, HostPrefillProblem& h) { h.intermediate_slots[1] = 5; },
       "slots[1] and intermediate_slots[0, 1] are both slot 5: an intermediate state stored there would clobber the "
       "state request 1 reads or stores", true},
      {"intermediate_on_its_own_slot_before_the_end",
       [](PrefillParams&, HostPrefillProblem& h) { h.intermediate_slots[0] = 4; },
       "slots[0] and intermediate_slots[0, 0] are both slot 4", true},
      {"intermediate_on_another_requests_last_boundary",
       [](PrefillParams&, HostPrefillProblem& h) { h.intermediate_slots[4] = 4; },
       "slots[0] and intermediate_slots[2, 0] are both slot 4", true},
      {"intermediate_twice", [](PrefillParams&, HostPrefillProblem& h) { h.intermediate_slots[4] = 8; },
       "intermediate_slots[0, 0] and intermediate_slots[2, 0] are both slot 8: two stored intermediate states may "
       "not share a slot", true},
      {"cuda_intermediate", [](PrefillParams&, auto&) {}, nullptr, true},
      {"cuda_validates_intermediate", [](PrefillParams& p, auto&) { p.state_every = 96; },
       "state_every must be a multiple of fwd.chunk_size 64, got 96", true},
  };
}

class PrefillRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(PrefillRefusal, NamesTheRuleAndWritesNothing) {
  const Refusal& r = GetParam();
  const bool cuda = std::string(r.name).rfind("cuda", 0) == 0;
  for (Backend backend : {Backend::kCpu, Backend::kReference}) {
    HostPrefillProblem problem(r.intermediate ? small_intermediate() : small());
    PrefillParams p = problem.params();
    r.edit(p, problem);
    if (cuda && !r.message) {
      expect_cuda_refuses_host_memory([&] { prefill(p, Backend::kCuda); });
    } else if (cuda) {
      expect_error([&] { prefill(p, Backend::kCuda); }, r.message);
    } else {
      expect_error([&] { backend == Backend::kCpu ? prefill_cpu(p) : prefill_reference(p); }, r.message);
      expect_error([&] { prefill(p, backend); }, r.message);
    }
    EXPECT_EQ(problem.state, problem.initial_state) << r.name;
    for (std::size_t i = 0; i < problem.fwd.buffers.at("y").size() / 2; ++i)
      ASSERT_TRUE(std::isnan(host::load(problem.fwd.buffers.at("y").data(), static_cast<int64_t>(i), DType::kBF16)))
          << r.name << ": y written";
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, PrefillRefusal, ::testing::ValuesIn(refusals()),
                         [](const ::testing::TestParamInfo<Refusal>& info) { return std::string(info.param.name); });

// Pads may repeat, and a pad id inside the cache's range makes that slot a pad.
TEST(PrefillSlots, PadsMayRepeat) {
  PrefillConfig c = small();
  c.slots = {-1, -1, 3, -1};
  HostPrefillProblem problem(c);
  EXPECT_NO_THROW(prefill_cpu(problem.params()));
  const PrefillOracle ref = prefill_oracle(problem);
  expect_pass(compare_prefill(problem, ref), c.describe());
}

// ---------------------------------------------------------------------------------------------
// Intermediate states: the slots rules' allowed cases, and that a store left out fails the check.

// The last boundary of a request whose length is a multiple of k may name the request's own slot
// (both stores write its final state); entries not stored may repeat and name requests' slots.
TEST(PrefillIntermediate, AllowedSlots) {
  for (DType state_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    PrefillConfig c = small_intermediate();
    c.state_dtype = state_dtype;
    // Request 0 (128 tokens = 2k, slot 4): 8, then its own slot at its last token. Request 1 (empty,
    // slot 5) stores none. Request 2 (64 tokens, slot 1): its own slot; its 2nd entry is not stored.
    // Request 3 (10 tokens, slot 2) stores none.
    c.seqlens = {128, 0, 64, 10};
    c.intermediate_slots = {8, 4, 5, 5, 1, 5, 2, 2};
    HostPrefillProblem problem(c);
    const PrefillOracle ref = prefill_oracle(problem);
    for (Backend backend : {Backend::kCpu, Backend::kReference}) {
      problem.reset();
      EXPECT_EQ(prefill(problem.params(), backend), backend);
      expect_pass(compare_prefill(problem, ref), std::string(to_string(backend)) + " " + c.describe());
    }
    EXPECT_EQ(problem.stored_intermediate_slots(), (std::vector<int32_t>{8}));  // 4 and 1: the requests' own
  }
}

// Poisoned slots make a missing store fail: the same problem run without its intermediate states.
TEST(PrefillIntermediate, AMissingStoreFails) {
  PrefillConfig c = small_intermediate();
  c.intermediate_slots = {};  // drawn, with pads
  c.nslots = 0, c.slots = {}, c.seqlens = {200, 64, 70}, c.pads = 0, c.seq_idx = false, c.seed = 11;
  HostPrefillProblem problem(c);
  ASSERT_FALSE(problem.stored_intermediate_slots().empty());
  const PrefillOracle ref = prefill_oracle(problem);
  PrefillParams p = problem.params();
  p.state_every = 0, p.intermediate_slots = nullptr;
  prefill_cpu(p);
  const std::vector<Comparison> cmps = compare_prefill(problem, ref);
  ASSERT_EQ(cmps.size(), 4u);
  EXPECT_EQ(cmps[2].name, "intermediate");
  EXPECT_FALSE(cmps[2].pass());
  EXPECT_GT(cmps[2].nonfinite, 0);
  EXPECT_TRUE(cmps[0].pass() && cmps[1].pass() && cmps[3].pass());
}

// The CUDA backend validates the new fields before anything else: a bad one is named whatever the
// build and the machine, and a good call in host memory is refused only for where it runs.
TEST(PrefillIntermediate, CudaRefusesAfterValidation) {
  HostPrefillProblem problem(small_intermediate());
  PrefillParams p = problem.params();
  expect_cuda_refuses_host_memory([&] { prefill(p, Backend::kCuda); });
  p.max_intermediate = 0;
  expect_error([&] { prefill(p, Backend::kCuda); }, "max_intermediate must be >= 1 with state_every 64, got 0");
}

// Sizes: the cache's element count within 2^56, checked without overflow.
TEST(PrefillValidate, CacheElementCount) {
  ProblemConfig fc;
  fc.batch = 1, fc.seqlen = 1, fc.nheads = 2048, fc.headdim = 128, fc.dstate = 256, fc.seqlens = {1};
  fc.final_states = false, fc.varlen_states = false, fc.dtype = DType::kBF16;
  HostProblem host(fc);
  static float state[16];
  static int32_t slots[1] = {0};
  PrefillParams p;
  p.fwd = host.params();
  p.state = state, p.state_stride = contiguous_strides(1, 2048, 128, 256);
  p.nslots = (int64_t{1} << 31) - 1, p.slots = slots;
  expect_error([&] { validate(p); }, "nslots * nheads * headdim * dstate = 2147483647 * 2048 * 128 * 256 is more than 2^56");
  expect_error([&] { validate_sizes(p); }, "nslots * nheads * headdim * dstate = 2147483647 * 2048 * 128 * 256 is more than 2^56");
}

// validate_sizes(PrefillParams): the sizes alone, no pointer (the Python op sizes y with it before
// allocating), with validate()'s messages, fwd's prefixed "fwd: " as there.
TEST(PrefillValidate, SizesNeedNoPointers) {
  PrefillParams p;
  ForwardParams& f = p.fwd;
  f.batch = 1, f.seqlen = 300, f.nheads = 4, f.headdim = 32, f.ngroups = 2, f.dstate = 16, f.chunk_size = 64;
  p.nslots = 8;
  EXPECT_NO_THROW(validate_sizes(p));
  EXPECT_THROW(validate(p), Error);  // the pointers are null
  const auto both = [&](const std::string& part) {
    expect_error([&] { validate_sizes(p); }, part);
    expect_error([&] { validate(p); }, part);
  };
  f.seqlen = int64_t{1} << 52;
  both("fwd: batch * seqlen * nheads * headdim = 1 * 4503599627370496 * 4 * 32 is more than 2^56 elements");
  f.seqlen = 300, f.chunk_size = 100;
  both("fwd.chunk_size must be 64, 128 or 256 in a prefill");
  f.chunk_size = 128, p.nslots = int64_t{1} << 31;
  both("nslots must be < 2^31, got 2147483648");
  p.nslots = 8, f.batch = 2;
  both("fwd.batch must be 1 in a prefill");
}

// input_status (the checked mode writes it) apart from the cache and the slot arrays, as from the
// forward's tensors: a probe found it accepted over cache slot 0 and over slots.
TEST(PrefillValidate, InputStatusApartFromTheCacheAndTheSlots) {
  HostPrefillProblem problem(small_intermediate());
  PrefillParams p = problem.params();
  p.fwd.check_inputs = true;
  static int64_t status[kInputStatusWords];
  p.fwd.input_status = status;
  EXPECT_NO_THROW(validate(p));
  p.fwd.input_status = static_cast<int64_t*>(p.state);
  expect_error([&] { validate(p); }, "input_status");
  p.fwd.input_status = reinterpret_cast<int64_t*>(const_cast<int32_t*>(p.slots));
  expect_error([&] { validate(p); }, "input_status");
  p.fwd.input_status = reinterpret_cast<int64_t*>(const_cast<int32_t*>(p.intermediate_slots));
  expect_error([&] { validate(p); }, "input_status");
}

}  // namespace
}  // namespace mamba2ssd::testing
