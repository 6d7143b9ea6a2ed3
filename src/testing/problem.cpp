#include "testing/problem.h"

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "common/host_dtype.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

// Layout of one problem: each tensor's element strides and its buffer length in elements.
// Strided problems pad dims 1 and 2 so no stride is the contiguous one (last dim stays contiguous).
struct Layout {
  Strides4 x, B, C, z, y, init, final_, varlen;
  Strides3 dt;
  Strides2 seq_idx;
};

// Sizes and strides arithmetic, checked: a product or sum past 2^63 - 1 is an Error naming what was
// being computed (validate_sizes has bounded every size product by 2^56 before, so this is a second
// line that only padding could reach).
int64_t mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(std::string("ProblemConfig: ") + what + " passes 2^63 - 1");
  return r;
}
int64_t add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw Error(std::string("ProblemConfig: ") + what + " passes 2^63 - 1");
  return r;
}

// Strided problems pad each tensor by its own multiple of 8 elements (16-byte pieces stay aligned),
// so that a kernel reading one tensor with another's strides fails the check; misaligned ones pad
// by one element more.
Strides4 strides4(const ProblemConfig& c, int64_t d1, int64_t d2, int64_t d3, int64_t pad_units, const char* name) {
  const int64_t pad = c.misaligned ? 8 * pad_units + 1 : c.strided ? 8 * pad_units : 0;
  const int64_t s2 = add(d3, pad, name), s1 = add(mul(d2, s2, name), pad, name);
  return {mul(d1, s1, name), s1, s2, 1};
}

Layout layout_of(const ProblemConfig& c) {
  Layout l;
  const int64_t L = c.seqlen, H = c.nheads, P = c.headdim, G = c.ngroups, N = c.dstate;
  l.x = strides4(c, L, H, P, 1, "x's strides");
  l.z = strides4(c, L, H, P, 2, "z's strides");
  l.y = strides4(c, L, H, P, 3, "y's strides");
  l.B = strides4(c, L, G, N, 1, "B's strides");
  l.C = strides4(c, L, G, N, 2, "C's strides");
  l.init = strides4(c, H, P, N, 1, "initial_states' strides");
  l.final_ = strides4(c, H, P, N, 2, "final_states' strides");
  l.varlen = strides4(c, H, P, N, 3, "varlen_states' strides");
  const int64_t dts1 = H + (c.strided ? 3 : 0);
  l.dt = {mul(L, dts1, "dt's strides"), dts1, 1};
  l.seq_idx = {L + (c.strided ? 5 : 0), 1};
  return l;
}

int64_t extent(int64_t d0, const Strides4& s, const char* name) { return mul(d0, s.s0, name); }

// Bytes of a buffer of `elems` elements, checked.
std::size_t byte_count(int64_t elems, std::size_t elem_size, const char* name) {
  return static_cast<std::size_t>(mul(elems, static_cast<int64_t>(elem_size), name));
}

std::vector<uint8_t> bytes(int64_t elems, std::size_t elem_size, const char* name) {
  return std::vector<uint8_t>(byte_count(elems, elem_size, name), 0);
}

// The config's own rules (beyond validate_sizes): what HostProblem needs to build it.
void check_config(const ProblemConfig& c) {
  validate_sizes(shape_params(c));
  if (!c.seqlens.empty()) {
    int64_t total = 0;
    for (int64_t len : c.seqlens) {
      if (len < 0) throw Error("ProblemConfig: a packed sequence length is negative: " + std::to_string(len));
      total = add(total, len, "the sum of seqlens");
    }
    if (c.batch != 1 || total != c.seqlen) throw Error("ProblemConfig: seqlens must sum to seqlen with batch 1");
    if (!c.cu_seqlens && !c.seq_idx) throw Error("ProblemConfig: packed sequences need cu_seqlens or seq_idx");
  }
  if (!std::isfinite(c.A_scale)) throw Error("ProblemConfig: A_scale must be finite, got " + std::to_string(c.A_scale));
}

