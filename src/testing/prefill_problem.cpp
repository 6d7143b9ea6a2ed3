#include "testing/prefill_problem.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "common/host_dtype.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {

int64_t PrefillConfig::tokens() const { return std::accumulate(seqlens.begin(), seqlens.end(), int64_t{0}); }

int64_t PrefillConfig::intermediates() const {
  if (state_every <= 0) return 0;
  if (max_intermediate > 0) return max_intermediate;
  const int64_t longest = seqlens.empty() ? 0 : *std::max_element(seqlens.begin(), seqlens.end());
  return std::max<int64_t>(1, longest / state_every);
}

ProblemConfig PrefillConfig::forward_config() const {
  ProblemConfig c;
  c.batch = 1, c.seqlen = tokens(), c.nheads = nheads, c.headdim = headdim, c.dstate = dstate, c.ngroups = ngroups;
  c.chunk_size = chunk_size, c.dtype = dtype, c.dt_dtype = dt_dtype, c.D_layout = D_layout;
  c.z = z, c.dt_bias = dt_bias, c.dt_softplus = dt_softplus, c.dt_min = dt_min, c.dt_max = dt_max;
  c.initial_states = false, c.final_states = false, c.varlen_states = false;  // the cache replaces them
  c.seqlens = seqlens, c.seq_idx = seq_idx, c.cu_seqlens = true;
  c.strided = strided, c.misaligned = misaligned, c.seed = seed;
  return c;
}

std::string PrefillConfig::describe() const {
  std::ostringstream os;
  os << "seqs[";
  for (std::size_t i = 0; i < seqlens.size(); ++i) os << (i ? "," : "") << seqlens[i];
  os << "] H" << nheads << " P" << headdim << " N" << dstate << " G" << ngroups << " " << to_string(dtype)
     << " state:" << to_string(state_dtype);
  if (dt_dtype != DType::kF32) os << " dt:" << to_string(dt_dtype);
  os << (D_layout == DLayout::kPerHead ? " D[H]" : D_layout == DLayout::kPerHeadDim ? " D[H,P]" : "");
  if (z) os << " z";
  if (dt_bias) os << " dt_bias";
  if (dt_softplus) os << " softplus";
  if (dt_min != 0.0f || dt_max != std::numeric_limits<float>::infinity()) os << " dt_limit(" << dt_min << "," << dt_max << ")";
  if (seq_idx) os << " seq_idx";
  if (strided) os << " strided";
  if (misaligned) os << " misaligned";
  if (odd_cache) os << " odd-cache";
  os << " slots" << cache_slots() << (has_initial_state ? "" : " all-read");
  if (pads) os << " pads" << pads << (pad_slot_id != -1 ? " pad_id" + std::to_string(pad_slot_id) : "");
  if (state_every) os << " every" << state_every << " M" << intermediates();
  os << " seed" << seed;
  return os.str();
}

HostPrefillProblem::HostPrefillProblem(const PrefillConfig& c) : config(c), fwd(c.forward_config()) {
  const int64_t S = c.requests(), H = c.nheads, P = c.headdim, N = c.dstate, nslots = c.cache_slots();
  // The cache: contiguous, or with padded rows (16 bytes' worth, so rows stay aligned), or rows of
  // odd length (no two adjacent elements in one access).
  const int64_t row = N + (c.odd_cache ? 1 : c.strided ? 16 / static_cast<int64_t>(dtype_size(c.state_dtype)) : 0);
  state_stride = {H * P * row, P * row, row, 1};
  initial_state.assign(nslots * state_stride.s0 * dtype_size(c.state_dtype), 0);

  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 4242);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // States of the size a long prefill leaves (|S| around 1); the padding stays zero.
  for (int64_t s = 0; s < nslots; ++s)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < N; ++n)
          host::store(initial_state.data(), s * state_stride.s0 + h * state_stride.s1 + i * state_stride.s2 + n,
                      c.state_dtype, normal(rng));
  // Slots: distinct, drawn from a permutation of the cache; `pads` requests get pad_slot_id.
  std::vector<int32_t> perm(nslots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  slots.resize(S);
  for (int64_t s = 0; s < S; ++s) slots[s] = perm[s % nslots];
  std::vector<int64_t> order(S);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t i = 0; i < std::min(S, c.pads); ++i) slots[order[i]] = c.pad_slot_id;
  if (!c.slots.empty()) slots = c.slots;
  if (static_cast<int64_t>(slots.size()) != S) throw Error("PrefillConfig: slots must hold one entry a request");
  if (c.has_initial_state) {
    has_initial_state.resize(S);
    for (int64_t s = 0; s < S; ++s) has_initial_state[s] = static_cast<uint8_t>(rng() & 1);
    if (!c.initial.empty()) has_initial_state = c.initial;
    if (static_cast<int64_t>(has_initial_state.size()) != S)
      throw Error("PrefillConfig: initial must hold one entry a request");
  }
  // Intermediate slots: the permutation's next entries (distinct from the requests' and from each
  // other), about a quarter of them pad_slot_id (no store).
  const int64_t M = c.intermediates();
  for (int64_t e = 0; e < S * M; ++e)
    intermediate_slots.push_back(rng() % 4 == 0 ? c.pad_slot_id : perm[(S + e) % nslots]);
  if (!c.intermediate_slots.empty()) intermediate_slots = c.intermediate_slots;
  if (static_cast<int64_t>(intermediate_slots.size()) != S * M)
    throw Error("PrefillConfig: intermediate_slots must hold max_intermediate entries a request");
  for (int32_t slot : stored_intermediate_slots())
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < N; ++n)
          host::store(initial_state.data(), slot * state_stride.s0 + h * state_stride.s1 + i * state_stride.s2 + n,
                      c.state_dtype, std::numeric_limits<float>::quiet_NaN());
  reset();
}

