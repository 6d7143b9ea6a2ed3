// What the GPU suites share: the matrix of problems (every feature, dtype and size class, small
// enough for the fp64 oracle), its case names, and the check of comparisons. Used by the CUDA paths'
// tests and the tile backend's tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "api/internal.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

inline ProblemConfig matrix_base() {
  ProblemConfig c;
  c.batch = 2, c.seqlen = 333, c.nheads = 4, c.headdim = 64, c.dstate = 64, c.ngroups = 2;
  c.chunk_size = 128;
  c.dtype = DType::kBF16;
  return c;
}

// Seeds count up from first_seed. cu_seqlens_alone: include packed cases whose resets come from
// cu_seqlens without seq_idx (a backend may not support them).
inline std::vector<ProblemConfig> gpu_test_matrix(uint64_t first_seed, bool cu_seqlens_alone) {
  std::vector<ProblemConfig> v;
  uint64_t seed = first_seed;
  auto add = [&](ProblemConfig c) {
    c.seed = seed++;
    v.push_back(c);
  };
  const ProblemConfig base = matrix_base();
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t q : {64, 128, 256}) {
      ProblemConfig c = base;
      c.dtype = t, c.chunk_size = q;
      add(c);
    }
  for (int64_t P : {32, 64, 128})
    for (int64_t N : {16, 48, 128, 256}) {
      ProblemConfig c = base;
      c.headdim = P, c.dstate = N;
      add(c);
    }
  // Head dims no power of two (a multiple of 16: Nemotron-H's 80), in kernels built for 32, 64 or
  // 128 rows and on the walks' tiles of 64 (the last one partly past the head dim).
  for (int64_t P : {16, 48, 80, 112})
    for (int64_t N : {48, 128}) {
      ProblemConfig c = base;
      c.headdim = P, c.dstate = N;
      add(c);
    }
  for (int64_t L : {1, 63, 64, 65, 127, 129, 1000}) {
    ProblemConfig c = base;
    c.seqlen = L;
    add(c);
  }
  for (int64_t G : {1, 2, 4}) {
    ProblemConfig c = base;
    c.ngroups = G;
    add(c);
  }
  {
    ProblemConfig c = base;
    c.z = true, add(c);
    c = base, c.D_layout = DLayout::kPerHeadDim, add(c);
    c = base, c.D_layout = DLayout::kNone, add(c);
    c = base, c.dt_bias = true, c.dt_softplus = true, add(c);
    c = base, c.dt_min = 0.01f, c.dt_max = 0.05f, add(c);
    c = base, c.initial_states = true, add(c);
    c = base, c.final_states = false, add(c);
    c = base, c.strided = true, add(c);
    c = base, c.misaligned = true, c.z = true, c.initial_states = true, add(c);  // no 16-byte rows
    c = base, c.dt_dtype = DType::kBF16, add(c);
    c = base, c.dt_dtype = DType::kF16, add(c);
    c = base, c.dtype = DType::kF32, c.strided = true, c.z = true, add(c);
    c = base, c.dtype = DType::kF16, c.headdim = 128, c.dstate = 256, c.initial_states = true, add(c);
  }
  // Packed sequences: boundaries inside chunks, on chunk edges, empty and one-token sequences.
  for (bool with_seq_idx : {false, true}) {
    if (!with_seq_idx && !cu_seqlens_alone) continue;
    for (int64_t q : {64, 128}) {
      ProblemConfig c = base;
      c.batch = 1, c.seqlen = 700, c.chunk_size = q, c.seq_idx = with_seq_idx, c.initial_states = true;
      c.seqlens = {50, 78, 128, 0, 1, 200, 243};
      add(c);
    }
  }
  {  // the first sequence id is not 0: the initial state must not reach any token
    ProblemConfig c = base;
    c.batch = 1, c.seqlen = 300, c.seq_idx = true, c.initial_states = true;
    c.seqlens = {0, 120, 180};
    add(c);
  }
  // Everything at once, each dtype.
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    ProblemConfig c = base;
    c.batch = 1, c.seqlen = 517, c.dtype = t, c.z = true, c.D_layout = DLayout::kPerHeadDim;
    c.dt_bias = true, c.dt_softplus = true, c.dt_min = 0.001f, c.dt_max = 0.2f, c.initial_states = true;
    c.seqlens = {100, 17, 300, 100}, c.seq_idx = true, c.strided = true;
    add(c);
  }
  // Packed sequences without varlen_states: their resets, each state size class, and everything at
  // once in the 16-bit types.
  for (bool with_seq_idx : {false, true}) {
    if (!with_seq_idx && !cu_seqlens_alone) continue;
    for (int64_t N : {64, 128}) {
      ProblemConfig c = base;
      c.batch = 1, c.seqlen = 700, c.dstate = N, c.seq_idx = with_seq_idx, c.initial_states = true;
      c.seqlens = {50, 78, 128, 0, 1, 200, 243}, c.varlen_states = false;
      add(c);
    }
  }
  {  // long enough that, with two segments forced, the first pass reuses its stage barriers and
     // stops early at a sequence start several chunks before its segment ends
    ProblemConfig c = base;
    c.batch = 1, c.seqlen = 2300, c.dstate = 128, c.seq_idx = true, c.initial_states = true;
    c.seqlens = {900, 5, 1200, 195}, c.varlen_states = false;
    add(c);
  }
  for (DType t : {DType::kF16, DType::kBF16}) {
    ProblemConfig c = base;
    c.batch = 1, c.seqlen = 517, c.dtype = t, c.z = true, c.D_layout = DLayout::kPerHeadDim, c.dstate = 128;
    c.dt_bias = true, c.dt_softplus = true, c.dt_min = 0.001f, c.dt_max = 0.2f, c.initial_states = true;
    c.seqlens = {100, 17, 300, 100}, c.seq_idx = true, c.strided = true, c.varlen_states = false;
    add(c);
  }
  // State sizes above 128, which the Hopper path runs in two halves of 128 columns (192: zero
  // columns in the second half): features, packed sequences, the first pass stopping early, and
  // everything at once.
  {
    ProblemConfig c = base;
    c.dstate = 256, c.z = true, c.initial_states = true;
    add(c);
    c = base, c.batch = 1, c.seqlen = 700, c.dstate = 256, c.seq_idx = true, c.initial_states = true;
    c.seqlens = {50, 78, 128, 0, 1, 200, 243}, c.varlen_states = false;
    add(c);
    c = base, c.batch = 1, c.seqlen = 2300, c.dstate = 192, c.seq_idx = true, c.initial_states = true;
    c.seqlens = {900, 5, 1200, 195}, c.varlen_states = false;
    add(c);
    c = base, c.batch = 1, c.seqlen = 517, c.dtype = DType::kF16, c.z = true, c.D_layout = DLayout::kPerHeadDim;
    c.dstate = 256, c.dt_bias = true, c.dt_softplus = true, c.dt_min = 0.001f, c.dt_max = 0.2f;
    c.initial_states = true, c.seqlens = {100, 17, 300, 100}, c.seq_idx = true, c.strided = true;
    c.varlen_states = false;
    add(c);
    // 160: the second half's first TMA box only partly inside the state (added after the fifth
    // session's last GPU run).
    c = base, c.dstate = 160, c.seqlen = 1000, c.initial_states = true;
    add(c);
  }
  // Varlen states on the fused walks (the walk stores the state entering the chunk where a sequence
  // ends; varlen_states_sm80 finishes it): sequences over several chunks and segments, each state
  // size class; ends on chunk edges and just past them, empty and one-token sequences. The resets
  // come from cu_seqlens alone where the backend takes that (carried_sequence's search), else from
  // seq_idx too: the tile suite drops cu_seqlens, and without seq_idx its oracle's resets would be
  // nowhere in the call.
  for (int64_t N : {64, 128, 192, 256}) {
    ProblemConfig c = base;
    c.batch = 1, c.seqlen = 2300, c.dstate = N, c.initial_states = true, c.seq_idx = !cu_seqlens_alone;
    c.seqlens = {900, 5, 1200, 195};
    add(c);
  }
  {
    ProblemConfig c = base;
    c.batch = 1, c.seqlen = 640, c.dstate = 128, c.initial_states = true, c.seq_idx = !cu_seqlens_alone;
    c.seqlens = {128, 256, 128, 3, 125};
    add(c);
    c.seq_idx = true, c.dtype = DType::kF16, c.z = true, c.strided = true, c.dt_bias = true, c.dt_softplus = true;
    c.seqlens = {127, 1, 256, 129, 0, 127};
    add(c);
  }
  // Fast decays: with A 16 times larger, the fast heads' 64-token steps span more than 60 in
  // log2 (the Hopper main kernel's mask then takes its exact form) and the slow heads' do not.
  for (int64_t N : {128, 256}) {
    ProblemConfig c = base;
    c.seqlen = 1000, c.dstate = N, c.ngroups = 1, c.initial_states = true, c.A_scale = 16.0f;
    add(c);
  }
  // Head dims 32, 80 and 128 on the walks, which run a head as blocks of 64 head-dim columns (head
  // dim 32: one block, its other 32 columns zero; 80: a second block of 16): everything read or
  // written by head-dim column (x, y, z, D per (head, dim), initial and final states, the segments'
  // states), packed sequences with varlen states over several chunks, state size 256 (two
  // warpgroups on the Hopper path), fp32.
  for (int64_t P : {32, 80, 128}) {
    ProblemConfig c = base;
    c.headdim = P, c.seqlen = 1000, c.dstate = 128, c.z = true, c.D_layout = DLayout::kPerHeadDim;
    c.dt_bias = true, c.dt_softplus = true, c.initial_states = true, c.strided = true;
    add(c);
    c = base, c.headdim = P, c.batch = 1, c.seqlen = 2300, c.dstate = 64, c.initial_states = true, c.z = true;
    c.seq_idx = !cu_seqlens_alone, c.seqlens = {900, 5, 1200, 195};
    add(c);
    c = base, c.headdim = P, c.dtype = DType::kF16, c.seqlen = 700, c.dstate = 256, c.z = true;
    c.D_layout = DLayout::kPerHeadDim, c.initial_states = true;
    add(c);
    c = base, c.headdim = P, c.dtype = DType::kF32, c.seqlen = 1000, c.dstate = 128, c.z = true, c.initial_states = true;
    add(c);
  }
  // fp32 on the Hopper path's TF32 walk (state blocks of 64 rows): state 128 with varlen states
  // over several chunks and segments and everything else at once, fast decays (both mask forms in
  // one call), a state size with zero columns, the smallest state with head dim 32 (TMA boxes past
  // both; added after the twenty-seventh session's last GPU run).
  {
    ProblemConfig c = base;
    c.dtype = DType::kF32, c.batch = 1, c.seqlen = 2300, c.dstate = 128, c.initial_states = true, c.z = true;
    c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true, c.strided = true;
    c.seq_idx = !cu_seqlens_alone, c.seqlens = {900, 5, 1200, 195};
    add(c);
    c = base, c.dtype = DType::kF32, c.seqlen = 1000, c.dstate = 128, c.ngroups = 1, c.initial_states = true;
    c.A_scale = 16.0f;
    add(c);
    c = base, c.dtype = DType::kF32, c.seqlen = 700, c.dstate = 48, c.headdim = 128, c.ngroups = 4;
    add(c);
    c = base, c.dtype = DType::kF32, c.dstate = 16, c.headdim = 32;
    add(c);
  }
  return v;
}

