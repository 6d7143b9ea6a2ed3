#include "testing/backward_problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include "common/host_dtype.h"
#include "testing/tolerance.h"

namespace mamba2ssd::testing {
namespace {

constexpr int64_t kFusedPad = 8;  // elements after dt in each row of the fused buffer

// Row-major strides of [d0, d1, d2, d3], with dims 1 and 2 padded by a multiple of 8 elements (each
// tensor its own multiple, so that reading one with another's strides fails the check).
std::array<int64_t, 4> strides_of(const std::array<int64_t, 4>& size, int64_t pad_units) {
  const int64_t pad = 8 * pad_units;
  const int64_t s2 = size[3] + pad, s1 = size[2] * s2 + pad;
  return {size[1] * s1, s1, s2, 1};
}

int64_t elements(const GradView& v) {  // buffer length the view needs, from its offset
  int64_t last = v.offset;
  for (int i = 0; i < 4; ++i) last += (v.size[i] - 1) * v.stride[i];
  return last + 1;
}

// Element offsets of a view, in row-major order of its dims.
template <typename F>
void for_each_element(const GradView& v, F&& f) {
  for (int64_t i = 0; i < v.size[0]; ++i)
    for (int64_t j = 0; j < v.size[1]; ++j)
      for (int64_t k = 0; k < v.size[2]; ++k)
        for (int64_t l = 0; l < v.size[3]; ++l)
          f(v.offset + i * v.stride[0] + j * v.stride[1] + k * v.stride[2] + l * v.stride[3]);
}

Strides4 strides4(const GradView& v) { return {v.stride[0], v.stride[1], v.stride[2], v.stride[3]}; }

}  // namespace

const char* to_string(GradLayout l) {
  switch (l) {
    case GradLayout::kContiguous: return "contiguous";
    case GradLayout::kPadded: return "padded";
    case GradLayout::kFused: return "fused";
  }
  return "unknown";
}

BackwardProblem::BackwardProblem(const ProblemConfig& c, GradLayout grad_layout) : forward(c), layout(grad_layout) {
  const int64_t b = c.batch, L = c.seqlen, H = c.nheads, P = c.headdim, G = c.ngroups, N = c.dstate;
  const int64_t S = static_cast<int64_t>(c.seqlens.size());
  const bool padded = layout != GradLayout::kContiguous;

  // A tensor in a buffer of its own: contiguous, or padded unless the API wants it contiguous.
  auto own = [&](const std::string& name, std::array<int64_t, 4> size, DType t, int64_t pad_units,
                 bool may_pad = true) {
    GradView v;
    v.buffer = name, v.size = size, v.dtype = t;
    v.stride = strides_of(size, padded && may_pad ? pad_units : 0);
    buffers[name].assign(elements(v) * dtype_size(t), 0);
    return v;
  };

  // Cotangents, drawn from the seed.
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 777);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](const GradView& v) {
    for_each_element(v, [&](int64_t at) { host::store(buffers.at(v.buffer).data(), at, v.dtype, normal(rng)); });
  };
  cotangents["dout"] = own("dout", {b, L, H, P}, c.dtype, 1);
  if (c.final_states) cotangents["dfinal_states"] = own("dfinal_states", {b, H, P, N}, DType::kF32, 2);
  if (S > 0 && c.varlen_states) cotangents["dvarlen_states"] = own("dvarlen_states", {S, H, P, N}, DType::kF32, 3);
  for (const auto& [name, v] : cotangents) fill(v);

  // Gradients.
  if (layout == GradLayout::kFused) {
    if (c.dt_dtype != c.dtype) throw std::invalid_argument("BackwardProblem: fused gradients need dt_dtype == dtype");
    const int64_t zw = c.z ? H * P : 0, W = zw + H * P + 2 * G * N + H + kFusedPad;
    auto slice = [&](int64_t col, std::array<int64_t, 4> size, std::array<int64_t, 4> stride) {
      GradView v;
      v.buffer = "dzxbcdt", v.offset = col, v.size = size, v.stride = stride, v.dtype = c.dtype;
      return v;
    };
    buffers["dzxbcdt"].assign(b * L * W * dtype_size(c.dtype), 0);
    if (c.z) gradients["dz"] = slice(0, {b, L, H, P}, {L * W, W, P, 1});
    gradients["dx"] = slice(zw, {b, L, H, P}, {L * W, W, P, 1});
    gradients["dB"] = slice(zw + H * P, {b, L, G, N}, {L * W, W, N, 1});
    gradients["dC"] = slice(zw + H * P + G * N, {b, L, G, N}, {L * W, W, N, 1});
    gradients["ddt"] = slice(zw + H * P + 2 * G * N, {1, b, L, H}, {0, L * W, W, 1});
  } else {
    gradients["dx"] = own("dx", {b, L, H, P}, c.dtype, 4);
    gradients["ddt"] = own("ddt", {1, b, L, H}, c.dt_dtype, 1);
    gradients["dB"] = own("dB", {b, L, G, N}, c.dtype, 2);
    gradients["dC"] = own("dC", {b, L, G, N}, c.dtype, 3);
    if (c.z) gradients["dz"] = own("dz", {b, L, H, P}, c.dtype, 5);
  }
  gradients["dA"] = own("dA", {1, 1, 1, H}, DType::kF32, 0, false);
  if (c.D_layout == DLayout::kPerHead) gradients["dD"] = own("dD", {1, 1, 1, H}, DType::kF32, 0, false);
  if (c.D_layout == DLayout::kPerHeadDim) gradients["dD"] = own("dD", {1, 1, H, P}, DType::kF32, 0, false);
  if (c.dt_bias) gradients["ddt_bias"] = own("ddt_bias", {1, 1, 1, H}, DType::kF32, 0, false);
  if (c.initial_states) gradients["dinitial_states"] = own("dinitial_states", {b, H, P, N}, DType::kF32, 6);
  poison_gradients();
}

