// The consistency rules (issue 19; docs/serving.md, "Consistency"): the same L tokens computed three
// ways, which must agree.
//   whole   one prefill of the L tokens (initial state -> final state)
//   pieces  a prefill of [0, split), then one of [split, L) from the first one's final state
//   decode  a prefill of [0, L - k) into an fp32 cache, then k decode steps of one token each
// By default a prefill is the forward (the chunked scan): the three agree within the tolerance
// table. In the exact mode a prefill is the decode step run over the piece's tokens (ntokens = its
// length): the same operations in the same order, so the three agree bit for bit. In the packed
// mode a prefill is the serving call (prefill_cpu, prefill_cuda): each batch row a request of its
// own packed call, read from and stored to its fp32 cache slot, as an engine would run it; the three
// agree within the tolerance table.
// Shared by the CPU tests, the GPU tests and `mamba2ssd check`; the calls take pointers in whatever
// memory the caller's Executor works in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

struct ConsistencyConfig {
  ProblemConfig problem;      // the L tokens; not packed, not strided; initial_states: a cached prefix
  int64_t split = 1;          // pieces: the boundary, in [1, L)
  int64_t decode_tokens = 1;  // k: the decode steps at the end, in [1, L)
  bool exact = false;         // the exact mode: every prefill is the decode step
  bool packed = false;        // the packed mode: every prefill is the packed prefill (not with exact)
  std::string describe() const;  // the problem, then "split 100 k 5 exact" (or "... packed")
};

// The test matrix of the CPU and GPU tests and of `mamba2ssd check`: lengths on and off the chunk,
// splits inside a chunk and on its boundary, bf16, fp16 and fp32, D, z, dt_bias and softplus,
// groups, with and without an initial state; each case in the default mode, then each in the exact
// one, then each in the packed one.
std::vector<ConsistencyConfig> consistency_matrix(uint64_t first_seed);

// A prefill of tokens [t0, t1) of `whole` (a forward call over L tokens; its y is written at the
// same tokens) from `init` (nullptr: zeros) into `final`, both [b, H, P, N] fp32 with `stride`.
ForwardParams forward_piece(const ForwardParams& whole, int64_t t0, int64_t t1, const float* init, float* final,
                            const Strides4& stride);
// The decode step over tokens [t0, t1) of `whole`, on `cache` (fp32, one slot per request, read and
// written in place, `stride`); out is whole's y at those tokens.
DecodeParams decode_piece(const ForwardParams& whole, int64_t t0, int64_t t1, float* cache, const Strides4& stride);
// The packed prefill of tokens [t0, t1) of batch row `row` of `whole` as one request, from and to
// slot `row` of `cache` (fp32, `stride`); its y is whole's y at those tokens. cu_seqlens and slots
// are left null: the Executor puts them where its backend reads them.
PrefillParams prefill_piece(const ForwardParams& whole, int64_t row, int64_t t0, int64_t t1, float* cache,
                            const Strides4& stride);

// How the calls run and where their memory is: the host or a GPU.
struct Executor {
  std::function<void(const ForwardParams&)> forward;
  std::function<void(const DecodeParams&)> decode;
  // A packed prefill whose cu_seqlens and slots are given here, in host memory.
  std::function<void(PrefillParams, const std::vector<int64_t>& cu_seqlens, const std::vector<int32_t>& slots)> prefill;
  std::function<void(void* dst, const void* src, std::size_t bytes)> copy;
  std::function<void(void* dst, uint8_t byte, std::size_t bytes)> fill;
  std::function<std::vector<uint8_t>(const void* src, std::size_t bytes)> download;
};

// One way's results, laid out as the problem's "y" and "final_states" buffers.
struct WayResult {
  std::string name;  // "whole", "pieces", "decode"
  std::vector<uint8_t> y, state;
};

// Runs the three ways on `whole` (problem's params in the executor's memory: its y and final_states
// are overwritten, poisoned with NaN before each way; `mid` is a scratch state as large as
// final_states) and returns what each left in y and final_states.
std::vector<WayResult> run_ways(const ConsistencyConfig& config, const HostProblem& problem, const ForwardParams& whole,
                                float* mid, const Executor& exec);

// The host's executor: forward_cpu, decode_cpu and prefill_cpu (or the reference backends) on host memory.
Executor host_executor(Backend backend, int threads = 0);

// Runs the ways on the host: forward_cpu, decode_cpu and prefill_cpu, or the reference backends.
std::vector<WayResult> run_ways_host(const ConsistencyConfig& config, HostProblem& problem, Backend backend,
                                     int threads = 0);

// The ways against the fp64 oracle ("whole: y", "pieces: final_states", ...; the forward's
// tolerance, the exact mode the decode step's) and against each other: by default "pieces vs whole:
// y" within consistency_rel_l2_tolerance, in the exact mode "... (bits)", which passes only if the
// bytes are identical (rel_l2 then holds the fraction of elements that differ).
std::vector<Comparison> compare_ways(const ConsistencyConfig& config, const HostProblem& problem,
                                     const std::vector<WayResult>& ways);

}  // namespace mamba2ssd::testing
