// Non-finite inputs on the GPU (docs/reliability.md, "Non-finite inputs"): the host backends' cases
// (tests/cpu/nonfinite_test.cpp: NaN, +inf, -inf in each input, fp32 and bf16, with and without a
// packed reset) through every CUDA path of the forward, both forms of the backward, both decode
// kernels and the packed prefill's paths, against the fp64 oracle.
//
// The decode step is per (request, head) arithmetic, so its finiteness must be the oracle's, element
// for element. The chunked paths multiply whole tiles on tensor cores, where a causal or
// sequence mask's zero times a non-finite operand is NaN (mamba_ssm's and fla's chunked kernels
// multiply masked tiles the same way): an output the oracle has finite may then be non-finite, but
// only near the value, and never the other way round. So, for the forward, the backward and the prefill:
//   - nothing hidden: every output (gradient, cache element) the oracle has non-finite is non-finite;
//   - nothing far: a non-finite output the oracle has finite lies in the value's batch row and group
//     (forward: its heads, from the start of its chunk on; prefill: its own request); the other rows,
//     groups and requests are exactly as the oracle has them;
//   - where both are finite, the values within the tolerance.
// Each case prints how many outputs the GPU made non-finite beyond the oracle, and where.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "api/internal.h"
#include "nonfinite_cases.h"
#include "test_matrix.h"
#include "testing/backward_problem.h"
#include "testing/decode_problem.h"
#include "testing/device_decode_problem.h"
#include "testing/device_prefill_problem.h"
#include "testing/device_problem.h"
#include "testing/forced.h"
#include "testing/prefill_problem.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

// The poisoned token: in the second 64-token chunk, six tokens past its start; packed, in the first
// sequence, which ends (token 100) inside that chunk, so that the second sequence starts there.
constexpr int64_t kToken = 70;

ProblemConfig config_of(const Poison& c) {
  ProblemConfig p;
  p.batch = c.packed ? 1 : 2, p.seqlen = 140, p.nheads = 4, p.ngroups = 2, p.headdim = 64, p.dstate = 64;
  p.chunk_size = 64, p.dtype = c.dtype, p.dt_dtype = c.dtype;
  p.z = true, p.D_layout = DLayout::kPerHeadDim, p.dt_bias = true, p.initial_states = true;
  if (c.packed) p.seqlens = {100, 40};
  return p;
}

// Tallies one output's elements: the oracle's non-finite ones the GPU hid, the GPU's non-finite ones
// beyond the oracle's (and their tokens), those outside what the GPU may reach, and the error where
// both are finite.
class Tally {
 public:
  Tally(std::string name, double tolerance) : name_(std::move(name)), tolerance_(tolerance), cmp_(name_) {}
  // token: the element's token, or -1 for a state.
  void add(double got, double want, bool may_reach, int64_t token = -1) {
    const bool g = std::isfinite(got), w = std::isfinite(want);
    oracle_nonfinite_ += !w;
    if (!w && g && hidden_++ == 0) first_hidden_ = at_;
    if (g && w) cmp_.add(got, want);
    if (!g && w) {
      ++extra_;
      if (token >= 0) first_ = std::min(first_, token), last_ = std::max(last_, token);
      if (!may_reach && far_++ == 0) first_far_ = at_;
    }
    ++at_;
  }
  // Expects nothing hidden, nothing far, the finite values within the tolerance; returns a summary.
  std::string check(const std::string& what) {
    const Comparison c = cmp_.done(tolerance_);
    EXPECT_EQ(hidden_, 0) << what << ": " << name_ << ": " << hidden_
                          << " outputs finite where the oracle's are not (the first at element " << first_hidden_ << ")";
    EXPECT_EQ(far_, 0) << what << ": " << name_ << ": " << far_
                       << " outputs non-finite beyond the value's reach (the first at element " << first_far_ << ")";
    EXPECT_LE(c.rel_l2, c.tolerance) << what << ": " << name_ << " where finite";
    std::string s = name_ + " " + std::to_string(oracle_nonfinite_);
    if (extra_ > 0) {
      s += " +" + std::to_string(extra_);
      if (last_ >= 0) s += " (tokens " + std::to_string(first_) + ".." + std::to_string(last_) + ")";
    }
    return s;
  }
  int64_t oracle_nonfinite() const { return oracle_nonfinite_; }

