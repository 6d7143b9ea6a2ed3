// Validation of a ForwardParams: every rule of the API in one place, each failure a message that
// names the parameter and the value.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "common/text.h"
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {
namespace {

template <typename... Ts>
[[noreturn]] void fail(const Ts&... parts) {
  throw Error(detail::concat(parts...));
}

// A tensor as validation sees it: name, base address, element size, sizes and strides.
struct View {
  const char* name;
  const void* ptr;
  std::size_t elem;
  std::vector<int64_t> size;
  std::vector<int64_t> stride;
};

std::string dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Strides must be non-negative, the last one 1.
void check_strides(const View& v) {
  for (int64_t s : v.stride)
    if (s < 0) fail(v.name, ": negative stride in ", dims(v.stride), " (strides must be >= 0)");
  if (v.size.back() > 1 && v.stride.back() != 1)
    fail(v.name, ": last dimension must be contiguous (stride 1), got strides ", dims(v.stride));
}

// An output must not write one element twice: sorted by stride, each dimension must step over the
// whole extent of the previous ones.
void check_no_self_overlap(const View& v) {
  std::vector<std::pair<int64_t, int64_t>> d;  // (stride, size) of dims with size > 1
  for (std::size_t i = 0; i < v.size.size(); ++i)
    if (v.size[i] > 1) d.emplace_back(v.stride[i], v.size[i]);
  std::sort(d.begin(), d.end());
  int64_t extent = 1;
  for (auto [stride, size] : d) {
    if (stride < extent)
      fail(v.name, ": strides ", dims(v.stride), " for sizes ", dims(v.size),
           " make elements alias; an output needs distinct elements");
    extent = stride * size;
  }
}

// Byte range [lo, hi) that a view can touch.
std::pair<uintptr_t, uintptr_t> byte_range(const View& v) {
  uintptr_t lo = reinterpret_cast<uintptr_t>(v.ptr);
  int64_t last = 0;
  for (std::size_t i = 0; i < v.size.size(); ++i) last += (v.size[i] - 1) * v.stride[i];
  return {lo, lo + static_cast<uintptr_t>(last + 1) * v.elem};
}

bool overlap(const View& a, const View& b) {
  auto [alo, ahi] = byte_range(a);
  auto [blo, bhi] = byte_range(b);
  return alo < bhi && blo < ahi;
}

void check_dtype(const char* name, DType t) {
  int v = static_cast<int>(t);
  if (v < 0 || v > 2) fail(name, ": unknown dtype ", v);
}

}  // namespace

void validate(const ForwardParams& p) {
  // Sizes.
  if (p.batch < 1) fail("batch must be >= 1, got ", p.batch);
  if (p.seqlen < 1) fail("seqlen must be >= 1, got ", p.seqlen);
  if (p.nheads < 1) fail("nheads must be >= 1, got ", p.nheads);
  if (p.headdim != 32 && p.headdim != 64 && p.headdim != 128)
    fail("headdim must be 32, 64 or 128, got ", p.headdim);
  if (p.dstate < 16 || p.dstate > 256 || p.dstate % 16 != 0)
    fail("dstate must be a multiple of 16 in [16, 256], got ", p.dstate);
  if (p.ngroups < 1) fail("ngroups must be >= 1, got ", p.ngroups);
  if (p.nheads % p.ngroups != 0)
    fail("ngroups must divide nheads, got ngroups ", p.ngroups, " for nheads ", p.nheads);
  if (p.chunk_size != 64 && p.chunk_size != 128 && p.chunk_size != 256)
    fail("chunk_size must be 64, 128 or 256, got ", p.chunk_size);
  // Every element offset is computed in 64 bits; refuse sizes whose products overflow even that.
  const double elems = static_cast<double>(p.batch) * p.seqlen * p.nheads * p.headdim;
  if (elems > 1e17) fail("batch * seqlen * nheads * headdim is too large: ", elems);
  if (static_cast<int>(p.cuda_path) < 0 || static_cast<int>(p.cuda_path) > 4)
    fail("cuda_path: unknown value ", static_cast<int>(p.cuda_path));
  check_dtype("dtype", p.dtype);
  check_dtype("dt_dtype", p.dt_dtype);

  // Required pointers.
  if (!p.x) fail("x is null");
  if (!p.dt) fail("dt is null");
  if (!p.A) fail("A is null");
  if (!p.B) fail("B is null");
  if (!p.C) fail("C is null");
  if (!p.y) fail("y (the output) is null");

  // Options.
  const int dl = static_cast<int>(p.D_layout);
  if (dl < 0 || dl > 2) fail("D_layout: unknown value ", dl);
  if (p.D_layout == DLayout::kNone && p.D) fail("D is given but D_layout is none");
  if (p.D_layout != DLayout::kNone && !p.D) fail("D_layout is per-head or per-head-dim but D is null");
  if (std::isnan(p.dt_min) || std::isnan(p.dt_max))
    fail("dt_limit must not be NaN, got (", p.dt_min, ", ", p.dt_max, ")");
  if (p.dt_min < 0.0f) fail("dt_limit lower bound must be >= 0, got ", p.dt_min);
  if (p.dt_min > p.dt_max)
    fail("dt_limit must satisfy lo <= hi, got (", p.dt_min, ", ", p.dt_max, ")");
  if (p.cu_seqlens) {
    if (p.batch != 1) fail("cu_seqlens needs batch == 1 (packed sequences), got batch ", p.batch);
    if (p.nseqs < 1) fail("nseqs must be >= 1 with cu_seqlens, got ", p.nseqs);
  } else if (p.nseqs != 0) {
    fail("nseqs is ", p.nseqs, " but cu_seqlens is null");
  }
  if (p.varlen_states && !p.cu_seqlens) fail("varlen_states needs cu_seqlens");

  // Tensors: sizes, strides.
  const int64_t b = p.batch, L = p.seqlen, H = p.nheads, P = p.headdim, G = p.ngroups, N = p.dstate;
  const std::size_t es = dtype_size(p.dtype);
  std::vector<View> inputs = {
      {"x", p.x, es, {b, L, H, P}, {p.x_stride.s0, p.x_stride.s1, p.x_stride.s2, p.x_stride.s3}},
      {"dt", p.dt, dtype_size(p.dt_dtype), {b, L, H}, {p.dt_stride.s0, p.dt_stride.s1, p.dt_stride.s2}},
      {"A", p.A, 4, {H}, {1}},
      {"B", p.B, es, {b, L, G, N}, {p.B_stride.s0, p.B_stride.s1, p.B_stride.s2, p.B_stride.s3}},
      {"C", p.C, es, {b, L, G, N}, {p.C_stride.s0, p.C_stride.s1, p.C_stride.s2, p.C_stride.s3}},
  };
  if (p.D) {
    if (p.D_layout == DLayout::kPerHead) inputs.push_back({"D", p.D, 4, {H}, {1}});
    else inputs.push_back({"D", p.D, 4, {H, P}, {P, 1}});
  }
  if (p.z)
    inputs.push_back({"z", p.z, es, {b, L, H, P}, {p.z_stride.s0, p.z_stride.s1, p.z_stride.s2, p.z_stride.s3}});
  if (p.dt_bias) inputs.push_back({"dt_bias", p.dt_bias, 4, {H}, {1}});
  if (p.initial_states) {
    const Strides4& s = p.initial_states_stride;
    inputs.push_back({"initial_states", p.initial_states, 4, {b, H, P, N}, {s.s0, s.s1, s.s2, s.s3}});
  }
  if (p.seq_idx)
    inputs.push_back({"seq_idx", p.seq_idx, 4, {b, L}, {p.seq_idx_stride.s0, p.seq_idx_stride.s1}});
  if (p.cu_seqlens) inputs.push_back({"cu_seqlens", p.cu_seqlens, 8, {p.nseqs + 1}, {1}});

  std::vector<View> outputs = {
      {"y", p.y, es, {b, L, H, P}, {p.y_stride.s0, p.y_stride.s1, p.y_stride.s2, p.y_stride.s3}}};
  if (p.final_states) {
    const Strides4& s = p.final_states_stride;
    outputs.push_back({"final_states", p.final_states, 4, {b, H, P, N}, {s.s0, s.s1, s.s2, s.s3}});
  }
  if (p.varlen_states) {
    const Strides4& s = p.varlen_states_stride;
    outputs.push_back({"varlen_states", p.varlen_states, 4, {p.nseqs, H, P, N}, {s.s0, s.s1, s.s2, s.s3}});
  }

  for (const View& v : inputs) check_strides(v);
  for (const View& v : outputs) {
    check_strides(v);
    check_no_self_overlap(v);
  }
  // Outputs alias neither an input nor each other.
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (const View& in : inputs)
      if (overlap(outputs[i], in)) fail("output ", outputs[i].name, " overlaps input ", in.name);
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (overlap(outputs[i], outputs[j]))
        fail("output ", outputs[i].name, " overlaps output ", outputs[j].name);
  }
}

}  // namespace mamba2ssd