std::vector<int32_t> HostPrefillProblem::stored_intermediate_slots() const {
  const PrefillConfig& c = config;
  const int64_t M = c.intermediates();
  std::vector<int32_t> stored;
  for (int64_t s = 0; M > 0 && s < c.requests(); ++s) {
    if (slots[s] == c.pad_slot_id) continue;  // a pad stores nothing
    for (int64_t m = 0; m < std::min(M, c.seqlens[s] / c.state_every); ++m) {
      const int32_t slot = intermediate_slots[s * M + m];
      if (slot != c.pad_slot_id && slot != slots[s]) stored.push_back(slot);
    }
  }
  return stored;
}

PrefillParams HostPrefillProblem::params() {
  PrefillParams p;
  p.fwd = fwd.params();
  p.state = state.data(), p.state_stride = state_stride, p.state_dtype = config.state_dtype;
  p.nslots = config.cache_slots();
  p.slots = slots.data();
  p.has_initial_state = has_initial_state.empty() ? nullptr : has_initial_state.data();
  p.pad_slot_id = config.pad_slot_id;
  p.state_every = config.state_every;
  p.intermediate_slots = intermediate_slots.empty() ? nullptr : intermediate_slots.data();
  p.max_intermediate = config.intermediates();
  return p;
}

void HostPrefillProblem::reset() {
  fwd.poison_outputs();
  state = initial_state;
}

PrefillOracle prefill_oracle(const HostPrefillProblem& problem) {
  HostPrefillProblem copy = problem;
  copy.reset();
  prefill_reference(copy.params());
  return {copy.fwd.buffers.at("y"), copy.state};
}

std::vector<Comparison> compare_prefill(const HostPrefillProblem& problem, const PrefillOracle& ref) {
  const PrefillConfig& c = problem.config;
  const double tol = prefill_rel_l2_tolerance(c.dtype, c.state_dtype);
  const uint8_t* y = problem.fwd.buffers.at("y").data();

  ComparisonBuilder ys("y"), stored("state"), intermediate("intermediate"), kept("state (kept)");
  for_each_y(problem, [&](int64_t, int64_t, int64_t, int64_t off) {
    ys.add(host::load(y, off, c.dtype), host::load(ref.y.data(), off, c.dtype));
  });
  std::set<int32_t> written;
  for (int32_t s : problem.slots)
    if (s != c.pad_slot_id) written.insert(s);
  const std::vector<int32_t> boundary_slots = problem.stored_intermediate_slots();
  const std::set<int32_t> boundary(boundary_slots.begin(), boundary_slots.end());
  for_each_cache(problem, [&](int64_t slot, int64_t, int64_t, int64_t, int64_t off) {
    const double got = host::load(problem.state.data(), off, c.state_dtype);
    if (written.count(static_cast<int32_t>(slot)))
      stored.add(got, host::load(ref.state.data(), off, c.state_dtype));
    else if (boundary.count(static_cast<int32_t>(slot)))
      intermediate.add(got, host::load(ref.state.data(), off, c.state_dtype));
    else
      kept.add(got, host::load(problem.initial_state.data(), off, c.state_dtype));
  });
  std::vector<Comparison> cmps = {ys.done(tol), stored.done(tol)};
  if (c.state_every > 0) cmps.push_back(intermediate.done(tol));  // the stored states' bar
  cmps.push_back(kept.done(0.0));
  return cmps;
}