std::string describe(const ProblemConfig& config, GradLayout layout) {
  return config.describe() + " grads:" + to_string(layout);
}

std::string BackwardProblem::describe() const { return testing::describe(forward.config, layout); }

void BackwardProblem::save_states() {
  const ForwardParams f = forward.params();
  buffers["saved_states"].assign(static_cast<std::size_t>(saved_states_elements(f)) * dtype_size(f.dtype), 0);
}

BackwardParams BackwardProblem::params() const {
  return params([this](const std::string& name) -> void* {
    auto it = buffers.find(name);
    if (it != buffers.end()) return const_cast<uint8_t*>(it->second.data());
    return const_cast<uint8_t*>(forward.buffers.at(name).data());
  });
}

BackwardParams BackwardProblem::params(const std::function<void*(const std::string&)>& ptr_of) const {
  auto ptr = [&](const GradView& v) -> void* {
    return static_cast<uint8_t*>(ptr_of(v.buffer)) + v.offset * dtype_size(v.dtype);
  };
  auto grad = [&](const char* name) -> const GradView* {
    auto it = gradients.find(name);
    return it == gradients.end() ? nullptr : &it->second;
  };
  BackwardParams p;
  p.fwd = forward.params(ptr_of);
  if (saves_states()) p.fwd.saved_states = ptr_of("saved_states");
  const GradView& dout = cotangents.at("dout");
  p.dout = ptr(dout), p.dout_stride = strides4(dout);
  if (cotangents.count("dfinal_states")) {
    const GradView& v = cotangents.at("dfinal_states");
    p.dfinal_states = static_cast<const float*>(ptr(v)), p.dfinal_states_stride = strides4(v);
  }
  if (cotangents.count("dvarlen_states")) {
    const GradView& v = cotangents.at("dvarlen_states");
    p.dvarlen_states = static_cast<const float*>(ptr(v)), p.dvarlen_states_stride = strides4(v);
  }
  p.dx = ptr(*grad("dx")), p.dx_stride = strides4(*grad("dx"));
  const GradView& ddt = *grad("ddt");
  p.ddt = ptr(ddt), p.ddt_stride = {ddt.stride[1], ddt.stride[2], ddt.stride[3]};
  p.dA = static_cast<float*>(ptr(*grad("dA")));
  p.dB = ptr(*grad("dB")), p.dB_stride = strides4(*grad("dB"));
  p.dC = ptr(*grad("dC")), p.dC_stride = strides4(*grad("dC"));
  if (grad("dD")) p.dD = static_cast<float*>(ptr(*grad("dD")));
  if (grad("dz")) p.dz = ptr(*grad("dz")), p.dz_stride = strides4(*grad("dz"));
  if (grad("ddt_bias")) p.ddt_bias = static_cast<float*>(ptr(*grad("ddt_bias")));
  if (const GradView* v = grad("dinitial_states"))
    p.dinitial_states = static_cast<float*>(ptr(*v)), p.dinitial_states_stride = strides4(*v);
  return p;
}

