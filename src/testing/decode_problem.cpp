#include "testing/decode_problem.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "common/host_dtype.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

// A [d0, d1, d2, d3] view; padded problems pad dims 1..3 by `pad` elements each.
Strides4 strides4(int64_t d1, int64_t d2, int64_t d3, int64_t pad) {
  const int64_t s2 = d3 + pad, s1 = d2 * s2 + pad;
  return {d1 * s1 + pad, s1, s2, 1};
}

std::vector<uint8_t> zeros(int64_t elems, DType t) { return std::vector<uint8_t>(elems * dtype_size(t), 0); }

}  // namespace

std::string DecodeConfig::describe() const {
  std::ostringstream os;
  os << "b" << batch << " T" << ntokens << " H" << nheads << " P" << headdim << " N" << dstate << " G" << ngroups
     << " " << to_string(dtype) << " state:" << to_string(state_dtype) << " slots" << slots();
  if (dt_dtype != DType::kF32) os << " dt:" << to_string(dt_dtype);
  if (D_layout == DLayout::kPerHead) os << " D[H]";
  if (D_layout == DLayout::kPerHeadDim) os << " D[H,P]";
  if (z) os << " z";
  if (dt_bias) os << " dt_bias";
  if (dt_softplus) os << " softplus";
  if (dt_min != 0.0f || !std::isinf(dt_max)) os << " limit(" << dt_min << "," << dt_max << ")";
  if (!indices) os << " no-indices";
  if (dst_indices) os << " dst";
  if (pads) os << " pads" << pads;
  if (pad_dsts) os << " pad-dsts" << pad_dsts;
  if (pad_slot_id != -1) os << " pad_id" << pad_slot_id;
  if (!read_slots.empty()) os << " read-slots-given";
  if (!dst_slots.empty()) os << " dst-slots-given";
  if (strided) os << " strided";
  if (misaligned) os << " misaligned";
  os << " seed" << seed;
  return os.str();
}

DecodeParams shape_params(const DecodeConfig& c) {
  DecodeParams p;
  p.batch = c.batch, p.ntokens = c.ntokens, p.nheads = c.nheads, p.headdim = c.headdim, p.ngroups = c.ngroups;
  p.dstate = c.dstate, p.nslots = c.slots();
  p.dtype = c.dtype, p.dt_dtype = c.dt_dtype, p.state_dtype = c.state_dtype;
  p.D_layout = c.D_layout, p.dt_softplus = c.dt_softplus, p.dt_min = c.dt_min, p.dt_max = c.dt_max;
  p.pad_slot_id = c.pad_slot_id;
  return p;
}