// Each buffer HostProblem(c) allocates: name, element count, element size.
struct BufferSize {
  const char* name;
  int64_t elems;
  std::size_t elem_size;
};
std::vector<BufferSize> buffer_sizes(const ProblemConfig& c) {
  const Layout l = layout_of(c);
  const int64_t b = c.batch, H = c.nheads, P = c.headdim, S = static_cast<int64_t>(c.seqlens.size());
  const std::size_t es = dtype_size(c.dtype);
  std::vector<BufferSize> v = {
      {"x", extent(b, l.x, "x's extent"), es},
      {"B", extent(b, l.B, "B's extent"), es},
      {"C", extent(b, l.C, "C's extent"), es},
      {"dt", mul(b, l.dt.s0, "dt's extent"), dtype_size(c.dt_dtype)},
      {"A", H, 4},
      {"y", extent(b, l.y, "y's extent"), es},
  };
  if (c.z) v.push_back({"z", extent(b, l.z, "z's extent"), es});
  if (c.initial_states) v.push_back({"initial_states", extent(b, l.init, "initial_states' extent"), 4});
  if (c.D_layout != DLayout::kNone)
    v.push_back({"D", c.D_layout == DLayout::kPerHead ? H : mul(H, P, "D's extent"), 4});
  if (c.dt_bias) v.push_back({"dt_bias", H, 4});
  if (S > 0) {
    if (c.cu_seqlens) v.push_back({"cu_seqlens", S + 1, 8});
    if (c.seq_idx) v.push_back({"seq_idx", l.seq_idx.s0, 4});
    if (c.cu_seqlens && c.varlen_states) v.push_back({"varlen_states", extent(S, l.varlen, "varlen_states' extent"), 4});
  }
  if (c.final_states) v.push_back({"final_states", extent(b, l.final_, "final_states' extent"), 4});
  return v;
}

}  // namespace

std::string ProblemConfig::describe() const {
  std::ostringstream os;
  os << "b" << batch << " L" << seqlen << " H" << nheads << " P" << headdim << " N" << dstate << " G"
     << ngroups << " Q" << chunk_size << " " << to_string(dtype);
  if (dt_dtype != DType::kF32) os << " dt:" << to_string(dt_dtype);
  if (D_layout == DLayout::kPerHead) os << " D[H]";
  if (D_layout == DLayout::kPerHeadDim) os << " D[H,P]";
  if (z) os << " z";
  if (dt_bias) os << " dt_bias";
  if (dt_softplus) os << " softplus";
  if (dt_min != 0.0f || !std::isinf(dt_max)) os << " limit(" << dt_min << "," << dt_max << ")";
  if (initial_states) os << " init";
  if (!seqlens.empty())
    os << " seqs" << seqlens.size() << (!cu_seqlens ? " seq_idx-only" : seq_idx ? "+seq_idx" : "")
       << (cu_seqlens && !varlen_states ? " no-varlen" : "");
  if (!final_states) os << " no-final";
  if (strided) os << " strided";
  if (misaligned) os << " misaligned";
  if (A_scale != 1.0f) os << " A*" << A_scale;
  if (cuda_path != CudaPath::kAuto) os << " path:" << to_string(cuda_path);
  if (fp32_math != Fp32Math::kTf32) os << " fp32_math:" << to_string(fp32_math);
  os << " seed" << seed;
  return os.str();
}

ForwardParams shape_params(const ProblemConfig& c) {
  ForwardParams p;
  p.batch = c.batch;
  p.seqlen = c.seqlen;
  p.nheads = c.nheads;
  p.headdim = c.headdim;
  p.ngroups = c.ngroups;
  p.dstate = c.dstate;
  p.chunk_size = c.chunk_size;
  p.cuda_path = c.cuda_path;
  p.fp32_math = c.fp32_math;
  p.dtype = c.dtype;
  p.dt_dtype = c.dt_dtype;
  p.D_layout = c.D_layout;
  p.dt_softplus = c.dt_softplus;
  p.dt_min = c.dt_min;
  p.dt_max = c.dt_max;
  p.nseqs = c.cu_seqlens ? static_cast<int64_t>(c.seqlens.size()) : 0;
  return p;
}

std::size_t host_bytes(const ProblemConfig& c) {
  check_config(c);
  int64_t total = 0;
  for (const BufferSize& s : buffer_sizes(c))
    total = add(total, static_cast<int64_t>(byte_count(s.elems, s.elem_size, s.name)), "the problem's bytes");
  return static_cast<std::size_t>(total);
}