void BackwardProblem::poison_gradients() {
  for (const auto& [name, v] : gradients) {
    std::vector<uint8_t>& buf = buffers.at(v.buffer);
    const int64_t n = static_cast<int64_t>(buf.size() / dtype_size(v.dtype));
    for (int64_t i = 0; i < n; ++i) host::store(buf.data(), i, v.dtype, std::numeric_limits<float>::quiet_NaN());
  }
}

const std::vector<double>& oracle_gradient(const reference::Grads64& g, const std::string& name) {
  static const std::map<std::string, std::vector<double> reference::Grads64::*> members = {
      {"dx", &reference::Grads64::dx}, {"ddt", &reference::Grads64::ddt},
      {"dA", &reference::Grads64::dA}, {"dB", &reference::Grads64::dB},
      {"dC", &reference::Grads64::dC}, {"dD", &reference::Grads64::dD},
      {"dz", &reference::Grads64::dz}, {"ddt_bias", &reference::Grads64::ddt_bias},
      {"dinitial_states", &reference::Grads64::dinitial_states}};
  return g.*members.at(name);
}

bool sums_over_tokens(const std::string& name) { return name == "dA" || name == "ddt_bias" || name == "dD"; }

const std::vector<double>* oracle_terms(const reference::Grads64& g, const std::string& name) {
  if (name == "ddt") return &g.ddt_terms;
  if (name == "dA") return &g.dA_terms;
  if (name == "ddt_bias") return &g.ddt_bias_terms;
  if (name == "dD") return &g.dD_terms;
  return nullptr;
}

std::vector<double> read_gradient(const BackwardProblem& problem,
                                  const std::map<std::string, std::vector<uint8_t>>& out, const std::string& name) {
  const GradView& v = problem.gradients.at(name);
  const uint8_t* buf = out.at(v.buffer).data();
  std::vector<double> values;
  for_each_element(v, [&](int64_t at) { values.push_back(host::load(buf, at, v.dtype)); });
  return values;
}

reference::Grads64 backward_oracle(const BackwardProblem& problem) {
  return reference::run_backward(problem.params());
}

namespace {

// Index ranges [first, end) per dimension of a view.
using Box = std::array<std::pair<int64_t, int64_t>, 4>;

// The elements of a view in the box, row-major: dense in the oracle's order for the slice.
std::vector<double> read_box(const GradView& v, const uint8_t* buf, const Box& box) {
  std::vector<double> values;
  for (int64_t i = box[0].first; i < box[0].second; ++i)
    for (int64_t j = box[1].first; j < box[1].second; ++j)
      for (int64_t k = box[2].first; k < box[2].second; ++k)
        for (int64_t l = box[3].first; l < box[3].second; ++l)
          values.push_back(host::load(buf, v.offset + i * v.stride[0] + j * v.stride[1] + k * v.stride[2] +
                                               l * v.stride[3], v.dtype));
  return values;
}

// The box of a cotangent's or gradient's view (its 4-d shape as BackwardProblem lays it out) that a
// resolved slice covers: batch rows, heads, and for dB and dC the heads' groups.
Box slice_box(const std::string& name, const GradView& v, const ProblemConfig& c, const reference::Slice& s) {
  const std::pair<int64_t, int64_t> rows = {s.batch_begin, s.batch_end}, heads = {s.head_begin, s.head_end};
  const int64_t per_group = c.nheads / c.ngroups;
  const std::pair<int64_t, int64_t> groups = {s.head_begin / per_group, (s.head_end + per_group - 1) / per_group};
  auto all = [&](int d) { return std::pair<int64_t, int64_t>{0, v.size[d]}; };
  if (name == "dout" || name == "dx" || name == "dz") return {rows, all(1), heads, all(3)};
  if (name == "dB" || name == "dC") return {rows, all(1), groups, all(3)};
  if (name == "ddt") return {all(0), rows, all(2), heads};                        // {1, b, L, H}
  if (name == "dA" || name == "ddt_bias") return {all(0), all(1), all(2), heads};  // {1, 1, 1, H}
  if (name == "dD")
    return c.D_layout == DLayout::kPerHeadDim ? Box{all(0), all(1), heads, all(3)} : Box{all(0), all(1), all(2), heads};
  if (name == "dfinal_states" || name == "dinitial_states") return {rows, heads, all(2), all(3)};
  if (name == "dvarlen_states") return {all(0), heads, all(2), all(3)};
  throw std::invalid_argument("slice_box: unknown tensor " + name);
}

}  // namespace

reference::Slice backward_slice(const ProblemConfig& c, reference::Slice s) {
  if (s.batch_end < 0) s.batch_end = c.batch;
  if (s.head_end < 0) s.head_end = c.nheads;
  if (s.token_end < 0) s.token_end = c.seqlen;
  if (s.token_begin != 0 || s.token_end != c.seqlen)
    throw Error("backward_slice: the backward's check needs every token (the adjoint runs from the last one)");
  return s;
}

