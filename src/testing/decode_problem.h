// Decode test problems: a description of one decode call (shape, features, slots), random inputs
// and a random state cache drawn from a seed, the DecodeParams that point at them, and the
// comparison of a backend's results (out and the cache) with the fp64 oracle. Shared by the C++
// tests, the GPU tests and the CLI.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"
#include "reference/decode.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

struct DecodeConfig {
  int64_t batch = 8, ntokens = 1, nheads = 8, headdim = 64, dstate = 128, ngroups = 1;
  int64_t nslots = 0;  // 0: batch * (ntokens + 1) + 3, room for distinct read and destination slots
  DType dtype = DType::kBF16;
  DType dt_dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  DLayout D_layout = DLayout::kPerHead;
  bool z = false, dt_bias = false, dt_softplus = false;
  float dt_min = 0.0f, dt_max = std::numeric_limits<float>::infinity();
  bool indices = true;       // pass state_batch_indices (random distinct slots); false: request b reads slot b
  bool dst_indices = false;  // pass dst_state_batch_indices: distinct slots, one per (request, token)
  int64_t pads = 0;          // requests whose read slot is pad_slot_id (needs indices)
  int64_t pad_dsts = 0;      // destination entries that are pad_slot_id (needs dst_indices)
  int32_t pad_slot_id = -1;
  // Explicit slots, replacing the drawn ones: read [b] (needs indices), dst [b * T] (needs dst_indices).
  std::vector<int32_t> read_slots, dst_slots;
  bool strided = false;     // every tensor a padded view (state rows stay 16-byte aligned)
  bool misaligned = false;  // the cache's rows padded by one element, off 16-byte alignment
  uint64_t seed = 0;

  int64_t slots() const { return nslots > 0 ? nslots : batch * (ntokens + 1) + 3; }
  std::string describe() const;  // one line: "b8 T1 H8 P64 N128 G1 bf16 state:fp32 D[H] ..."
  bool operator==(const DecodeConfig&) const = default;
};

// The config's sizes and options as DecodeParams without pointers or strides.
DecodeParams shape_params(const DecodeConfig& config);

// Host buffers of one decode problem, by name: "state" (the cache), "x", "dt", "A", "B", "C", "D",
// "z", "dt_bias", "read" (state_batch_indices), "dst", "out".
struct HostDecodeProblem {
  explicit HostDecodeProblem(const DecodeConfig& config);

  DecodeConfig config;
  std::map<std::string, std::vector<uint8_t>> buffers;
  std::vector<uint8_t> initial_state;  // the cache as drawn, before any call
  Strides4 x_stride, B_stride, C_stride, z_stride, out_stride, state_stride;
  Strides3 dt_stride;
  Strides2 dst_stride;
  int64_t state_offset = 0;  // elements before the cache's first (misaligned problems)

  DecodeParams params();  // into `buffers`
  DecodeParams params(const std::function<void*(const std::string&)>& ptr_of) const;
  void poison_outputs();  // out to NaN
  void reset_state();     // the cache back to initial_state
};

// The test matrix of the CPU and GPU tests and of `mamba2ssd check`: every feature and slot rule on its
// own, then all at once, for each cache dtype (x, B, C, out in the cache's dtype unless the case
// says otherwise), on small shapes around decode_matrix_base(); seeds count up from first_seed.
DecodeConfig decode_matrix_base();
std::vector<DecodeConfig> decode_test_matrix(uint64_t first_seed);

// The oracle's answer on a slice (the whole problem by default).
reference::DecodeResult decode_oracle(const HostDecodeProblem& problem, const reference::DecodeSlice& slice = {});

// A backend's results (buffers "out" and "state", laid out as the problem's) against the oracle:
//   "out"            rel L2 over the slice's requests that run (every token and head of the slice)
//   "out (skipped)"  the out rows of skipped requests: must be exactly zero (tolerance 0)
//   "state"          rel L2 over every stored state of the slice (the last store wins)
//   "state (kept)"   whole slice only: every cache element that no request stores to must keep its
//                    bits (tolerance 0)
// Tolerance: testing::decode_rel_l2_tolerance(dtype, state_dtype).
std::vector<Comparison> compare_decode(const HostDecodeProblem& problem,
                                       const std::map<std::string, std::vector<uint8_t>>& results,
                                       const reference::DecodeResult& ref);

}  // namespace mamba2ssd::testing