HostProblem::HostProblem(const ProblemConfig& c) : config(c) {
  check_config(c);  // before any size below is formed
  const int64_t b = c.batch, L = c.seqlen, H = c.nheads, P = c.headdim, N = c.dstate;
  const Layout l = layout_of(c);
  // Every buffer, zero (padding stays zero), before any is filled: a size that does not fit fails
  // here, with nothing drawn.
  for (const BufferSize& s : buffer_sizes(c)) buffers[s.name] = bytes(s.elems, s.elem_size, s.name);
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto uniform = [&](float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); };

  // Fills a 4-d strided tensor of dtype t with draws; padding stays zero.
  auto fill4 = [&](const char* name, int64_t d0, int64_t d1, int64_t d2, int64_t d3, const Strides4& s,
                   DType t, const std::function<float()>& draw) {
    auto& buf = buffers.at(name);
    for (int64_t i0 = 0; i0 < d0; ++i0)
      for (int64_t i1 = 0; i1 < d1; ++i1)
        for (int64_t i2 = 0; i2 < d2; ++i2)
          for (int64_t i3 = 0; i3 < d3; ++i3)
            host::store(buf.data(), i0 * s.s0 + i1 * s.s1 + i2 * s.s2 + i3, t, draw());
  };
  auto gauss = [&] { return normal(rng); };

  fill4("x", b, L, H, P, l.x, c.dtype, gauss);
  fill4("B", b, L, c.ngroups, N, l.B, c.dtype, gauss);
  fill4("C", b, L, c.ngroups, N, l.C, c.dtype, gauss);
  if (c.z) fill4("z", b, L, H, P, l.z, c.dtype, gauss);
  if (c.initial_states)
    fill4("initial_states", b, H, P, N, l.init, DType::kF32, gauss);

  // dt: with softplus, raw values around softplus^-1 of typical steps; without, the steps themselves.
  {
    auto& buf = buffers.at("dt");
    for (int64_t i0 = 0; i0 < b; ++i0)
      for (int64_t t = 0; t < L; ++t)
        for (int64_t h = 0; h < H; ++h)
          host::store(buf.data(), i0 * l.dt.s0 + t * l.dt.s1 + h, c.dt_dtype,
                      c.dt_softplus ? uniform(-6.0f, -1.0f) : uniform(0.002f, 0.1f));
  }
  // A in [-4, -0.25] (times A_scale): decays from slow to fast across heads.
  {
    auto& buf = buffers.at("A");
    for (int64_t h = 0; h < H; ++h)
      reinterpret_cast<float*>(buf.data())[h] = -c.A_scale * std::exp(uniform(-1.4f, 1.4f));
  }
  if (c.D_layout != DLayout::kNone) {
    const int64_t n = c.D_layout == DLayout::kPerHead ? H : H * P;
    auto& buf = buffers.at("D");
    for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(buf.data())[i] = uniform(0.5f, 1.5f);
  }
  if (c.dt_bias) {
    auto& buf = buffers.at("dt_bias");
    for (int64_t h = 0; h < H; ++h) reinterpret_cast<float*>(buf.data())[h] = uniform(-0.05f, 0.05f);
  }
  if (!c.seqlens.empty()) {
    const int64_t S = static_cast<int64_t>(c.seqlens.size());
    std::vector<int64_t> cup(S + 1, 0);
    for (int64_t s = 0; s < S; ++s) cup[s + 1] = cup[s] + c.seqlens[s];
    if (c.cu_seqlens) std::memcpy(buffers.at("cu_seqlens").data(), cup.data(), cup.size() * sizeof(int64_t));
    if (c.seq_idx) {
      auto* sip = reinterpret_cast<int32_t*>(buffers.at("seq_idx").data());
      for (int64_t s = 0; s < S; ++s)
        for (int64_t t = cup[s]; t < cup[s + 1]; ++t) sip[t] = static_cast<int32_t>(s);
    }
  }
  poison_outputs();
}

bool HostProblem::is_output(const std::string& name) {
  return name == "y" || name == "final_states" || name == "varlen_states";
}

void HostProblem::poison_outputs() {
  for (auto& [name, buf] : buffers) {
    if (!is_output(name)) continue;
    const DType t = name == "y" ? config.dtype : DType::kF32;
    const std::size_t es = dtype_size(t);
    for (std::size_t i = 0; i < buf.size() / es; ++i)
      host::store(buf.data(), static_cast<int64_t>(i), t, std::numeric_limits<float>::quiet_NaN());
  }
}

ForwardParams HostProblem::params() const {
  return params([this](const std::string& name) -> void* {
    auto it = buffers.find(name);
    return it == buffers.end() ? nullptr : const_cast<uint8_t*>(it->second.data());
  });
}