 private:
  std::string name_;
  double tolerance_;
  ComparisonBuilder cmp_;
  int64_t at_ = 0, oracle_nonfinite_ = 0, hidden_ = 0, extra_ = 0, far_ = 0, first_hidden_ = -1, first_far_ = -1;
  int64_t first_ = std::numeric_limits<int64_t>::max(), last_ = -1;
};

// ---- Forward -------------------------------------------------------------------------------------

// Whether output (b, t, h) (t -1: a state) may be non-finite on the GPU though the oracle's is finite:
// within the heads the value reaches (its head; its group's for B and C; head 1 of every row for a
// per-head input), its batch row, and from the start of its chunk on.
bool forward_may_reach(const Poison& c, const ProblemConfig& cfg, int64_t b, int64_t t, int64_t h) {
  if (per_head_input(c.tensor)) return h == kPoisonHead;
  const int64_t per_group = cfg.nheads / cfg.ngroups;
  const bool group_wide = c.tensor == "B" || c.tensor == "C";
  if (b != 0 || (group_wide ? h / per_group != kPoisonHead / per_group : h != kPoisonHead)) return false;
  return c.tensor == "initial_states" || t < 0 || t >= kToken / cfg.chunk_size * cfg.chunk_size;
}

void check_forward(const Poison& c, CudaPath path, Fp32Math math) {
  ProblemConfig cfg = config_of(c);
  cfg.cuda_path = path, cfg.fp32_math = math;
  if (!path_applies(cfg, path)) return;
  HostProblem host(cfg);
  put_poison(host, c, kToken);
  const ForwardParams p = host.params();
  const reference::Result want = reference::run(p);
  DeviceProblem dev(host);
  dev.poison_outputs();
  dev.launch();
  const auto out = dev.download_outputs();

  const std::string what = poison_name(c) + " " + to_string(path) + (math == Fp32Math::kAccurate ? " 3xTF32" : "");
  const double tol = rel_l2_tolerance(p.dtype, math);
  const int64_t L = p.seqlen, H = p.nheads, P = p.headdim, N = p.dstate;
  Tally y("y", tol);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < P; ++i)
          y.add(host::load(out.at("y").data(), b * p.y_stride.s0 + t * p.y_stride.s1 + h * p.y_stride.s2 + i, p.dtype),
                want.y[((b * L + t) * H + h) * P + i], forward_may_reach(c, cfg, b, t, h), t);
  // Final states by batch row; varlen states by sequence (all in batch row 0).
  auto states = [&](const char* name, const Strides4& st, const std::vector<double>& ref, int64_t rows, bool by_row) {
    Tally s(name, tol);
    const float* got = reinterpret_cast<const float*>(out.at(name).data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < P; ++i)
          for (int64_t n = 0; n < N; ++n)
            s.add(got[r * st.s0 + h * st.s1 + i * st.s2 + n], ref[((r * H + h) * P + i) * N + n],
                  forward_may_reach(c, cfg, by_row ? r : 0, -1, h));
    return s.check(what);
  };
  std::string summary = y.check(what) + ", " + states("final_states", p.final_states_stride, want.final_states,
                                                      p.batch, true);
  if (c.packed)
    summary += ", " + states("varlen_states", p.varlen_states_stride, want.varlen_states, p.nseqs, false);
  if (clamped_poison(c)) EXPECT_EQ(y.oracle_nonfinite(), 0) << what;
  else if (!minus_inf_A(c)) EXPECT_GT(y.oracle_nonfinite(), 0) << what;
  std::printf("  %-40s %s\n", what.c_str(), summary.c_str());
}

class NonFiniteCuda : public ::testing::TestWithParam<Poison> {};

// Every CUDA path that takes the call (3xTF32 too on an fp32 call).
TEST_P(NonFiniteCuda, ForwardKeepsItNear) {
  for (CudaPath path : {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper}) {
    check_forward(GetParam(), path, Fp32Math::kTf32);
    if (GetParam().dtype == DType::kF32) check_forward(GetParam(), path, Fp32Math::kAccurate);
  }
}

