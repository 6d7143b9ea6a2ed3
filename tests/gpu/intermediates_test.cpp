// Each kernel of the CUDA forward checked on its own results, not only through y: after a call,
// the workspace holds what every kernel before the last one wrote, and each section is compared
// with the same quantity computed from the fp64 oracle (or, for chunk_cumsum, from the contract's
// dt preprocessing in fp64). A wrong kernel is then named by the failing test:
//   chunk_cumsum          dt, g and sequence ids                           (every path)
//   chunk_states_sm80     the state entering each chunk                    (three-kernel)
//   segment_ends_sm80/90  each segment's end state from zero, its decay    (fused, hopper)
//   segment_entries       the state entering each segment                  (fused, hopper)
// The oracle's state after token t is its final state on the problem cut after t (inputs shared,
// resets included); a segment's end state from zero is the final state of the segment alone.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "api/internal.h"
#include "common/dt.h"
#include "common/host_dtype.h"
#include "common/segment_entry.h"
#include "cuda/common/device.h"
#include "cuda/fwd/paths.h"
#include "reference/reference.h"
#include "testing/device_problem.h"
#include "testing/forced.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

const cuda::FwdPath& path_of(CudaPath id) {
  for (const cuda::FwdPath* p : {&cuda::kSm90Path, &cuda::kFusedPath, &cuda::kThreeKernelPath})
    if (p->id == id) return *p;
  throw Error("no such path");
}

