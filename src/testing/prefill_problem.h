// Packed prefill test problems: the forward's packed problem (testing::HostProblem, batch 1 with
// cu_seqlens) plus a random state cache and the requests' slots, the PrefillParams that point at
// them, and the comparison of a backend's results (y and the cache) with the oracle
// (prefill_reference). Shared by the C++ tests and the CLI.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

struct PrefillConfig {
  std::vector<int64_t> seqlens = {37, 0, 1, 70, 5};  // the requests' lengths (0 allowed; not all 0)
  int64_t nheads = 4, headdim = 32, dstate = 32, ngroups = 2, chunk_size = 64;
  DType dtype = DType::kBF16;
  DType dt_dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  DLayout D_layout = DLayout::kPerHead;
  bool z = false, dt_bias = false, dt_softplus = false;
  float dt_min = 0.0f, dt_max = std::numeric_limits<float>::infinity();
  bool seq_idx = false;            // pass seq_idx next to cu_seqlens (the ids are the request numbers)
  bool strided = false;            // every tensor a padded view (ProblemConfig's), the cache too
  bool misaligned = false;         // the inputs off 16-byte alignment (ProblemConfig's)
  bool odd_cache = false;          // the cache's rows N + 1 elements apart: odd strides, no paired stores
  int64_t nslots = 0;              // 0: requests + 3
  bool has_initial_state = true;   // pass has_initial_state, drawn (about half 0); false: null
  int64_t pads = 0;                // requests whose slot is pad_slot_id
  int32_t pad_slot_id = -1;
  std::vector<int32_t> slots;      // explicit slots, replacing the drawn ones (distinct, random)
  std::vector<uint8_t> initial;    // explicit has_initial_state, replacing the drawn one
  int64_t state_every = 0;         // k: an intermediate state every k tokens (0: none)
  int64_t max_intermediate = 0;    // entries per request; 0: the longest request's boundaries (>= 1)
  std::vector<int32_t> intermediate_slots;  // explicit [S, M] entries, replacing the drawn ones
  uint64_t seed = 0;

  int64_t requests() const { return static_cast<int64_t>(seqlens.size()); }
  int64_t tokens() const;
  int64_t intermediates() const;   // M: max_intermediate resolved; 0 without intermediate states
  // 0: one slot a request, one an intermediate entry, 3 spare
  int64_t cache_slots() const { return nslots > 0 ? nslots : requests() * (1 + intermediates()) + 3; }
  ProblemConfig forward_config() const;  // the packed forward problem of the inputs and y
  std::string describe() const;          // one line: "seqs[37,0,1,70,5] H4 P32 N32 G2 bf16 state:fp32 ..."
  bool operator==(const PrefillConfig&) const = default;
};

struct HostPrefillProblem {
  explicit HostPrefillProblem(const PrefillConfig& config);

  PrefillConfig config;
  HostProblem fwd;                     // x, dt, A, B, C, D, z, dt_bias, seq_idx, cu_seqlens, y
  std::vector<uint8_t> state;          // the cache, written by a call
  std::vector<uint8_t> initial_state;  // the cache as drawn
  Strides4 state_stride;
  std::vector<int32_t> slots;
  std::vector<uint8_t> has_initial_state;  // empty: passed as null
  std::vector<int32_t> intermediate_slots;  // [S, M]; empty without intermediate states

  PrefillParams params();  // into the buffers above
  void reset();            // y poisoned with NaN, the cache back to as drawn
  // The slots an intermediate state is stored to (mamba2ssd.h's rule), but not a request's own slot
  // (its last boundary may name it). As drawn they hold NaN, so a store left out fails the comparison.
  std::vector<int32_t> stored_intermediate_slots() const;
};

// Every element of the problem's y, as f(token, head, dim, offset), and of its cache, as f(slot,
// head, dim, state column, offset): offsets in elements, by the problem's strides.
template <typename F>
void for_each_y(const HostPrefillProblem& problem, F&& f) {
  const PrefillConfig& c = problem.config;
  const ForwardParams p = problem.fwd.params();
  for (int64_t t = 0; t < c.tokens(); ++t)
    for (int64_t h = 0; h < c.nheads; ++h)
      for (int64_t i = 0; i < c.headdim; ++i) f(t, h, i, t * p.y_stride.s1 + h * p.y_stride.s2 + i);
}
template <typename F>
void for_each_cache(const HostPrefillProblem& problem, F&& f) {
  const PrefillConfig& c = problem.config;
  const Strides4& ss = problem.state_stride;
  for (int64_t slot = 0; slot < c.cache_slots(); ++slot)
    for (int64_t h = 0; h < c.nheads; ++h)
      for (int64_t i = 0; i < c.headdim; ++i)
        for (int64_t n = 0; n < c.dstate; ++n) f(slot, h, i, n, slot * ss.s0 + h * ss.s1 + i * ss.s2 + n);
}

// The oracle's answer: prefill_reference run on copies of y and of the cache as drawn.
struct PrefillOracle {
  std::vector<uint8_t> y, state;
};
PrefillOracle prefill_oracle(const HostPrefillProblem& problem);

// The problem's y and cache now (after a backend ran) against the oracle's:
//   "y"             rel L2 over every token
//   "state"         rel L2 over the slots the requests store to
//   "intermediate"  rel L2 over stored_intermediate_slots() (only with state_every)
//   "state (kept)"  every other cache element keeps its bits (tolerance 0)
// Tolerance: prefill_rel_l2_tolerance(dtype, state_dtype); y's and the states' NaN count as failures.
std::vector<Comparison> compare_prefill(const HostPrefillProblem& problem, const PrefillOracle& ref);

// The test matrix of the CPU tests and of `mamba2ssd check`: every feature and slot rule, request
// lengths 0, 1 and mixed, intermediate states (requests shorter than k, of k, of several k, pads,
// max_intermediate below the boundaries), on each cache dtype (x, B, C, y in the cache's dtype
// unless the case says otherwise); seeds count up from first_seed.
std::vector<PrefillConfig> prefill_test_matrix(uint64_t first_seed);

}  // namespace mamba2ssd::testing
