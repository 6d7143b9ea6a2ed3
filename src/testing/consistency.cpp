#include "testing/consistency.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#include "common/host_dtype.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

template <typename T>
T* at(T* base, int64_t elements, DType t) {
  using Byte = std::conditional_t<std::is_const_v<T>, const uint8_t, uint8_t>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) + elements * static_cast<int64_t>(dtype_size(t)));
}

void check_config(const ConsistencyConfig& c) {
  const ProblemConfig& p = c.problem;
  if (!p.seqlens.empty() || p.strided || p.misaligned || !p.final_states)
    throw Error("ConsistencyConfig: the problem must be one sequence per row, contiguous, with final states");
  if (c.split < 1 || c.split >= p.seqlen || c.decode_tokens < 1 || c.decode_tokens >= p.seqlen)
    throw Error("ConsistencyConfig: split and decode_tokens must be in [1, L)");
  if (c.exact && c.packed) throw Error("ConsistencyConfig: exact and packed are two modes; choose one");
}

}  // namespace

std::string ConsistencyConfig::describe() const {
  return problem.describe() + " split " + std::to_string(split) + " k " + std::to_string(decode_tokens) +
         (exact ? " exact" : "") + (packed ? " packed" : "");
}

std::vector<ConsistencyConfig> consistency_matrix(uint64_t first_seed) {
  const std::vector<std::function<void(ConsistencyConfig&)>> edits = {
      [](ConsistencyConfig&) {},                                                 // L 300 = 4*64 + 44, split inside chunk 1
      [](ConsistencyConfig& c) { c.problem.dtype = DType::kF32; },
      [](ConsistencyConfig& c) { c.problem.dtype = DType::kF16, c.decode_tokens = 1; },
      [](ConsistencyConfig& c) { c.problem.seqlen = 256, c.split = 128; },       // on chunk boundaries
      [](ConsistencyConfig& c) { c.problem.seqlen = 130, c.split = 65, c.decode_tokens = 66; },  // decode a chunk and more
      [](ConsistencyConfig& c) { c.problem.seqlen = 2, c.split = 1, c.decode_tokens = 1; },
      [](ConsistencyConfig& c) { c.problem.initial_states = false; },            // a new request
      [](ConsistencyConfig& c) { c.problem.ngroups = 2; },
      [](ConsistencyConfig& c) { c.problem.ngroups = 4, c.problem.dtype = DType::kF32; },  // one head per group
      [](ConsistencyConfig& c) {
        c.problem.z = true, c.problem.D_layout = DLayout::kPerHeadDim, c.problem.dt_bias = true;
        c.problem.dt_softplus = true;
      },
      [](ConsistencyConfig& c) {
        c.problem.dt_bias = true, c.problem.dt_softplus = true, c.problem.dt_min = 0.001f, c.problem.dt_max = 0.1f;
        c.problem.D_layout = DLayout::kNone, c.problem.dt_dtype = DType::kBF16;
      },
      [](ConsistencyConfig& c) {
        c.problem.chunk_size = 128, c.problem.seqlen = 500, c.split = 333, c.decode_tokens = 7;
        c.problem.dstate = 128, c.problem.headdim = 32;
      },
      [](ConsistencyConfig& c) {  // everything at once
        ProblemConfig& p = c.problem;
        p.batch = 3, p.seqlen = 333, p.nheads = 6, p.ngroups = 3, p.dstate = 80, p.headdim = 128, p.dtype = DType::kF16;
        p.z = true, p.D_layout = DLayout::kPerHeadDim, p.dt_bias = true, p.dt_softplus = true;
        p.dt_min = 0.0005f, p.dt_max = 0.2f;
        c.split = 200, c.decode_tokens = 9;
      },
  };
  std::vector<ConsistencyConfig> configs;
  for (int mode = 0; mode < 3; ++mode)  // default, exact, packed
    for (std::size_t i = 0; i < edits.size(); ++i) {
      ConsistencyConfig c;  // the base: b2 L300 H4 P64 N32 G1 Q64 bf16 D[H], a cached prefix, split 100, k 5
      ProblemConfig& p = c.problem;
      p.batch = 2, p.seqlen = 300, p.nheads = 4, p.headdim = 64, p.dstate = 32, p.ngroups = 1, p.chunk_size = 64;
      p.initial_states = true;
      c.split = 100, c.decode_tokens = 5, c.exact = mode == 1, c.packed = mode == 2;
      edits[i](c);
      p.seed = first_seed + i;  // the same inputs in every mode
      configs.push_back(c);
    }
  return configs;
}