HostDecodeProblem::HostDecodeProblem(const DecodeConfig& c) : config(c) {
  const int64_t b = c.batch, T = c.ntokens, H = c.nheads, P = c.headdim, G = c.ngroups, N = c.dstate;
  const int64_t S = c.slots();
  const int64_t pad = c.strided || c.misaligned ? 3 : 0;
  x_stride = strides4(T, H, P, pad), z_stride = strides4(T, H, P, 2 * pad), out_stride = strides4(T, H, P, 3 * pad);
  B_stride = strides4(T, G, N, pad), C_stride = strides4(T, G, N, 2 * pad);
  dt_stride = {T * (H + pad) + pad, H + pad, 1};
  dst_stride = {T + pad, 1};
  // The cache: padded by 16 bytes' worth of elements (rows stay 16-byte aligned), or misaligned by
  // one element in its rows and its start.
  const int64_t kV = 16 / static_cast<int64_t>(dtype_size(c.state_dtype));
  state_stride = strides4(H, P, N, c.misaligned ? 1 : c.strided ? kV : 0);
  state_offset = c.misaligned ? 1 : 0;

  buffers["x"] = zeros(b * x_stride.s0, c.dtype);
  buffers["z"] = zeros(c.z ? b * z_stride.s0 : 0, c.dtype);
  buffers["out"] = zeros(b * out_stride.s0, c.dtype);
  buffers["B"] = zeros(b * B_stride.s0, c.dtype);
  buffers["C"] = zeros(b * C_stride.s0, c.dtype);
  buffers["dt"] = zeros(b * dt_stride.s0, c.dt_dtype);
  buffers["A"] = zeros(H, DType::kF32);
  buffers["state"] = zeros(state_offset + S * state_stride.s0, c.state_dtype);
  if (!c.z) buffers.erase("z");

  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 777);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto uniform = [&](float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); };
  auto fill4 = [&](const char* name, int64_t d0, int64_t d1, int64_t d2, int64_t d3, const Strides4& s, DType t,
                   int64_t offset, const std::function<float()>& draw) {
    uint8_t* buf = buffers.at(name).data();
    for (int64_t i0 = 0; i0 < d0; ++i0)
      for (int64_t i1 = 0; i1 < d1; ++i1)
        for (int64_t i2 = 0; i2 < d2; ++i2)
          for (int64_t i3 = 0; i3 < d3; ++i3) host::store(buf, offset + i0 * s.s0 + i1 * s.s1 + i2 * s.s2 + i3, t, draw());
  };
  auto gauss = [&] { return normal(rng); };
  fill4("x", b, T, H, P, x_stride, c.dtype, 0, gauss);
  fill4("B", b, T, G, N, B_stride, c.dtype, 0, gauss);
  fill4("C", b, T, G, N, C_stride, c.dtype, 0, gauss);
  if (c.z) fill4("z", b, T, H, P, z_stride, c.dtype, 0, gauss);
  // The cache: states of the size a long prefill leaves (|S| around 1).
  fill4("state", S, H, P, N, state_stride, c.state_dtype, state_offset, gauss);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        host::store(buffers["dt"].data(), i * dt_stride.s0 + t * dt_stride.s1 + h, c.dt_dtype,
                    c.dt_softplus ? uniform(-6.0f, 1.0f) : uniform(0.002f, 0.2f));
  for (int64_t h = 0; h < H; ++h) reinterpret_cast<float*>(buffers["A"].data())[h] = -std::exp(uniform(-1.4f, 1.4f));
  if (c.D_layout != DLayout::kNone) {
    const int64_t n = c.D_layout == DLayout::kPerHead ? H : H * P;
    buffers["D"] = zeros(n, DType::kF32);
    for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(buffers["D"].data())[i] = uniform(0.5f, 1.5f);
  }
  if (c.dt_bias) {
    buffers["dt_bias"] = zeros(H, DType::kF32);
    for (int64_t h = 0; h < H; ++h) reinterpret_cast<float*>(buffers["dt_bias"].data())[h] = uniform(-0.5f, 0.5f);
  }

  // Slots: a random permutation of the cache; request i reads perm[i] (slot i without indices), token
  // t of request i stores to perm[b + i T + t]: all distinct, so no two requests alias.
  std::vector<int32_t> perm(S);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  if (!c.indices) {  // request i reads slot i: perm starts 0..b-1, so the destinations are other slots
    std::stable_partition(perm.begin(), perm.end(), [&](int32_t slot) { return slot < b; });
    std::sort(perm.begin(), perm.begin() + std::min<int64_t>(b, S));
  }
  auto pick = [&](int64_t n, int64_t count) {  // `count` distinct indices in [0, n)
    std::vector<int64_t> v(n);
    std::iota(v.begin(), v.end(), 0);
    std::shuffle(v.begin(), v.end(), rng);
    v.resize(std::min(n, count));
    return v;
  };
  if (c.indices) {
    std::vector<int32_t> read(b);
    for (int64_t i = 0; i < b; ++i) read[i] = perm[i % S];
    for (int64_t i : pick(b, c.pads)) read[i] = c.pad_slot_id;
    if (!c.read_slots.empty()) read = c.read_slots;
    if (static_cast<int64_t>(read.size()) != b) throw Error("DecodeConfig: read_slots must hold batch entries");
    buffers["read"].resize(b * 4);
    std::memcpy(buffers["read"].data(), read.data(), b * 4);
  }
  if (c.dst_indices) {
    std::vector<int32_t> dst(b * T);
    for (int64_t i = 0; i < b * T; ++i) dst[i] = perm[(b + i) % S];
    for (int64_t i : pick(b * T, c.pad_dsts)) dst[i] = c.pad_slot_id;
    if (!c.dst_slots.empty()) dst = c.dst_slots;
    if (static_cast<int64_t>(dst.size()) != b * T) throw Error("DecodeConfig: dst_slots must hold batch * ntokens entries");
    buffers["dst"] = std::vector<uint8_t>(b * dst_stride.s0 * 4, 0xee);  // padding: garbage a kernel must not read
    for (int64_t i = 0; i < b; ++i)
      std::memcpy(buffers["dst"].data() + i * dst_stride.s0 * 4, dst.data() + i * T, T * 4);
  }
  initial_state = buffers["state"];
  poison_outputs();
}