// ---- Backward ------------------------------------------------------------------------------------

// The batch row (-1: summed over rows) and group of element i of a gradient, dense in the oracle's
// order (the views of testing/backward_problem.cpp).
struct RowGroup {
  int64_t row, group;
};
RowGroup row_group_of(const GradView& v, const std::string& name, int64_t i, int64_t per_group) {
  const auto& s = v.size;
  const int64_t l = i % s[3], k = i / s[3] % s[2], j = i / (s[3] * s[2]) % s[1], a = i / (s[3] * s[2] * s[1]);
  if (name == "dx" || name == "dz") return {a, k / per_group};        // [b, L, H, P]
  if (name == "ddt") return {j, l / per_group};                       // [1, b, L, H]
  if (name == "dB" || name == "dC") return {a, k};                    // [b, L, G, N]
  if (name == "dinitial_states") return {a, j / per_group};           // [b, H, P, N]
  if (name == "dD" && s[2] > 1) return {-1, k / per_group};           // [1, 1, H, P]
  return {-1, l / per_group};                                         // dA, ddt_bias, dD [H]
}

void check_backward(const Poison& c, bool portable) {
  ProblemConfig cfg = config_of(c);
  cfg.varlen_states = false;  // the CUDA backward takes no dvarlen_states
  BackwardProblem problem(cfg);
  put_poison(problem.forward, c, kToken);
  const reference::Grads64 ref = backward_oracle(problem);
  std::map<std::string, std::vector<uint8_t>> out;
  {
    const Forced portable_kernels(detail::set_portable_backward_for_testing, portable, false);
    DeviceBackwardProblem dev(problem);  // (its workspace sized for the kernels forced)
    dev.poison_gradients();
    dev.launch();
    out = dev.download();
  }

  const std::string what = poison_name(c) + (portable ? " portable" : " default");
  const int64_t per_group = cfg.nheads / cfg.ngroups, group = kPoisonHead / per_group;
  std::string summary;
  int64_t oracle_nonfinite = 0;
  for (const auto& [name, view] : problem.gradients) {
    const std::vector<double> got = read_gradient(problem, out, name);
    const std::vector<double>& want = oracle_gradient(ref, name);
    ASSERT_EQ(got.size(), want.size()) << what << ": " << name;
    const bool sum = name == "dA" || name == "ddt_bias" || name == "dD";
    Tally g(name, sum ? backward_sum_rel_l2_tolerance(c.dtype) : backward_rel_l2_tolerance(c.dtype));
    for (std::size_t i = 0; i < got.size(); ++i) {
      const RowGroup at = row_group_of(view, name, static_cast<int64_t>(i), per_group);
      g.add(got[i], want[i], at.group == group && (at.row <= 0 || per_head_input(c.tensor)));
    }
    summary += (summary.empty() ? "" : ", ") + g.check(what);
    oracle_nonfinite += g.oracle_nonfinite();
  }
  if (clamped_poison(c)) EXPECT_EQ(oracle_nonfinite, 0) << what;
  else if (!minus_inf_A(c)) EXPECT_GT(oracle_nonfinite, 0) << what;
  std::printf("  %-40s %s\n", what.c_str(), summary.c_str());
}

