// The cases of `mamba2ssd fuzz`: small random problems over every shape, dtype, layout and feature
// the API takes, each a pure function of (seed, index): forward problems (also the backward's),
// packed prefills and decode steps.
#pragma once

#include <cstdint>

#include "testing/decode_problem.h"
#include "testing/prefill_problem.h"
#include "testing/problem.h"

namespace mamba2ssd::cli {

// Case `index` of the sweep drawn from `seed` (fuzz.cpp says what it draws). Always valid, and small:
// batch * seqlen * heads * headdim * dstate at most kFuzzBudget, so the oracle takes milliseconds.
testing::ProblemConfig fuzz_case(uint64_t seed, int64_t index);
constexpr int64_t kFuzzBudget = int64_t{1} << 22;

// A packed prefill (tokens * heads * headdim * dstate within kFuzzBudget) and a decode step, likewise.
testing::PrefillConfig fuzz_prefill_case(uint64_t seed, int64_t index);
testing::DecodeConfig fuzz_decode_case(uint64_t seed, int64_t index);

}  // namespace mamba2ssd::cli