std::vector<PrefillConfig> prefill_test_matrix(uint64_t first_seed) {
  std::vector<std::function<void(PrefillConfig&)>> edits = {
      [](PrefillConfig&) {},
      [](PrefillConfig& c) { c.dtype = DType::kF32; },
      [](PrefillConfig& c) { c.dtype = DType::kF16; },
      [](PrefillConfig& c) { c.dtype = DType::kBF16; },
      [](PrefillConfig& c) { c.dt_dtype = DType::kBF16; },
      [](PrefillConfig& c) { c.headdim = 64, c.dstate = 128, c.ngroups = 1; },
      [](PrefillConfig& c) { c.headdim = 128, c.dstate = 16; },
      [](PrefillConfig& c) { c.dstate = 256, c.nheads = 2, c.ngroups = 1; },
      [](PrefillConfig& c) { c.ngroups = 4; },
      [](PrefillConfig& c) { c.D_layout = DLayout::kPerHeadDim; },
      [](PrefillConfig& c) { c.D_layout = DLayout::kNone; },
      [](PrefillConfig& c) { c.z = true; },
      [](PrefillConfig& c) { c.dt_bias = true, c.dt_softplus = true; },
      [](PrefillConfig& c) { c.dt_softplus = true, c.dt_min = 0.01f, c.dt_max = 0.1f; },
      [](PrefillConfig& c) { c.seqlens = {1, 1, 1, 1}; },
      [](PrefillConfig& c) { c.seqlens = {0, 200}; },                    // several chunks
      [](PrefillConfig& c) { c.seqlens = {9}; },                         // one request
      [](PrefillConfig& c) { c.seqlens = {0, 3, 0, 0, 4, 0}; },          // empty ones around
      [](PrefillConfig& c) { c.has_initial_state = false; },             // every request reads its slot
      [](PrefillConfig& c) { c.initial = {0, 0, 0, 0, 0}; },             // every request new
      [](PrefillConfig& c) { c.pads = 2; },
      [](PrefillConfig& c) { c.pads = 1, c.pad_slot_id = 3, c.slots = {3, 0, 1, 2, 4}; },  // a pad id inside the cache
      [](PrefillConfig& c) { c.nslots = 5; },                            // every slot used
      [](PrefillConfig& c) { c.seq_idx = true; },
      [](PrefillConfig& c) { c.strided = true, c.z = true; },
      [](PrefillConfig& c) { c.misaligned = true, c.D_layout = DLayout::kPerHeadDim; },
      [](PrefillConfig& c) {  // everything at once
        c.seqlens = {0, 65, 1, 0, 130, 2}, c.pads = 1, c.z = true, c.dt_bias = true, c.dt_softplus = true;
        c.dt_min = 0.001f, c.dt_max = 0.5f, c.D_layout = DLayout::kPerHeadDim, c.strided = true, c.seq_idx = true;
      },
      // Intermediate states: requests shorter than k, of exactly k, of several k, empty.
      [](PrefillConfig& c) { c.state_every = 64, c.seqlens = {0, 64, 200, 63, 128, 1}; },
      [](PrefillConfig& c) { c.state_every = 128, c.seqlens = {130, 256, 64, 300}, c.max_intermediate = 1; },
      [](PrefillConfig& c) { c.state_every = 64, c.seqlens = {70, 129, 5, 192}, c.pads = 2, c.has_initial_state = false; },
      [](PrefillConfig& c) {  // rows of odd length in every cache dtype: no pairs (the hopper path refuses them)
        c.dtype = DType::kBF16, c.odd_cache = true, c.state_every = 64, c.seqlens = {70, 129, 0, 192};
      },
      [](PrefillConfig& c) {  // everything at once, with intermediate states
        c.seqlens = {0, 65, 1, 0, 130, 2}, c.pads = 1, c.z = true, c.dt_bias = true, c.dt_softplus = true;
        c.D_layout = DLayout::kPerHeadDim, c.strided = true, c.seq_idx = true, c.state_every = 64;
      },
  };
  std::vector<PrefillConfig> v;
  uint64_t seed = first_seed;
  for (DType s : {DType::kF32, DType::kBF16, DType::kF16})
    for (auto& edit : edits) {
      PrefillConfig c;
      c.state_dtype = c.dtype = s;  // x, B, C, y in the cache's dtype, unless the edit says otherwise
      edit(c);
      c.seed = seed++;
      v.push_back(c);
    }
  return v;
}

}  // namespace mamba2ssd::testing