void restrict_cotangents(BackwardProblem& problem, const reference::Slice& slice) {
  const ProblemConfig& c = problem.forward.config;
  const reference::Slice s = backward_slice(c, slice);
  for (const auto& [name, v] : problem.cotangents) {
    const Box keep = slice_box(name, v, c, s);
    uint8_t* buf = problem.buffers.at(v.buffer).data();
    for (int64_t i = 0; i < v.size[0]; ++i)
      for (int64_t j = 0; j < v.size[1]; ++j)
        for (int64_t k = 0; k < v.size[2]; ++k)
          for (int64_t l = 0; l < v.size[3]; ++l) {
            const int64_t at[4] = {i, j, k, l};
            bool inside = true;
            for (int d = 0; d < 4; ++d) inside = inside && at[d] >= keep[d].first && at[d] < keep[d].second;
            if (!inside)
              host::store(buf, v.offset + i * v.stride[0] + j * v.stride[1] + k * v.stride[2] + l * v.stride[3],
                          v.dtype, 0.0f);
          }
  }
}

reference::Grads64 backward_oracle(const BackwardProblem& problem, const reference::Slice& slice) {
  const ProblemConfig& c = problem.forward.config;
  const reference::Slice s = backward_slice(c, slice);
  const BackwardParams p = problem.params();
  auto cotangent = [&](const char* name) {
    auto it = problem.cotangents.find(name);
    if (it == problem.cotangents.end()) return std::vector<double>{};
    return read_box(it->second, problem.buffers.at(it->second.buffer).data(), slice_box(name, it->second, c, s));
  };
  return reference::backward64(reference::load_inputs(p.fwd, s), cotangent("dout"), cotangent("dfinal_states"),
                               cotangent("dvarlen_states"));
}

std::vector<Comparison> compare_gradients(const BackwardProblem& problem,
                                          const std::map<std::string, std::vector<uint8_t>>& out,
                                          const reference::Grads64& ref) {
  return compare_gradients(problem, out, ref, {});
}

std::vector<Comparison> compare_gradients(const BackwardProblem& problem,
                                          const std::map<std::string, std::vector<uint8_t>>& out,
                                          const reference::Grads64& ref, const reference::Slice& slice) {
  const ProblemConfig& c = problem.forward.config;
  const reference::Slice s = backward_slice(c, slice);
  const DType dtype = c.dtype;
  std::vector<Comparison> result;
  for (const auto& [name, v] : problem.gradients) {
    const std::vector<double>& want = oracle_gradient(ref, name);
    const std::vector<double> got = read_box(v, out.at(v.buffer).data(), slice_box(name, v, c, s));
    const std::vector<double>* terms = oracle_terms(ref, name);  // or null
    ComparisonBuilder acc(name);
    for (std::size_t i = 0; i < got.size(); ++i)
      acc.add(got[i], i < want.size() ? want[i] : std::numeric_limits<double>::quiet_NaN(),
              terms && i < terms->size() ? (*terms)[i] : 0.0);
    const bool sum = sums_over_tokens(name);
    auto bar = [sum](DType t) { return sum ? backward_sum_rel_l2_tolerance(t) : backward_rel_l2_tolerance(t); };
    Comparison cmp = acc.done(std::max(bar(dtype), bar(v.dtype)));
    if (got.size() != want.size()) cmp.nonfinite = cmp.count;  // shapes disagree: fail loudly
    result.push_back(cmp);
  }
  return result;
}

int64_t written_outside_gradients(const BackwardProblem& problem,
                                  const std::map<std::string, std::vector<uint8_t>>& out) {
  std::map<std::string, std::vector<bool>> inside;
  std::map<std::string, DType> dtypes;
  for (const auto& [name, v] : problem.gradients) {
    std::vector<bool>& mask = inside[v.buffer];
    mask.resize(out.at(v.buffer).size() / dtype_size(v.dtype));
    for_each_element(v, [&](int64_t off) { mask[off] = true; });
    dtypes[v.buffer] = v.dtype;
  }
  int64_t written = 0;
  for (const auto& [buffer, mask] : inside)
    for (std::size_t i = 0; i < mask.size(); ++i)
      written += !mask[i] && std::isfinite(host::load(out.at(buffer).data(), static_cast<int64_t>(i), dtypes[buffer]));
  return written;
}

}  // namespace mamba2ssd::testing