ForwardParams HostProblem::params(const std::function<void*(const std::string&)>& ptr_of) const {
  const ProblemConfig& c = config;
  const Layout l = layout_of(c);
  auto has = [&](const char* name) { return buffers.count(name) > 0; };
  auto ptr = [&](const char* name) { return has(name) ? ptr_of(name) : nullptr; };
  ForwardParams p = shape_params(c);
  p.x = ptr("x"), p.x_stride = l.x;
  p.dt = ptr("dt"), p.dt_stride = l.dt;
  p.A = static_cast<const float*>(ptr("A"));
  p.B = ptr("B"), p.B_stride = l.B;
  p.C = ptr("C"), p.C_stride = l.C;
  p.D = static_cast<const float*>(ptr("D"));
  p.z = ptr("z"), p.z_stride = l.z;
  p.dt_bias = static_cast<const float*>(ptr("dt_bias"));
  p.initial_states = static_cast<const float*>(ptr("initial_states"));
  p.initial_states_stride = l.init;
  p.seq_idx = static_cast<const int32_t*>(ptr("seq_idx"));
  p.seq_idx_stride = l.seq_idx;
  p.cu_seqlens = static_cast<const int64_t*>(ptr("cu_seqlens"));
  p.nseqs = has("cu_seqlens") ? static_cast<int64_t>(c.seqlens.size()) : 0;
  p.y = ptr("y"), p.y_stride = l.y;
  p.final_states = static_cast<float*>(ptr("final_states"));
  p.final_states_stride = l.final_;
  p.varlen_states = static_cast<float*>(ptr("varlen_states"));
  p.varlen_states_stride = l.varlen;
  return p;
}

void ComparisonBuilder::add(double got, double want) { add(got, want, 0.0); }

void ComparisonBuilder::add(double got, double want, double terms) {
  ++cmp_.count;
  if (!std::isfinite(got)) {
    ++cmp_.nonfinite;
    return;
  }
  const double e = got - want;
  err2_ += e * e;
  ref2_ += std::max(want * want, terms * terms);
  cmp_.max_abs = std::max(cmp_.max_abs, std::abs(e));
}

Comparison ComparisonBuilder::done(double tolerance) {
  cmp_.rel_l2 = ref2_ > 0.0 ? std::sqrt(err2_ / ref2_) : std::sqrt(err2_);
  cmp_.tolerance = tolerance;
  return cmp_;
}

reference::Result oracle(const HostProblem& problem, const reference::Slice& slice) {
  return reference::run(problem.params(), slice);
}

std::vector<Comparison> compare_with(const HostProblem& problem,
                                     const std::map<std::string, std::vector<uint8_t>>& out,
                                     const reference::Result& ref) {
  const ProblemConfig& c = problem.config;
  const Layout l = layout_of(c);
  const reference::Slice& s = ref.slice;
  const int64_t P = c.headdim, N = c.dstate;
  const double tol = rel_l2_tolerance(c.dtype, c.fp32_math);

  std::vector<Comparison> result;

  {
    ComparisonBuilder acc("y");
    const uint8_t* y = out.at("y").data();
    for (int64_t b = 0; b < ref.nb; ++b)
      for (int64_t t = 0; t < ref.nt; ++t)
        for (int64_t h = 0; h < ref.nh; ++h)
          for (int64_t i = 0; i < P; ++i) {
            const int64_t off = (b + s.batch_begin) * l.y.s0 + (t + s.token_begin) * l.y.s1 +
                                (h + s.head_begin) * l.y.s2 + i;
            acc.add(host::load(y, off, c.dtype), ref.y[((b * ref.nt + t) * ref.nh + h) * P + i]);
          }
    result.push_back(acc.done(tol));
  }
  auto states = [&](const char* name, const Strides4& st, const std::vector<double>& want, int64_t n0,
                    int64_t first) {
    auto it = out.find(name);
    if (it == out.end()) return;
    ComparisonBuilder acc(name);
    const float* got = reinterpret_cast<const float*>(it->second.data());
    for (int64_t i = 0; i < n0; ++i)
      for (int64_t h = 0; h < ref.nh; ++h)
        for (int64_t pi = 0; pi < P; ++pi)
          for (int64_t n = 0; n < N; ++n)
            acc.add(got[(i + first) * st.s0 + (h + s.head_begin) * st.s1 + pi * st.s2 + n],
                    want[((i * ref.nh + h) * P + pi) * N + n]);
    result.push_back(acc.done(tol));
  };
  if (c.final_states) states("final_states", l.final_, ref.final_states, ref.nb, s.batch_begin);
  if (!c.seqlens.empty() && c.cu_seqlens && c.varlen_states)
    states("varlen_states", l.varlen, ref.varlen_states, ref.nseqs, 0);
  return result;
}

std::vector<Comparison> compare_with_oracle(const HostProblem& problem,
                                            const std::map<std::string, std::vector<uint8_t>>& out,
                                            const reference::Slice& slice) {
  return compare_with(problem, out, oracle(problem, slice));
}

}  // namespace mamba2ssd::testing