// The fused paths' segments forced to n for the lifetime of the guard.
struct ForcedSegments {
  explicit ForcedSegments(int64_t n) { detail::set_fused_segments_for_testing(n); }
  ~ForcedSegments() { detail::set_fused_segments_for_testing(0); }
};

// True if the CUDA backend accepts the config on the given path (a path refuses what it does not
// cover with Error; PathsCoverTheHeadline checks that the refusals are not too broad).
inline bool path_applies(ProblemConfig config, CudaPath path) {
  config.cuda_path = path;
  try {
    cuda_workspace_bytes(HostProblem(config).params());
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Expects one comparison to pass, naming the case and the error if not (no printing).
inline void expect_pass(const Comparison& c, const std::string& what) {
  EXPECT_TRUE(c.pass()) << what << ": " << c.name << " rel L2 " << c.rel_l2 << " (tol " << c.tolerance << "), "
                        << c.nonfinite << " non-finite of " << c.count;
}

// Prints each comparison's error on one line, then expects every one to pass.
inline void expect_pass(const std::vector<Comparison>& cmps, const std::string& what) {
  std::printf("  %-100s", what.c_str());
  for (const Comparison& c : cmps) std::printf(" %s %.2e", c.name.c_str(), c.rel_l2);
  std::printf("\n");
  for (const Comparison& c : cmps) {
    EXPECT_TRUE(c.pass()) << what << ": " << c.name << " rel_l2 " << c.rel_l2 << " (tolerance " << c.tolerance
                          << "), max_abs " << c.max_abs << ", nonfinite " << c.nonfinite << " of " << c.count;
  }
}

// Parameterized cases are named case0, case1, ...; print_matrix lists what each number is.
inline std::string case_name(const ::testing::TestParamInfo<ProblemConfig>& info) {
  return "case" + std::to_string(info.index);
}
inline void print_matrix(const std::vector<ProblemConfig>& v) {
  for (std::size_t i = 0; i < v.size(); ++i) std::printf("  case%zu: %s\n", i, v[i].describe().c_str());
}

}  // namespace mamba2ssd::testing