DecodeParams HostDecodeProblem::params() {
  return params([this](const std::string& name) -> void* { return buffers.at(name).data(); });
}

DecodeParams HostDecodeProblem::params(const std::function<void*(const std::string&)>& ptr_of) const {
  auto ptr = [&](const char* name) { return buffers.count(name) ? ptr_of(name) : nullptr; };
  DecodeParams p = shape_params(config);
  p.state = static_cast<uint8_t*>(ptr_of("state")) + state_offset * dtype_size(config.state_dtype);
  p.state_stride = state_stride;
  p.x = ptr("x"), p.x_stride = x_stride;
  p.dt = ptr("dt"), p.dt_stride = dt_stride;
  p.A = static_cast<const float*>(ptr("A"));
  p.B = ptr("B"), p.B_stride = B_stride;
  p.C = ptr("C"), p.C_stride = C_stride;
  p.D = static_cast<const float*>(ptr("D"));
  p.z = ptr("z"), p.z_stride = z_stride;
  p.dt_bias = static_cast<const float*>(ptr("dt_bias"));
  p.state_batch_indices = static_cast<const int32_t*>(ptr("read"));
  p.dst_state_batch_indices = static_cast<const int32_t*>(ptr("dst"));
  p.dst_state_batch_indices_stride = dst_stride;
  p.out = ptr("out"), p.out_stride = out_stride;
  return p;
}

void HostDecodeProblem::poison_outputs() { std::fill(buffers["out"].begin(), buffers["out"].end(), 0xff); }
void HostDecodeProblem::reset_state() { buffers["state"] = initial_state; }

DecodeConfig decode_matrix_base() {
  DecodeConfig c;
  c.batch = 5, c.nheads = 4, c.headdim = 32, c.dstate = 32, c.ngroups = 2;
  return c;
}

std::vector<DecodeConfig> decode_test_matrix(uint64_t first_seed) {
  std::vector<std::function<void(DecodeConfig&)>> edits = {
      [](DecodeConfig&) {},
      [](DecodeConfig& c) { c.dtype = DType::kF32; },
      [](DecodeConfig& c) { c.dtype = DType::kF16; },
      [](DecodeConfig& c) { c.dtype = DType::kBF16; },
      [](DecodeConfig& c) { c.dt_dtype = DType::kBF16; },
      [](DecodeConfig& c) { c.dt_dtype = DType::kF16; },
      [](DecodeConfig& c) { c.headdim = 64, c.dstate = 128, c.ngroups = 1; },
      [](DecodeConfig& c) { c.headdim = 128, c.dstate = 16; },
      [](DecodeConfig& c) { c.dstate = 48; },
      [](DecodeConfig& c) { c.dstate = 256, c.nheads = 2, c.ngroups = 1; },
      [](DecodeConfig& c) { c.ngroups = 4; },
      [](DecodeConfig& c) { c.ngroups = 1; },
      [](DecodeConfig& c) { c.D_layout = DLayout::kPerHeadDim; },
      [](DecodeConfig& c) { c.D_layout = DLayout::kNone; },
      [](DecodeConfig& c) { c.z = true; },
      [](DecodeConfig& c) { c.dt_bias = true, c.dt_softplus = true; },
      [](DecodeConfig& c) { c.dt_softplus = true, c.dt_min = 0.01f, c.dt_max = 0.1f; },
      [](DecodeConfig& c) { c.dt_min = 0.05f, c.dt_max = 0.08f; },
      [](DecodeConfig& c) { c.pads = 2; },
      [](DecodeConfig& c) { c.pads = 1, c.pad_slot_id = 3; },  // a pad id inside the cache's range
      [](DecodeConfig& c) { c.indices = false; },
      [](DecodeConfig& c) { c.dst_indices = true; },
      [](DecodeConfig& c) { c.ntokens = 4; },                                      // last state in place
      [](DecodeConfig& c) { c.ntokens = 4, c.dst_indices = true; },                // every state kept
      [](DecodeConfig& c) { c.ntokens = 3, c.dst_indices = true, c.pad_dsts = 5, c.pads = 1; },
      [](DecodeConfig& c) { c.strided = true, c.z = true, c.dst_indices = true, c.ntokens = 2; },
      [](DecodeConfig& c) { c.misaligned = true, c.D_layout = DLayout::kPerHeadDim; },
      [](DecodeConfig& c) {  // everything at once
        c.ntokens = 3, c.dst_indices = true, c.pads = 1, c.pad_dsts = 2, c.z = true, c.dt_bias = true;
        c.dt_softplus = true, c.dt_min = 0.001f, c.dt_max = 0.5f, c.D_layout = DLayout::kPerHeadDim, c.strided = true;
      },
  };
  std::vector<DecodeConfig> v;
  uint64_t seed = first_seed;
  for (DType s : {DType::kF32, DType::kBF16, DType::kF16})
    for (auto& edit : edits) {
      DecodeConfig c = decode_matrix_base();
      c.state_dtype = c.dtype = s;  // x, B, C, out in the cache's dtype, unless the edit says otherwise
      edit(c);
      c.seed = seed++;
      v.push_back(c);
    }
  return v;
}