namespace {

// f's per-token tensors (x, dt, B, C, z, y) moved n steps along the axis whose stride stride_of
// picks (s0: batch rows, s1: tokens).
template <typename StrideOf>
void advance(ForwardParams& f, int64_t n, StrideOf stride_of) {
  f.x = at(f.x, n * stride_of(f.x_stride), f.dtype);
  f.dt = at(f.dt, n * stride_of(f.dt_stride), f.dt_dtype);
  f.B = at(f.B, n * stride_of(f.B_stride), f.dtype);
  f.C = at(f.C, n * stride_of(f.C_stride), f.dtype);
  if (f.z) f.z = at(f.z, n * stride_of(f.z_stride), f.dtype);
  f.y = at(f.y, n * stride_of(f.y_stride), f.dtype);
}

}  // namespace

ForwardParams forward_piece(const ForwardParams& w, int64_t t0, int64_t t1, const float* init, float* final,
                            const Strides4& stride) {
  ForwardParams f = w;
  f.seqlen = t1 - t0;
  advance(f, t0, [](const auto& s) { return s.s1; });
  f.initial_states = init, f.initial_states_stride = stride;
  f.final_states = final, f.final_states_stride = stride;
  return f;
}

DecodeParams decode_piece(const ForwardParams& w, int64_t t0, int64_t t1, float* cache, const Strides4& stride) {
  const ForwardParams f = forward_piece(w, t0, t1, nullptr, nullptr, stride);
  DecodeParams d;
  d.batch = w.batch, d.ntokens = t1 - t0, d.nheads = w.nheads, d.headdim = w.headdim, d.ngroups = w.ngroups;
  d.dstate = w.dstate, d.nslots = w.batch;  // request b reads and stores slot b
  d.dtype = w.dtype, d.dt_dtype = w.dt_dtype, d.state_dtype = DType::kF32;
  d.state = cache, d.state_stride = stride;
  d.x = f.x, d.x_stride = w.x_stride, d.dt = f.dt, d.dt_stride = w.dt_stride, d.A = w.A;
  d.B = f.B, d.B_stride = w.B_stride, d.C = f.C, d.C_stride = w.C_stride;
  d.D_layout = w.D_layout, d.D = w.D, d.z = f.z, d.z_stride = w.z_stride, d.dt_bias = w.dt_bias;
  d.dt_softplus = w.dt_softplus, d.dt_min = w.dt_min, d.dt_max = w.dt_max;
  d.out = f.y, d.out_stride = w.y_stride;
  return d;
}

PrefillParams prefill_piece(const ForwardParams& w, int64_t row, int64_t t0, int64_t t1, float* cache,
                            const Strides4& stride) {
  ForwardParams f = forward_piece(w, t0, t1, nullptr, nullptr, stride);
  f.batch = 1, f.nseqs = 1;
  advance(f, row, [](const auto& s) { return s.s0; });
  PrefillParams p;
  p.fwd = f;
  p.state = cache, p.state_stride = stride, p.state_dtype = DType::kF32, p.nslots = w.batch;
  return p;
}

std::vector<WayResult> run_ways(const ConsistencyConfig& c, const HostProblem& problem, const ForwardParams& w,
                                float* mid, const Executor& exec) {
  check_config(c);
  const int64_t L = c.problem.seqlen, split = c.split, k = c.decode_tokens;
  const std::size_t y_bytes = problem.buffers.at("y").size(), s_bytes = problem.buffers.at("final_states").size();
  float* final = w.final_states;
  const Strides4 st = w.final_states_stride;
  // The state the prefill starts from: a cached prefix (initial_states) or zeros (a new request). The
  // exact and packed modes read it from the cache: final_states, where the state stays.
  const float* init = w.initial_states;
  const bool cached = c.exact || c.packed;
  auto start_cache = [&] {
    if (init) exec.copy(final, init, s_bytes);
    else exec.fill(final, 0, s_bytes);
  };
  auto prefill = [&](int64_t t0, int64_t t1, const float* from, float* to) {
    if (c.exact) {
      exec.decode(decode_piece(w, t0, t1, to, st));  // `to` already holds the state: the cache
    } else if (c.packed) {  // each row a request of its own call (the rows' pieces are not adjacent)
      for (int64_t row = 0; row < w.batch; ++row)
        exec.prefill(prefill_piece(w, row, t0, t1, to, st), {0, t1 - t0},
                     {static_cast<int32_t>(row)});
    } else {
      exec.forward(forward_piece(w, t0, t1, from, to, st));
    }
  };
  auto way = [&](const std::string& name, const std::function<void()>& calls) {
    exec.fill(w.y, 0xff, y_bytes);  // NaN in every float type: a token nobody writes fails
    exec.fill(final, 0xff, s_bytes);
    exec.fill(mid, 0xff, s_bytes);
    if (cached) start_cache();
    calls();
    return WayResult{name, exec.download(w.y, y_bytes), exec.download(final, s_bytes)};
  };
  std::vector<WayResult> ways;
  ways.push_back(way("whole", [&] { prefill(0, L, init, final); }));
  ways.push_back(way("pieces", [&] {
    if (cached) {
      prefill(0, split, init, final), prefill(split, L, final, final);
    } else {
      prefill(0, split, init, mid), prefill(split, L, mid, final);
    }
  }));
  ways.push_back(way("decode", [&] {
    prefill(0, L - k, init, final);
    for (int64_t t = L - k; t < L; ++t) exec.decode(decode_piece(w, t, t + 1, final, st));
  }));
  return ways;
}

