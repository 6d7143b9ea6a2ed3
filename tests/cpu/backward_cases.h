// The backward's test matrix, shared by the CPU backward's tests and the CUDA backward's (tests/gpu):
// hand-picked cases that cover every feature, dtype and gradient layout, and random combinations.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "testing/backward_problem.h"

namespace mamba2ssd::testing {

struct BackwardCase {
  ProblemConfig config;
  GradLayout layout = GradLayout::kContiguous;
};

inline void PrintTo(const BackwardCase& c, std::ostream* os) { *os << describe(c.config, c.layout); }

inline ProblemConfig backward_base(int64_t batch, int64_t seqlen, int64_t nheads, int64_t ngroups, int64_t headdim,
                   int64_t dstate, DType dtype) {
  ProblemConfig c;
  c.batch = batch, c.seqlen = seqlen, c.nheads = nheads, c.ngroups = ngroups, c.headdim = headdim;
  c.dstate = dstate, c.chunk_size = 64, c.dtype = dtype;
  return c;
}

// Hand-picked cases, so that every feature, dtype and layout is covered whatever the random draws do.
inline std::vector<BackwardCase> listed_cases() {
  std::vector<BackwardCase> v;
  const DType f32 = DType::kF32, f16 = DType::kF16, bf16 = DType::kBF16;
  auto add = [&](const ProblemConfig& c, GradLayout l = GradLayout::kContiguous) { v.push_back({c, l}); };
  // Lengths around the CPU backward's 64-token segments.
  for (int64_t L : {1, 63, 64, 65, 129, 200}) add(backward_base(2, L, 4, 2, 32, 32, bf16));
  // Group counts (one, some, one per head), head dims, state sizes, dtypes.
  add(backward_base(1, 100, 4, 1, 32, 16, f32));
  add(backward_base(1, 90, 4, 4, 128, 48, f16));
  add(backward_base(2, 70, 2, 2, 64, 256, bf16));
  add(backward_base(1, 80, 8, 2, 64, 128, f32));
  add(backward_base(1, 90, 4, 2, 80, 48, bf16));  // head dims no power of two (Nemotron-H's 80)
  add(backward_base(2, 70, 2, 1, 16, 32, f32));
  // dt in 16-bit, every D layout.
  {
    ProblemConfig c = backward_base(2, 65, 4, 2, 32, 32, bf16);
    c.dt_dtype = DType::kF16, c.D_layout = DLayout::kNone;
    add(c);
    c.dt_dtype = DType::kBF16, c.D_layout = DLayout::kPerHeadDim, c.dtype = f16;
    add(c);
  }
  // Gate, bias, softplus, dt limit with both bounds active, initial states, dfinal_states.
  {
    ProblemConfig c = backward_base(2, 150, 4, 2, 64, 64, f32);
    c.z = true, c.dt_bias = true, c.dt_softplus = true, c.dt_min = 0.01f, c.dt_max = 0.1f;
    c.initial_states = true, c.D_layout = DLayout::kPerHeadDim;
    add(c);
    c.dtype = bf16, c.dt_softplus = false, c.dt_min = 0.02f, c.dt_max = 0.05f, c.final_states = false;
    add(c);
  }
  // Packed sequences (empty ones too) through seq_idx or cu_seqlens alone, dvarlen_states.
  {
    ProblemConfig c = backward_base(1, 300, 4, 4, 64, 32, bf16);
    c.seqlens = {0, 65, 1, 63, 0, 171, 0};
    c.initial_states = true, c.z = true;
    add(c);
    c.seq_idx = true;
    add(c);
    c.varlen_states = false, c.final_states = false, c.dtype = f32;  // no state cotangents at all
    add(c);
  }
  // Padded views of every tensor and gradient; gradients as slices of one buffer.
  {
    ProblemConfig c = backward_base(2, 77, 4, 2, 32, 48, f16);
    c.strided = true, c.z = true, c.initial_states = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true;
    add(c, GradLayout::kPadded);
    c.dt_dtype = f16;
    add(c, GradLayout::kFused);
    c = backward_base(1, 120, 2, 1, 64, 16, bf16);
    c.dt_dtype = bf16, c.dt_softplus = true;
    c.seqlens = {50, 0, 70}, c.seq_idx = true, c.initial_states = true;
    add(c, GradLayout::kFused);
    c.dtype = c.dt_dtype = f32, c.strided = true;
    add(c, GradLayout::kPadded);
  }
  return v;
}

// Random combinations of everything, small enough for the fp64 oracle.
inline std::vector<BackwardCase> random_cases(int count) {
  std::mt19937_64 rng(20240612);
  auto pick = [&](auto... options) {
    using T = std::common_type_t<decltype(options)...>;
    const T values[] = {static_cast<T>(options)...};
    return values[rng() % sizeof...(options)];
  };
  auto coin = [&] { return rng() % 2 == 0; };
  std::vector<BackwardCase> v;
  for (int i = 0; i < count; ++i) {
    ProblemConfig c;
    c.nheads = pick(2, 4);
    c.ngroups = pick(int64_t{1}, int64_t{2}, c.nheads);
    c.headdim = pick(16, 32, 48, 64, 80, 128);
    c.dstate = 16 * (1 + static_cast<int64_t>(rng() % 8));
    c.seqlen = pick(1, 63, 65, 130);
    c.batch = pick(1, 2);
    c.dtype = pick(DType::kF32, DType::kF16, DType::kBF16);
    c.dt_dtype = pick(DType::kF32, DType::kF16, DType::kBF16);
    c.D_layout = pick(DLayout::kNone, DLayout::kPerHead, DLayout::kPerHeadDim);
    c.z = coin(), c.dt_bias = coin(), c.dt_softplus = coin(), c.initial_states = coin();
    c.final_states = rng() % 4 != 0;
    c.strided = coin();
    if (rng() % 3 == 0) c.dt_min = 0.005f, c.dt_max = 0.08f;
    if (rng() % 3 == 0 && c.seqlen > 1) {  // packed: 1 to 4 pieces, some empty
      c.batch = 1;
      int64_t left = c.seqlen;
      for (int s = 0, pieces = 1 + static_cast<int>(rng() % 4); s + 1 < pieces; ++s) {
        const int64_t len = static_cast<int64_t>(rng() % (left + 1));
        c.seqlens.push_back(len);
        left -= len;
      }
      c.seqlens.push_back(left);
      c.seq_idx = coin();
    }
    c.seed = static_cast<uint64_t>(100 + i);
    GradLayout layout = pick(GradLayout::kContiguous, GradLayout::kPadded, GradLayout::kFused);
    if (layout == GradLayout::kFused) c.dt_dtype = c.dtype;
    v.push_back({c, layout});
  }
  return v;
}

inline std::string case_name(const ::testing::TestParamInfo<BackwardCase>& info) {
  std::string name = std::to_string(info.index) + "_";
  for (char ch : describe(info.param.config, info.param.layout)) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch));
    if (ok || name.back() != '_') name += ok ? ch : '_';
  }
  while (name.back() == '_') name.pop_back();
  return name;
}

}  // namespace mamba2ssd::testing