// The Hopper kernels (where they take the call) and the portable ones.
TEST_P(NonFiniteCuda, BackwardKeepsItNear) {
  check_backward(GetParam(), false);
  check_backward(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(Inputs, NonFiniteCuda, ::testing::ValuesIn(poison_cases()),
                         [](const auto& info) { return poison_name(info.param); });

// ---- Serving -------------------------------------------------------------------------------------

const float kValues[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};

// The decode step on each kernel: out and the cache finite exactly where decode_reference has them.
TEST(NonFiniteCudaServing, DecodeAsTheOracle) {
  for (const char* tensor : kServingInputs)
    for (float value : kValues)
      for (DType state : {DType::kF32, DType::kBF16})
        for (int kernel : {1, 2}) {
          SCOPED_TRACE(std::string(tensor) + " " + value_name(value) + " state " + to_string(state) +
                       (kernel == 1 ? " rows kernel" : " stream kernel"));
          DecodeConfig c;
          c.batch = 3, c.ntokens = 2, c.nheads = 4, c.ngroups = 2, c.headdim = 64, c.dstate = 64;
          c.dtype = DType::kF32, c.state_dtype = state, c.z = c.dt_bias = c.dst_indices = true;
          c.D_layout = DLayout::kPerHeadDim;
          HostDecodeProblem gpu(c), ref(c);
          for (HostDecodeProblem* p : {&gpu, &ref}) put_serving(p->buffers.at(tensor), tensor, value);
          ASSERT_NO_THROW(decode_reference(ref.params()));
          const Forced forced([](int k) { detail::set_decode_kernel_for_testing(k); }, kernel, 0);
          DeviceDecodeProblem dev(gpu);
          dev.poison_outputs();
          dev.launch();
          const auto out = dev.download();
          EXPECT_EQ(finiteness_mismatches(out.at("out"), ref.buffers.at("out"), c.dtype), 0) << "out";
          EXPECT_EQ(finiteness_mismatches(out.at("state"), ref.buffers.at("state"), c.state_dtype), 0) << "state";
          EXPECT_EQ(dev.guard_damage(), "");
        }
}

// The packed prefill on each path that takes the call: every other request (its y and the cache
// slots it stores to) and every slot no request stores to exactly as prefill_reference has them,
// the poisoned request (every request's head 1 for a per-head input) with nothing hidden. With every
// step negative too (dt_min 0 clamps it to 0), so that -inf in A meets A d = -inf * 0.
struct PrefillPoison {
  std::vector<int64_t> seqlens;  // the requests
  int64_t token;                 // the poisoned token (-1: put_serving's, past the middle)
  int64_t segments;              // the hopper path's segments over the padded chunks (0: its choice)
};

// Element `token` of a per-token input ([T, H, P], [T, G, N] or [T, H]; head 1, group 0), or
// put_serving's for token -1 or a per-head input. Returns the token.
int64_t put_prefill(HostPrefillProblem& p, const std::string& name, float value, int64_t token) {
  const PrefillConfig& c = p.config;
  const DType t = name == "dt" ? c.dt_dtype : per_head_input(name) ? DType::kF32 : c.dtype;
  const int64_t per_token = name == "dt" ? c.nheads : name == "B" || name == "C" ? c.ngroups * c.dstate : c.nheads * c.headdim;
  if (token < 0 || per_head_input(name)) return put_serving(p.fwd.buffers.at(name), name, value, t) / per_token;
  const int64_t within = name == "dt" ? kPoisonHead : name == "B" || name == "C" ? kPoisonColumn
                                                                                 : kPoisonHead * c.headdim + kPoisonDim;
  host::store(p.fwd.buffers.at(name).data(), token * per_token + within, t, value);
  return token;
}

void check_prefill(const PrefillPoison& pc, const char* tensor, float value, DType dtype, bool negative_steps,
                   CudaPath path) {
  PrefillConfig c;
  c.seqlens = pc.seqlens, c.nheads = 4, c.ngroups = 2, c.headdim = 64, c.dstate = 64, c.dtype = dtype;
  c.z = c.dt_bias = true, c.state_every = 64;
  std::string what = std::string(tensor) + " " + value_name(value) + " " + to_string(dtype) +
                     (negative_steps ? " negative steps " : " ") + to_string(path);
  if (pc.segments > 0) what += " segments " + std::to_string(pc.segments);
  HostPrefillProblem gpu(c), ref(c);
  const std::string name(tensor);
  int64_t token = 0;
  for (HostPrefillProblem* p : {&gpu, &ref}) {
    if (negative_steps)
      for (std::size_t i = 0; i < p->fwd.buffers.at("dt").size() / dtype_size(c.dt_dtype); ++i)
        host::store(p->fwd.buffers.at("dt").data(), static_cast<int64_t>(i), c.dt_dtype, -5.0f);
    token = put_prefill(*p, name, value, pc.token);
  }
  DevicePrefillProblem dev(gpu);
  if (path == CudaPath::kHopper) {
    PrefillParams hp = dev.params();
    hp.fwd.cuda_path = path;
    try {
      (void)cuda_prefill_workspace_bytes(hp);
    } catch (const Error&) {
      return;  // not on this GPU or for this dtype
    }
  }
  ASSERT_NO_THROW(prefill_reference(ref.params())) << what;
  HostPrefillProblem got = gpu;
  {
    const ForcedSegments segments(pc.segments);  // (test_matrix.h)
    dev.reset();
    dev.launch(nullptr, path);
    dev.download(got);
  }
  EXPECT_EQ(dev.guard_damage(), "") << what;

  // The poisoned token's request, and the request each cache slot belongs to (-1: none).
  const int64_t S = c.requests();
  std::vector<int64_t> starts{0};
  for (int64_t len : c.seqlens) starts.push_back(starts.back() + len);
  auto request_of = [&](int64_t tok) {
    return static_cast<int64_t>(std::upper_bound(starts.begin(), starts.end(), tok) - starts.begin()) - 1;
  };
  const int64_t poisoned = request_of(token);
  std::vector<int64_t> owner(static_cast<std::size_t>(c.cache_slots()), -1);
  const int64_t M = c.intermediates();
  for (int64_t r = 0; r < S; ++r) {
    const int32_t s = gpu.slots[static_cast<std::size_t>(r)];
    if (s >= 0 && s < c.cache_slots()) owner[static_cast<std::size_t>(s)] = r;
    for (int64_t j = 0; j < M; ++j) {
      const int32_t e = gpu.intermediate_slots[static_cast<std::size_t>(r * M + j)];
      if (e >= 0 && e < c.cache_slots()) owner[static_cast<std::size_t>(e)] = r;
    }
  }
  // Whether an output of request r (-1: a slot of none) and head h may differ from the oracle's
  // finiteness (only by being non-finite: Tally checks nothing is hidden anywhere).
  auto may_reach = [&](int64_t r, int64_t h) { return per_head_input(name) ? h == kPoisonHead : r == poisoned; };
  Tally y("y", std::numeric_limits<double>::infinity());  // the values are prefill_cuda_test's business
  for_each_y(got, [&](int64_t tok, int64_t h, int64_t, int64_t e) {
    y.add(host::load(got.fwd.buffers.at("y").data(), e, dtype), host::load(ref.fwd.buffers.at("y").data(), e, dtype),
          may_reach(request_of(tok), h), tok);
  });
  Tally cache("cache", std::numeric_limits<double>::infinity());
  for_each_cache(got, [&](int64_t s, int64_t h, int64_t, int64_t, int64_t e) {
    const int64_t r = owner[static_cast<std::size_t>(s)];
    cache.add(host::load(got.state.data(), e, c.state_dtype), host::load(ref.state.data(), e, c.state_dtype),
              r >= 0 && may_reach(r, h));
  });
  const std::string summary = y.check(what) + ", " + cache.check(what);
  std::printf("  %-50s request %lld: %s\n", what.c_str(), static_cast<long long>(poisoned), summary.c_str());
}

// The CPU tests' requests {37, 0, 1, 70, 5} on each path; then on the hopper path, requests that
// span three forced segments: the poisoned request's state enters the second segment, in which the
// third request starts and from which that request runs on into the third segment (the entry there
// combines the segments' states across a request start).
TEST(NonFiniteCudaServing, PrefillKeepsItInItsRequest) {
  const PrefillPoison small{{37, 0, 1, 70, 5}, -1, 0}, spanning{{100, 400, 300}, 150, 3};
  for (const char* tensor : kServingInputs)
    for (float value : kValues)
      for (bool negative_steps : {false, true}) {
        check_prefill(small, tensor, value, DType::kF32, negative_steps, CudaPath::kThreeKernel);
        check_prefill(small, tensor, value, DType::kBF16, negative_steps, CudaPath::kThreeKernel);
        check_prefill(small, tensor, value, DType::kBF16, negative_steps, CudaPath::kHopper);
        check_prefill(spanning, tensor, value, DType::kBF16, negative_steps, CudaPath::kHopper);
      }
}

}  // namespace
}  // namespace mamba2ssd::testing