Executor host_executor(Backend backend, int threads) {
  Executor e;
  if (backend == Backend::kReference) {
    e.forward = [](const ForwardParams& p) { forward_reference(p); };
    e.decode = [](const DecodeParams& p) { decode_reference(p); };
  } else {
    e.forward = [threads](const ForwardParams& p) { forward_cpu(p, threads); };
    e.decode = [threads](const DecodeParams& p) { decode_cpu(p, threads); };
  }
  e.prefill = [backend, threads](PrefillParams p, const std::vector<int64_t>& cu, const std::vector<int32_t>& slots) {
    p.fwd.cu_seqlens = cu.data(), p.slots = slots.data();
    if (backend == Backend::kReference) prefill_reference(p);
    else prefill_cpu(p, threads);
  };
  e.copy = [](void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); };
  e.fill = [](void* dst, uint8_t byte, std::size_t n) { std::memset(dst, byte, n); };
  e.download = [](const void* src, std::size_t n) {
    const uint8_t* s = static_cast<const uint8_t*>(src);
    return std::vector<uint8_t>(s, s + n);
  };
  return e;
}

std::vector<WayResult> run_ways_host(const ConsistencyConfig& c, HostProblem& problem, Backend backend, int threads) {
  std::vector<float> mid(problem.buffers.at("final_states").size() / sizeof(float));
  return run_ways(c, problem, problem.params(), mid.data(), host_executor(backend, threads));
}

std::vector<Comparison> compare_ways(const ConsistencyConfig& c, const HostProblem& problem,
                                     const std::vector<WayResult>& ways) {
  const reference::Result ref = oracle(problem);
  const DType dt = c.problem.dtype;
  std::vector<Comparison> cmps;
  for (const WayResult& w : ways)
    for (Comparison cmp : compare_with(problem, {{"y", w.y}, {"final_states", w.state}}, ref)) {
      if (c.exact) cmp.tolerance = exact_prefill_rel_l2_tolerance(dt);
      cmp.name = w.name + ": " + cmp.name;
      cmps.push_back(cmp);
    }
  // Each way against the whole prefill: elementwise, over every element of the buffers (the problem
  // is contiguous, so every element is a token's or a state's).
  const WayResult& whole = ways.front();
  for (std::size_t i = 1; i < ways.size(); ++i)
    for (auto [name, t, got, want] : {std::tuple{"y", dt, &ways[i].y, &whole.y},
                                      std::tuple{"final_states", DType::kF32, &ways[i].state, &whole.state}}) {
      const std::string label = ways[i].name + " vs whole: " + name;
      const int64_t n = static_cast<int64_t>(got->size() / dtype_size(t));
      if (c.exact) {
        Comparison cmp;
        cmp.name = label + " (bits)", cmp.count = n, cmp.tolerance = 0.0;
        int64_t differ = 0;
        for (int64_t e = 0; e < n; ++e) {
          const double g = host::load(got->data(), e, t);
          if (!std::isfinite(g)) ++cmp.nonfinite;
          if (std::memcmp(got->data() + e * dtype_size(t), want->data() + e * dtype_size(t), dtype_size(t)) != 0) {
            ++differ;
            cmp.max_abs = std::max(cmp.max_abs, std::abs(g - host::load(want->data(), e, t)));
          }
        }
        cmp.rel_l2 = static_cast<double>(differ) / static_cast<double>(n);
        cmps.push_back(cmp);
      } else {
        ComparisonBuilder b(label);
        for (int64_t e = 0; e < n; ++e) b.add(host::load(got->data(), e, t), host::load(want->data(), e, t));
        cmps.push_back(b.done(consistency_rel_l2_tolerance(dt)));
      }
    }
  return cmps;
}

}  // namespace mamba2ssd::testing