reference::DecodeResult decode_oracle(const HostDecodeProblem& problem, const reference::DecodeSlice& slice) {
  // The oracle reads the inputs and the cache as drawn (initial_state), whatever a backend did since.
  return reference::run_decode(problem.params([&](const std::string& name) -> void* {
                                 if (name == "state") return const_cast<uint8_t*>(problem.initial_state.data());
                                 return const_cast<uint8_t*>(problem.buffers.at(name).data());
                               }),
                               slice);
}

std::vector<Comparison> compare_decode(const HostDecodeProblem& problem,
                                       const std::map<std::string, std::vector<uint8_t>>& results,
                                       const reference::DecodeResult& ref) {
  const DecodeConfig& c = problem.config;
  const reference::DecodeSlice& s = ref.slice;
  const int64_t T = c.ntokens, P = c.headdim, N = c.dstate;
  const double tol = decode_rel_l2_tolerance(c.dtype, c.state_dtype);
  const uint8_t* out = results.at("out").data();
  const uint8_t* state = results.at("state").data();
  const Strides4& ss = problem.state_stride;
  auto state_off = [&](int64_t slot, int64_t h, int64_t p, int64_t n) {
    return problem.state_offset + slot * ss.s0 + h * ss.s1 + p * ss.s2 + n;
  };

  ComparisonBuilder run("out"), skipped("out (skipped)"), stored("state"), kept("state (kept)");
  for (int64_t bi = 0; bi < ref.nb; ++bi)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hi = 0; hi < ref.nh; ++hi)
        for (int64_t i = 0; i < P; ++i) {
          const int64_t b = bi + s.batch_begin, h = hi + s.head_begin;
          const float got = host::load(out, b * problem.out_stride.s0 + t * problem.out_stride.s1 +
                                                h * problem.out_stride.s2 + i, c.dtype);
          (ref.read[bi] < 0 ? skipped : run).add(got, ref.out[ref.out_at(bi, t, hi, i)]);
        }
  // Stored states: for each slot, the last (request, token) of the slice that stores to it.
  std::map<int32_t, std::pair<int64_t, int64_t>> last;
  for (int64_t bi = 0; bi < ref.nb; ++bi)
    for (int64_t t = 0; t < T; ++t)
      if (ref.dst[bi * T + t] >= 0) last[ref.dst[bi * T + t]] = {bi, t};
  for (auto [slot, who] : last)
    for (int64_t hi = 0; hi < ref.nh; ++hi) {
      const double* want = &ref.states[ref.state_at(who.first, who.second, hi)];
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < N; ++n)
          stored.add(host::load(state, state_off(slot, hi + s.head_begin, i, n), c.state_dtype), want[i * N + n]);
    }
  std::vector<Comparison> v = {run.done(tol), skipped.done(0.0), stored.done(tol)};
  if (ref.nb == c.batch && ref.nh == c.nheads) {
    for (int64_t slot = 0; slot < c.slots(); ++slot) {
      if (last.count(static_cast<int32_t>(slot))) continue;
      for (int64_t h = 0; h < c.nheads; ++h)
        for (int64_t i = 0; i < P; ++i)
          for (int64_t n = 0; n < N; ++n) {
            const int64_t off = state_off(slot, h, i, n);
            kept.add(host::load(state, off, c.state_dtype), host::load(problem.initial_state.data(), off, c.state_dtype));
          }
    }
    v.push_back(kept.done(0.0));
  }
  return v;
}

}  // namespace mamba2ssd::testing