template <typename T>
std::vector<T> download(const T* src, std::size_t n) {
  std::vector<T> v(n);
  if (n) EXPECT_EQ(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// ||out - ref|| / ||ref|| over the pairs given, and whether any out is not finite.
struct Error2 {
  double num = 0, den = 0;
  bool nonfinite = false;
  void add(double out, double ref) {
    if (!std::isfinite(out)) nonfinite = true;
    num += (out - ref) * (out - ref), den += ref * ref;
  }
  double rel() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

// The host problem cut to tokens [t0, t0 + n): inputs offset, no initial state unless kept (t0 0),
// no packed-sequence offsets (the cases here pass seq_idx).
ForwardParams cut(ForwardParams p, int64_t t0, int64_t n, bool keep_initial) {
  const int64_t e = static_cast<int64_t>(dtype_size(p.dtype)), edt = static_cast<int64_t>(dtype_size(p.dt_dtype));
  auto at = [](const void* base, int64_t elems, int64_t size) {
    return base ? static_cast<const char*>(base) + elems * size : nullptr;
  };
  p.x = at(p.x, t0 * p.x_stride.s1, e), p.B = at(p.B, t0 * p.B_stride.s1, e), p.C = at(p.C, t0 * p.C_stride.s1, e);
  p.z = at(p.z, t0 * p.z_stride.s1, e), p.dt = at(p.dt, t0 * p.dt_stride.s1, edt);
  if (p.seq_idx) p.seq_idx += t0 * p.seq_idx_stride.s1;
  if (!keep_initial) p.initial_states = nullptr;
  p.seqlen = n, p.cu_seqlens = nullptr, p.nseqs = 0, p.varlen_states = nullptr;
  return p;
}

struct Case {
  ProblemConfig config;
  CudaPath path;
  int64_t segments;  // forced for the fused walks (0: the shape's choice)
};

class Intermediates : public ::testing::TestWithParam<Case> {};

TEST_P(Intermediates, MatchTheOracle) {
  const Case& k = GetParam();
  ProblemConfig config = k.config;
  config.cuda_path = k.path;
  HostProblem host(config);
  try {
    cuda_workspace_bytes(host.params());
  } catch (const Error& e) {
    GTEST_SKIP() << to_string(k.path) << " does not run " << config.describe() << ": " << e.what();
  }
  // Forced for the rest of the test (set back when an ASSERT leaves it early too).
  const Forced segments(detail::set_fused_segments_for_testing, k.segments, int64_t{0});
  DeviceProblem dev(host);
  ASSERT_EQ(cudaMemset(dev.workspace(), 0xff, dev.workspace_bytes()), cudaSuccess);  // NaN: unwritten shows
  dev.launch();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const ForwardParams hp = host.params();
  const cuda::FwdPlan plan = path_of(k.path).plan(dev.params(), cuda::current_device());
  const cuda::FwdWorkspace ws = cuda::carve(plan, dev.workspace());
  const std::string what = config.describe() + " " + to_string(k.path) + " " + plan.describe();
  const int64_t Bt = hp.batch, L = hp.seqlen, H = hp.nheads, P = hp.headdim, N = hp.dstate;
  const double tol = rel_l2_tolerance(hp.dtype);

  // chunk_cumsum: dt after preprocessing, g = the chunk's cumsum of A dt times log2(e), ids.
  const auto dt = download(ws.dt, Bt * H * plan.lpad), g = download(ws.g, Bt * H * plan.lpad);
  std::vector<int32_t> seq = ws.seq ? download(ws.seq, Bt * plan.lpad) : std::vector<int32_t>();
  double worst_g = 0;
  for (int64_t b = 0; b < Bt; ++b)
    for (int64_t h = 0; h < H; ++h) {
      double cum = 0;
      for (int64_t t = 0; t < plan.lpad; ++t) {
        if (t % plan.chunk == 0) cum = 0;
        const int64_t tt = std::min(t, L - 1);
        const double d = t < L ? preprocess_dt(host::load(hp.dt, b * hp.dt_stride.s0 + tt * hp.dt_stride.s1 + h * hp.dt_stride.s2, hp.dt_dtype),
                                               hp.dt_bias ? hp.dt_bias[h] : 0.0f, hp.dt_softplus, hp.dt_min, hp.dt_max)
                               : 0.0;
        cum += static_cast<double>(hp.A[h]) * d * 1.4426950408889634;
        const int64_t i = (b * H + h) * plan.lpad + t;
        EXPECT_NEAR(dt[i], d, 1e-6 * (1 + std::fabs(d))) << what << " dt b" << b << " h" << h << " t" << t;
        worst_g = std::max(worst_g, std::fabs(g[i] - cum) / (1 + std::fabs(cum)));
        if (!seq.empty() && h == 0) {
          const int32_t id = hp.seq_idx[b * hp.seq_idx_stride.s0 + tt * hp.seq_idx_stride.s1];
          EXPECT_EQ(seq[b * plan.lpad + t], id) << what << " seq b" << b << " t" << t;
        }
      }
    }
  EXPECT_LT(worst_g, 1e-5) << what << ": g";

  // The oracle's state after the first n tokens, of (b, h), element (p, n).
  auto state_after = [&](int64_t n) { return reference::run(cut(hp, 0, n, true)); };
  auto at = [&](const reference::Result& r, int64_t b, int64_t h, int64_t pi, int64_t ni) {
    return r.final_states[((b * H + h) * P + pi) * N + ni];
  };

  if (ws.chunk_states) {  // chunk_states_sm80
    const auto states = download(ws.chunk_states, Bt * plan.nchunks * H * P * N);
    Error2 err;
    for (int64_t c = 1; c < plan.nchunks; ++c) {
      const reference::Result r = state_after(c * plan.chunk);
      for (int64_t b = 0; b < Bt; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < P * N; ++i)
            err.add(states[((b * plan.nchunks + c) * H + h) * P * N + i], at(r, b, h, i / N, i % N));
    }
    EXPECT_FALSE(err.nonfinite) << what << ": chunk states";
    EXPECT_LE(err.rel(), tol) << what << ": chunk states";
    std::printf("  %-90s chunk states %.2e\n", what.c_str(), err.rel());
  }

  if (plan.nsegs > 1) {  // segment_ends_*, segment_entries
    const int64_t kN = cuda::fused_state_cols(N), S = plan.nsegs, seg_len = plan.seg_chunks * plan.chunk;
    const auto ends = download(ws.seg_ends, Bt * S * H * P * kN);
    const auto entries = download(ws.seg_entries, Bt * S * H * P * kN);
    const auto decay = download(ws.seg_decay, Bt * S * H);
    Error2 end_err, entry_err;
    bool padding_zero = true;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t t0 = s * seg_len, n = std::min(seg_len, L - t0);
      const reference::Result alone = reference::run(cut(hp, t0, n, false));
      const reference::Result before = s ? state_after(t0) : reference::Result{};
      for (int64_t b = 0; b < Bt; ++b)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t base = ((b * S + s) * H + h) * P * kN;
          for (int64_t pi = 0; pi < P; ++pi)
            for (int64_t ni = 0; ni < kN; ++ni) {
              const float end = ends[base + pi * kN + ni], entry = entries[base + pi * kN + ni];
              if (ni >= N) {
                padding_zero = padding_zero && (s + 1 == S || end == 0.0f) && entry == 0.0f;
                continue;
              }
              if (s + 1 < S) end_err.add(end, at(alone, b, h, pi, ni));
              const Strides4& is = hp.initial_states_stride;
              const double want = s ? at(before, b, h, pi, ni)
                                    : hp.initial_states ? hp.initial_states[b * is.s0 + h * is.s1 + pi * is.s2 + ni]
                                                        : 0.0;
              entry_err.add(entry, want);
            }
          if (s + 1 < S) {  // the decay across the segment: kSegmentCut if a sequence starts in it
            double log_decay = 0;
            bool cut_here = false;
            for (int64_t t = t0; t < t0 + n; ++t) {
              const double d = preprocess_dt(host::load(hp.dt, b * hp.dt_stride.s0 + t * hp.dt_stride.s1 + h * hp.dt_stride.s2, hp.dt_dtype),
                                             hp.dt_bias ? hp.dt_bias[h] : 0.0f, hp.dt_softplus, hp.dt_min, hp.dt_max);
              log_decay += static_cast<double>(hp.A[h]) * d;
              if (hp.seq_idx) {
                const int64_t id = hp.seq_idx[b * hp.seq_idx_stride.s0 + t * hp.seq_idx_stride.s1];
                const int64_t prev = t ? hp.seq_idx[b * hp.seq_idx_stride.s0 + (t - 1) * hp.seq_idx_stride.s1] : 0;
                cut_here = cut_here || id != prev;
              }
            }
            if (cut_here) {
              EXPECT_EQ(decay[(b * S + s) * H + h], kSegmentCut) << what << " decay seg " << s;
            } else {
              const double want = std::exp(log_decay);
              EXPECT_NEAR(decay[(b * S + s) * H + h], want, 1e-4 * want + 1e-30) << what << " decay seg " << s;
            }
          }
        }
    }
    EXPECT_TRUE(padding_zero) << what << ": state columns past dstate must stay zero";
    EXPECT_FALSE(end_err.nonfinite || entry_err.nonfinite) << what << ": segment states";
    EXPECT_LE(end_err.rel(), tol) << what << ": segment end states";
    EXPECT_LE(entry_err.rel(), tol) << what << ": segment entry states";
    std::printf("  %-90s segment ends %.2e entries %.2e\n", what.c_str(), end_err.rel(), entry_err.rel());
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  ProblemConfig base;
  base.batch = 2, base.seqlen = 1000, base.nheads = 4, base.headdim = 64, base.dstate = 64, base.ngroups = 2;
  base.initial_states = true, base.seed = 900;
  ProblemConfig packed = base;
  packed.batch = 1, packed.seqlen = 1100, packed.seq_idx = true, packed.varlen_states = false;
  packed.seqlens = {300, 5, 400, 0, 395}, packed.seed = 901;
  for (const ProblemConfig& c0 : {base, packed})
    for (int64_t N : {64, 128, 256})
      for (DType t : {DType::kBF16, DType::kF32}) {
        ProblemConfig c = c0;
        c.dstate = N, c.dtype = t, c.dt_bias = N == 128, c.dt_softplus = N == 128;
        v.push_back({c, CudaPath::kThreeKernel, 0});
        for (int64_t segs : {3, 5}) {
          v.push_back({c, CudaPath::kFused, segs});
          v.push_back({c, CudaPath::kHopper, segs});
        }
      }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Kernels, Intermediates, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return "case" + std::to_string(info.index); });

}  // namespace
}  // namespace mamba2ssd::testing
