// Validation of a ForwardParams and of a BackwardParams: every rule of the API in one place, each
// failure a message that names the parameter and the value.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/internal.h"
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

View view(const char* name, const void* ptr, std::size_t elem, std::vector<int64_t> size, const Strides4& s) {
  return {name, ptr, elem, std::move(size), {s.s0, s.s1, s.s2, s.s3}};
}
View view(const char* name, const void* ptr, std::size_t elem, std::vector<int64_t> size, const Strides3& s) {
  return {name, ptr, elem, std::move(size), {s.s0, s.s1, s.s2}};
}
View view(const char* name, const void* ptr, std::size_t elem, std::vector<int64_t> size, const Strides2& s) {
  return {name, ptr, elem, std::move(size), {s.s0, s.s1}};
}
// A contiguous 1-d or 2-d tensor ([H] or [H, P]).
View contiguous_view(const char* name, const void* ptr, std::size_t elem, std::vector<int64_t> size) {
  std::vector<int64_t> stride(size.size(), 1);
  if (size.size() == 2) stride[0] = size[1];
  return {name, ptr, elem, std::move(size), std::move(stride)};
}

// ForwardParams::saved_states as a view: [b, ceil(L / 64), H, P, N] contiguous, of the input dtype;
// its size checked against the element limit, its address 16-byte aligned (the hopper forward
// writes it and the backward's Hopper kernels read it by TMA).
View saved_states_view(const ForwardParams& p);

// Offset of a view's last element. Sizes and strides come from the caller: each product and sum is
// checked before it is formed, so that a huge stride is refused instead of wrapping around.
int64_t last_offset(const View& v) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t last = 0;
  for (std::size_t i = 0; i < v.size.size(); ++i) {
    const int64_t steps = v.size[i] - 1, stride = v.stride[i];
    if (steps > 0 && stride > 0 && (stride > kMax / steps || steps * stride > kMax - last))
      fail(v.name, ": strides ", dims(v.stride), " for sizes ", dims(v.size), " reach past 2^63 elements");
    if (steps > 0) last += steps * stride;
  }
  if (last >= kMax / static_cast<int64_t>(v.elem))
    fail(v.name, ": strides ", dims(v.stride), " for sizes ", dims(v.size), " reach past 2^63 bytes");
  return last;
}

// The pointer must be a multiple of the element size (the CPU backends load elements as uint16_t,
// float, int32_t, int64_t; at any other address that is undefined behaviour).
void check_alignment(const View& v) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(v.ptr);
  if (address % v.elem != 0) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(address));
    fail(v.name, ": address ", hex, " is not a multiple of its element size (", v.elem, " bytes)");
  }
}

// Aligned, strides non-negative, the last one 1, and the extent must fit in 64 bits.
void check_strides(const View& v) {
  check_alignment(v);
  for (int64_t s : v.stride)
    if (s < 0) fail(v.name, ": negative stride in ", dims(v.stride), " (strides must be >= 0)");
  if (v.size.back() > 1 && v.stride.back() != 1)
    fail(v.name, ": last dimension must be contiguous (stride 1), got strides ", dims(v.stride));
  last_offset(v);
}

// An output must not write one element twice: sorted by stride, each dimension must step over the
// whole extent of the previous ones. (check_strides has bounded (size - 1) * stride, so stride * size
// stays within 2^63 + stride: saturate instead of overflowing.)
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
    const int64_t last = (size - 1) * stride;
    extent = last > std::numeric_limits<int64_t>::max() - stride ? std::numeric_limits<int64_t>::max() : last + stride;
  }
}

// Byte range [lo, hi) that a view can touch.
std::pair<uintptr_t, uintptr_t> byte_range(const View& v) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(v.ptr);
  return {lo, lo + static_cast<uintptr_t>(last_offset(v) + 1) * v.elem};
}

// Where the elements of v lie modulo `period`: bytes [start, start + length) taken around a circle of
// that circumference, when v's dimensions split into ones whose strides are multiples of the period
// and ones whose extent fits in one period; nullopt when they do not.
struct Arc {
  uint64_t start, length;
};
std::optional<Arc> arc(const View& v, uint64_t period) {
  uint64_t inner = v.elem;  // the first element's byte to past the last byte, over the inner dims
  for (std::size_t i = 0; i < v.size.size(); ++i) {
    const uint64_t step = static_cast<uint64_t>(v.stride[i]) * v.elem;
    if (v.size[i] > 1 && step % period != 0) inner += static_cast<uint64_t>(v.size[i] - 1) * step;
  }
  if (inner > period) return std::nullopt;
  return Arc{reinterpret_cast<uintptr_t>(v.ptr) % period, inner};
}

// True when a and b interleave without sharing a byte: for some period (one of their strides), each
// keeps to its own arc, as slices of the columns of one buffer do (mamba_ssm's fused layer hands
// dz, dx, dB, dC and ddt as slices of one [b, L, W] tensor).
bool interleaved_disjoint(const View& a, const View& b) {
  for (const View* v : {&a, &b})
    for (std::size_t i = 0; i < v->size.size(); ++i) {
      if (v->size[i] < 2 || v->stride[i] == 0) continue;
      const uint64_t period = static_cast<uint64_t>(v->stride[i]) * v->elem;
      const auto ra = arc(a, period), rb = arc(b, period);
      if (!ra || !rb) continue;
      const uint64_t b_from_a = (rb->start + period - ra->start) % period;  // b's start, a's at 0
      if (ra->length <= b_from_a && b_from_a + rb->length <= period) return true;
    }
  return false;
}

// Whether a and b may share a byte: their byte ranges meet and they are not provably interleaved.
bool overlap(const View& a, const View& b) {
  auto [alo, ahi] = byte_range(a);
  auto [blo, bhi] = byte_range(b);
  return alo < bhi && blo < ahi && !interleaved_disjoint(a, b);
}

void check_dtype(const char* name, DType t) {
  int v = static_cast<int>(t);
  if (v < 0 || v > 3) fail(name, ": unknown dtype ", v);
}

// fp64 is the reference backend's only, and an fp64 call is fp64 throughout (mamba2ssd.h, DType).
void check_f64(const ForwardParams& p, bool allow_f64) {
  const bool x64 = p.dtype == DType::kF64, dt64 = p.dt_dtype == DType::kF64;
  if (!x64 && !dt64) return;
  if (!allow_f64)
    fail(x64 ? "dtype" : "dt_dtype", " fp64 is taken by the reference backend only (the fp64 oracle); the "
         "cpu and cuda backends take fp32, fp16 and bf16");
  if (!x64 || !dt64)
    fail("an fp64 call is fp64 throughout: dtype and dt_dtype must both be fp64, got dtype ", to_string(p.dtype),
         ", dt_dtype ", to_string(p.dt_dtype));
}

// Strides of every view, then outputs: none writes an element twice, none overlaps an input or
// another output.
void check_views(const std::vector<View>& inputs, const std::vector<View>& outputs) {
  for (const View& v : inputs) check_strides(v);
  for (const View& v : outputs) {
    check_strides(v);
    check_no_self_overlap(v);
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (const View& in : inputs)
      if (overlap(outputs[i], in)) fail("output ", outputs[i].name, " overlaps input ", in.name);
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (overlap(outputs[i], outputs[j]))
        fail("output ", outputs[i].name, " overlaps output ", outputs[j].name);
  }
}

// The product of `factors` (named sizes, each >= 1 or, for nseqs, >= 0) must be at most 2^56: the
// message names each factor and its value. Checked factor by factor, so nothing wraps.
constexpr int64_t kMaxElements = int64_t{1} << 56;
void check_elements(std::initializer_list<std::pair<const char*, int64_t>> factors) {
  int64_t n = 1;
  bool over = false;
  for (auto [name, value] : factors)
    if (!over && (__builtin_mul_overflow(n, value, &n) || n > kMaxElements)) over = true;
  if (!over) return;
  std::string names, values;
  for (auto [name, value] : factors) {
    names += (names.empty() ? "" : " * ") + std::string(name);
    values += (values.empty() ? "" : " * ") + std::to_string(value);
  }
  fail(names, " = ", values, " is more than 2^56 elements");
}

View saved_states_view(const ForwardParams& p) {
  const int64_t chunks = saved_states_chunks(p.seqlen), H = p.nheads, P = p.headdim, N = p.dstate;
  check_elements({{"batch", p.batch}, {"ceil(seqlen / 64)", chunks}, {"nheads", H}, {"headdim", P}, {"dstate", N}});
  if (reinterpret_cast<uintptr_t>(p.saved_states) % 16 != 0) {
    char hex[32];
    const auto address = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p.saved_states));
    std::snprintf(hex, sizeof hex, "0x%llx", address);
    fail("saved_states: address ", hex, " is not 16-byte aligned");
  }
  return {"saved_states", p.saved_states, dtype_size(p.dtype), {p.batch, chunks, H, P, N},
          {chunks * H * P * N, H * P * N, P * N, N, 1}};
}

// The head shape every call shares (the forward's and the decode step's).
void check_heads(int64_t nheads, int64_t headdim, int64_t dstate, int64_t ngroups) {
  if (nheads < 1) fail("nheads must be >= 1, got ", nheads);
  // Any multiple of 16 up to 128: the models' 64 and 128, and Nemotron-H's 80, in the GPU kernels'
  // tiles of 32, 64 or 128 rows with the rows past the head dim masked.
  if (headdim < 16 || headdim > 128 || headdim % 16 != 0)
    fail("headdim must be a multiple of 16 in [16, 128], got ", headdim);
  if (dstate < 16 || dstate > 256 || dstate % 16 != 0) fail("dstate must be a multiple of 16 in [16, 256], got ", dstate);
  if (ngroups < 1) fail("ngroups must be >= 1, got ", ngroups);
  if (nheads % ngroups != 0) fail("ngroups must divide nheads, got ngroups ", ngroups, " for nheads ", nheads);
}

void check_sizes(const ForwardParams& p) {
  if (p.batch < 1) fail("batch must be >= 1, got ", p.batch);
  if (p.seqlen < 1) fail("seqlen must be >= 1, got ", p.seqlen);
  check_heads(p.nheads, p.headdim, p.dstate, p.ngroups);
  // Any chunk length: it organizes the peer's scan, not the function (the backends tile their own
  // way), so that a caller's chunk_size of 17 or 32 runs as mamba_ssm's does. The prefill, whose
  // chunks hold whole requests' tokens, takes 64, 128 or 256 (validate(PrefillParams)).
  if (p.chunk_size < 1) fail("chunk_size must be >= 1, got ", p.chunk_size);
  if (p.nseqs < 0) fail("nseqs must be >= 0, got ", p.nseqs);
  if (p.nseqs > (int64_t{1} << 40)) fail("nseqs is too large: ", p.nseqs);  // keeps nseqs + 1 from wrapping
  // Every tensor's element count, whatever its strides and whether it is given (the backends form
  // these products, the oracle even for absent states): within 2^56, so that any offset or byte
  // count (at most 8 bytes an element) fits in 64 bits with room to spare.
  check_elements({{"batch", p.batch}, {"seqlen", p.seqlen}, {"nheads", p.nheads}, {"headdim", p.headdim}});
  check_elements({{"batch", p.batch}, {"seqlen", p.seqlen}, {"ngroups", p.ngroups}, {"dstate", p.dstate}});
  check_elements({{"batch", p.batch}, {"nheads", p.nheads}, {"headdim", p.headdim}, {"dstate", p.dstate}});
  check_elements({{"nseqs", p.nseqs}, {"nheads", p.nheads}, {"headdim", p.headdim}, {"dstate", p.dstate}});
  if (static_cast<int>(p.cuda_path) < 0 || static_cast<int>(p.cuda_path) > 4)
    fail("cuda_path: unknown value ", static_cast<int>(p.cuda_path));
  if (p.fp32_math != Fp32Math::kTf32 && p.fp32_math != Fp32Math::kAccurate)
    fail("fp32_math: unknown value ", static_cast<int>(p.fp32_math));
  check_dtype("dtype", p.dtype);
  check_dtype("dt_dtype", p.dt_dtype);
}

// The options that need no pointer, shared by the forward and the decode step: D_layout's value
// and dt_limit.
void check_dt_options(DLayout D_layout, float dt_min, float dt_max) {
  const int dl = static_cast<int>(D_layout);
  if (dl < 0 || dl > 2) fail("D_layout: unknown value ", dl);
  validate_dt_limit(dt_min, dt_max);  // float to double is exact: the same verdicts and messages
}

void check_required_inputs(const ForwardParams& p) {
  if (!p.x) fail("x is null");
  if (!p.dt) fail("dt is null");
  if (!p.A) fail("A is null");
  if (!p.B) fail("B is null");
  if (!p.C) fail("C is null");
}

// The options that tie values to pointers.
void check_options(const ForwardParams& p) {
  if (p.D_layout == DLayout::kNone && p.D) fail("D is given but D_layout is none");
  if (p.D_layout != DLayout::kNone && !p.D) fail("D_layout is per-head or per-head-dim but D is null");
  if (p.cu_seqlens) {
    if (p.batch != 1) fail("cu_seqlens needs batch == 1 (packed sequences), got batch ", p.batch);
    if (p.nseqs < 1) fail("nseqs must be >= 1 with cu_seqlens, got ", p.nseqs);
  } else if (p.nseqs != 0) {
    fail("nseqs is ", p.nseqs, " but cu_seqlens is null");
  }
  if (p.input_status && !p.check_inputs) fail("input_status is given but check_inputs is false");
}

// D's shape: [H] or [H, P].
std::vector<int64_t> D_size(const ForwardParams& p) {
  if (p.D_layout == DLayout::kPerHead) return {p.nheads};
  return {p.nheads, p.headdim};
}

// Every input tensor of a forward call that is given.
std::vector<View> input_views(const ForwardParams& p) {
  const int64_t b = p.batch, L = p.seqlen, H = p.nheads, P = p.headdim, G = p.ngroups, N = p.dstate;
  const std::size_t es = dtype_size(p.dtype), fs = dtype_size(detail::float_tensor_dtype(p));
  std::vector<View> v = {
      view("x", p.x, es, {b, L, H, P}, p.x_stride),
      view("dt", p.dt, dtype_size(p.dt_dtype), {b, L, H}, p.dt_stride),
      contiguous_view("A", p.A, fs, {H}),
      view("B", p.B, es, {b, L, G, N}, p.B_stride),
      view("C", p.C, es, {b, L, G, N}, p.C_stride),
  };
  if (p.D) v.push_back(contiguous_view("D", p.D, fs, D_size(p)));
  if (p.z) v.push_back(view("z", p.z, es, {b, L, H, P}, p.z_stride));
  if (p.dt_bias) v.push_back(contiguous_view("dt_bias", p.dt_bias, fs, {H}));
  if (p.initial_states) v.push_back(view("initial_states", p.initial_states, fs, {b, H, P, N}, p.initial_states_stride));
  if (p.seq_idx) v.push_back(view("seq_idx", p.seq_idx, 4, {b, L}, p.seq_idx_stride));
  if (p.cu_seqlens) v.push_back(contiguous_view("cu_seqlens", p.cu_seqlens, 8, {p.nseqs + 1}));
  return v;
}

// Checked mode's device status, when given: written by the call (forward or backward), so it is an
// output: aligned, and overlapping no input and no other output.
void add_input_status(const ForwardParams& p, std::vector<View>& outputs) {
  if (p.input_status) outputs.push_back(contiguous_view("input_status", p.input_status, 8, {kInputStatusWords}));
}

// A gradient present exactly when its input is.
void check_pair(const char* grad, const void* grad_ptr, const char* input, const void* input_ptr) {
  if (grad_ptr && !input_ptr) fail(grad, " is given but ", input, " is null (no input, no gradient)");
  if (!grad_ptr && input_ptr) fail(input, " is given but ", grad, " is null (its gradient is required)");
}

}  // namespace

void validate_sizes(const ForwardParams& p) {
  check_sizes(p);
  check_dt_options(p.D_layout, p.dt_min, p.dt_max);
}

void validate_dt_limit(double dt_min, double dt_max) {
  if (std::isnan(dt_min) || std::isnan(dt_max)) fail("dt_limit must not be NaN, got (", dt_min, ", ", dt_max, ")");
  if (dt_min < 0.0) fail("dt_limit lower bound must be >= 0, got ", dt_min);
  // +inf would clamp every step to inf, and every output would be NaN; so would a bound past float's
  // range, which the float field holds as inf.
  if (std::isinf(dt_min)) fail("dt_limit lower bound must be finite, got ", dt_min);
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  if (dt_min > kFloatMax)
    fail("dt_limit lower bound must be finite in float32 (at most ", kFloatMax, "), got ", dt_min);
  if (dt_min > dt_max) fail("dt_limit must satisfy lo <= hi, got (", dt_min, ", ", dt_max, ")");
}

std::pair<float, float> float_dt_limit(double dt_min, double dt_max) {
  validate_dt_limit(dt_min, dt_max);  // dt_min now fits float
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  return {static_cast<float>(dt_min),
          dt_max > kFloatMax ? std::numeric_limits<float>::infinity() : static_cast<float>(dt_max)};
}

namespace {

void validate_call(const ForwardParams& p, bool allow_f64) {
  validate_sizes(p);
  check_f64(p, allow_f64);
  check_required_inputs(p);
  if (!p.y) fail("y (the output) is null");
  check_options(p);
  if (p.varlen_states && !p.cu_seqlens) fail("varlen_states needs cu_seqlens");

  const int64_t b = p.batch, H = p.nheads, P = p.headdim, N = p.dstate;
  const std::size_t fs = dtype_size(detail::float_tensor_dtype(p));
  std::vector<View> outputs = {view("y", p.y, dtype_size(p.dtype), {b, p.seqlen, H, P}, p.y_stride)};
  if (p.final_states) outputs.push_back(view("final_states", p.final_states, fs, {b, H, P, N}, p.final_states_stride));
  if (p.varlen_states)
    outputs.push_back(view("varlen_states", p.varlen_states, fs, {p.nseqs, H, P, N}, p.varlen_states_stride));
  if (p.saved_states) outputs.push_back(saved_states_view(p));
  add_input_status(p, outputs);
  check_views(input_views(p), outputs);
}

void validate_call(const BackwardParams& p, bool allow_f64) {
  const ForwardParams& f = p.fwd;
  validate_sizes(f);
  check_f64(f, allow_f64);
  check_required_inputs(f);
  check_options(f);

  if (!p.dout) fail("dout is null");
  const std::pair<const char*, const void*> required[] = {
      {"dx", p.dx}, {"ddt", p.ddt}, {"dA", p.dA}, {"dB", p.dB}, {"dC", p.dC}};
  for (auto [name, ptr] : required)
    if (!ptr) fail(name, " (a required gradient) is null");
  check_pair("dD", p.dD, "D", f.D);
  check_pair("dz", p.dz, "z", f.z);
  check_pair("ddt_bias", p.ddt_bias, "dt_bias", f.dt_bias);
  check_pair("dinitial_states", p.dinitial_states, "initial_states", f.initial_states);
  if (p.dvarlen_states && !f.cu_seqlens) fail("dvarlen_states needs cu_seqlens");

  const int64_t b = f.batch, L = f.seqlen, H = f.nheads, P = f.headdim, G = f.ngroups, N = f.dstate;
  const std::size_t es = dtype_size(f.dtype), fs = dtype_size(detail::float_tensor_dtype(f));
  std::vector<View> inputs = input_views(f);
  inputs.push_back(view("dout", p.dout, es, {b, L, H, P}, p.dout_stride));
  if (p.dfinal_states) inputs.push_back(view("dfinal_states", p.dfinal_states, fs, {b, H, P, N}, p.dfinal_states_stride));
  if (p.dvarlen_states)
    inputs.push_back(view("dvarlen_states", p.dvarlen_states, fs, {f.nseqs, H, P, N}, p.dvarlen_states_stride));
  if (f.saved_states) inputs.push_back(saved_states_view(f));  // read, as the forward left them

  std::vector<View> outputs = {
      view("dx", p.dx, es, {b, L, H, P}, p.dx_stride),
      view("ddt", p.ddt, dtype_size(f.dt_dtype), {b, L, H}, p.ddt_stride),
      contiguous_view("dA", p.dA, fs, {H}),
      view("dB", p.dB, es, {b, L, G, N}, p.dB_stride),
      view("dC", p.dC, es, {b, L, G, N}, p.dC_stride),
  };
  if (p.dD) outputs.push_back(contiguous_view("dD", p.dD, fs, D_size(f)));
  if (p.dz) outputs.push_back(view("dz", p.dz, es, {b, L, H, P}, p.dz_stride));
  if (p.ddt_bias) outputs.push_back(contiguous_view("ddt_bias", p.ddt_bias, fs, {H}));
  if (p.dinitial_states)
    outputs.push_back(view("dinitial_states", p.dinitial_states, fs, {b, H, P, N}, p.dinitial_states_stride));
  add_input_status(f, outputs);
  check_views(inputs, outputs);
}

}  // namespace

void detail::validate_reference(const ForwardParams& p) { validate_call(p, true); }
void detail::validate_reference(const BackwardParams& p) { validate_call(p, true); }
void validate(const ForwardParams& p) { validate_call(p, false); }
void validate(const BackwardParams& p) { validate_call(p, false); }

// ---------------------------------------------------------------------------------------------
// Decode (DecodeParams): the same rules for sizes, strides, alignment and overlaps.

void validate_sizes(const DecodeParams& p) {
  if (p.batch < 1) fail("batch must be >= 1, got ", p.batch);
  if (p.ntokens < 1) fail("ntokens must be >= 1, got ", p.ntokens);
  check_heads(p.nheads, p.headdim, p.dstate, p.ngroups);
  if (p.nslots < 1) fail("nslots must be >= 1, got ", p.nslots);
  // The CUDA grid and the slot indices are int32: a request index and a slot must fit.
  if (p.batch > std::numeric_limits<int32_t>::max()) fail("batch must be < 2^31, got ", p.batch);
  if (p.nslots > std::numeric_limits<int32_t>::max()) fail("nslots must be < 2^31, got ", p.nslots);
  check_elements({{"batch", p.batch}, {"ntokens", p.ntokens}, {"nheads", p.nheads}, {"headdim", p.headdim}});
  check_elements({{"batch", p.batch}, {"ntokens", p.ntokens}, {"ngroups", p.ngroups}, {"dstate", p.dstate}});
  check_elements({{"nslots", p.nslots}, {"nheads", p.nheads}, {"headdim", p.headdim}, {"dstate", p.dstate}});
  // The oracle keeps the state after every token of every request (CLI and tests: a slice of it).
  check_elements({{"batch", p.batch}, {"ntokens", p.ntokens}, {"nheads", p.nheads}, {"headdim", p.headdim},
                  {"dstate", p.dstate}});
  check_dtype("dtype", p.dtype);
  check_dtype("dt_dtype", p.dt_dtype);
  check_dtype("state_dtype", p.state_dtype);
  for (auto [name, t] : {std::pair{"dtype", p.dtype}, {"dt_dtype", p.dt_dtype}, {"state_dtype", p.state_dtype}})
    if (t == DType::kF64) fail(name, " fp64 is not taken by the decode step (fp32, fp16 and bf16 are)");
  check_dt_options(p.D_layout, p.dt_min, p.dt_max);
}

void validate(const DecodeParams& p) {
  validate_sizes(p);
  if (!p.state) fail("state (the cache) is null");
  if (!p.x) fail("x is null");
  if (!p.dt) fail("dt is null");
  if (!p.A) fail("A is null");
  if (!p.B) fail("B is null");
  if (!p.C) fail("C is null");
  if (!p.out) fail("out (the output) is null");
  if (p.D_layout == DLayout::kNone && p.D) fail("D is given but D_layout is none");
  if (p.D_layout != DLayout::kNone && !p.D) fail("D_layout is per-head or per-head-dim but D is null");
  if (!p.state_batch_indices && p.nslots < p.batch)
    fail("without state_batch_indices request b reads slot b, so nslots must be >= batch ", p.batch, ", got ",
         p.nslots);

  const int64_t b = p.batch, T = p.ntokens, H = p.nheads, P = p.headdim, G = p.ngroups, N = p.dstate;
  const std::size_t es = dtype_size(p.dtype);
  std::vector<View> inputs = {
      view("x", p.x, es, {b, T, H, P}, p.x_stride),
      view("dt", p.dt, dtype_size(p.dt_dtype), {b, T, H}, p.dt_stride),
      contiguous_view("A", p.A, 4, {H}),
      view("B", p.B, es, {b, T, G, N}, p.B_stride),
      view("C", p.C, es, {b, T, G, N}, p.C_stride),
  };
  if (p.D) inputs.push_back(contiguous_view("D", p.D, 4, p.D_layout == DLayout::kPerHead ? std::vector<int64_t>{H}
                                                                                         : std::vector<int64_t>{H, P}));
  if (p.z) inputs.push_back(view("z", p.z, es, {b, T, H, P}, p.z_stride));
  if (p.dt_bias) inputs.push_back(contiguous_view("dt_bias", p.dt_bias, 4, {H}));
  if (p.state_batch_indices) inputs.push_back(contiguous_view("state_batch_indices", p.state_batch_indices, 4, {b}));
  if (p.dst_state_batch_indices)
    inputs.push_back(view("dst_state_batch_indices", p.dst_state_batch_indices, 4, {b, T},
                          p.dst_state_batch_indices_stride));
  // The cache is read and written: an output for the overlap rules (distinct elements, no input
  // inside it), and out must not overlap it.
  const std::vector<View> outputs = {
      view("state", p.state, dtype_size(p.state_dtype), {p.nslots, H, P, N}, p.state_stride),
      view("out", p.out, es, {b, T, H, P}, p.out_stride),
  };
  check_views(inputs, outputs);
}

// ---------------------------------------------------------------------------------------------
// Packed prefill (PrefillParams): the forward's rules for fwd, then the cache and the slot arrays.

namespace {

// A check of the forward's part of a prefill (fwd), its Error worded as the prefill's ("fwd: ...").
template <typename F>
void check_fwd(F check) {
  try {
    check();
  } catch (const Error& e) {
    fail("fwd: ", e.what());
  }
}

}  // namespace

void validate_sizes(const PrefillParams& p) {
  const ForwardParams& f = p.fwd;
  if (f.dtype == DType::kF64 || f.dt_dtype == DType::kF64)
    fail("fwd.", f.dtype == DType::kF64 ? "dtype" : "dt_dtype",
         " fp64 is not taken by the prefill (fp32, fp16 and bf16 are)");
  if (f.batch != 1) fail("fwd.batch must be 1 in a prefill (the requests are packed into one row), got ", f.batch);
  if (f.chunk_size != 64 && f.chunk_size != 128 && f.chunk_size != 256)
    fail("fwd.chunk_size must be 64, 128 or 256 in a prefill (its chunks and state_every's boundaries), got ",
         f.chunk_size);
  check_fwd([&] { validate_sizes(f); });
  check_dtype("state_dtype", p.state_dtype);
  if (p.state_dtype == DType::kF64) fail("state_dtype fp64 is not taken by the prefill (fp32, fp16 and bf16 are)");
  if (p.nslots < 1) fail("nslots must be >= 1, got ", p.nslots);
  // Slot indices are int32 (and so will the CUDA kernel's be).
  if (p.nslots > std::numeric_limits<int32_t>::max()) fail("nslots must be < 2^31, got ", p.nslots);
  check_elements({{"nslots", p.nslots}, {"nheads", f.nheads}, {"headdim", f.headdim}, {"dstate", f.dstate}});
}

void validate(const PrefillParams& p) {
  const ForwardParams& f = p.fwd;
  // The fields a prefill refuses, first, so that the message says why rather than the forward's rule.
  const std::pair<const char*, const void*> refused[] = {
      {"initial_states", f.initial_states}, {"final_states", f.final_states}, {"varlen_states", f.varlen_states}};
  for (auto [name, ptr] : refused)
    if (ptr)
      fail("fwd.", name, " must be null in a prefill: each request's state is read from and stored to its cache "
           "slot (state, slots, has_initial_state)");
  if (f.saved_states)
    fail("fwd.saved_states must be null in a prefill: it keeps the forward's states for the backward, and a "
         "prefill has no backward (state_every stores states to cache slots)");
  validate_sizes(p);
  if (!f.cu_seqlens) fail("fwd.cu_seqlens is null: a prefill marks its requests with cu_seqlens");
  check_fwd([&] { validate(f); });
  if (!p.state) fail("state (the cache) is null");
  if (!p.slots) fail("slots is null");

  const int64_t S = f.nseqs;
  // Intermediate states: all three fields together, or none (state_every 0).
  if (p.state_every < 0) fail("state_every must be >= 0 (0: no intermediate states), got ", p.state_every);
  if (p.state_every % f.chunk_size != 0)
    fail("state_every must be a multiple of fwd.chunk_size ", f.chunk_size, ", got ", p.state_every);
  if (p.state_every == 0 && p.intermediate_slots)
    fail("intermediate_slots is given but state_every is 0 (no intermediate states); set state_every to k, the "
         "tokens between stored states");
  if (p.state_every > 0) {
    if (!p.intermediate_slots)
      fail("intermediate_slots is null but state_every is ", p.state_every, " (a state every ", p.state_every,
           " tokens needs slots to store them to)");
    if (p.max_intermediate < 1)
      fail("max_intermediate must be >= 1 with state_every ", p.state_every, ", got ", p.max_intermediate);
    check_elements({{"nseqs", S}, {"max_intermediate", p.max_intermediate}});
  }

  std::vector<View> inputs = input_views(f);
  inputs.push_back(contiguous_view("slots", p.slots, 4, {S}));
  if (p.has_initial_state) inputs.push_back(contiguous_view("has_initial_state", p.has_initial_state, 1, {S}));
  if (p.intermediate_slots)
    inputs.push_back(contiguous_view("intermediate_slots", p.intermediate_slots, 4, {S, p.max_intermediate}));
  // The cache is read and written: an output for the overlap rules (distinct elements, no input in
  // it, not overlapping y). First, so that a cache over an input is named as such. input_status is
  // written too (the checked mode): apart from the cache and the slot arrays as from fwd's tensors.
  std::vector<View> outputs = {
      view("state", p.state, dtype_size(p.state_dtype), {p.nslots, f.nheads, f.headdim, f.dstate}, p.state_stride),
      view("y", f.y, dtype_size(f.dtype), {1, f.seqlen, f.nheads, f.headdim}, f.y_stride),
  };
  add_input_status(f, outputs);
  check_views(inputs, outputs);
}

// ---------------------------------------------------------------------------------------------
// The layer's causal convolution (Conv1dParams, Conv1dBackwardParams): the same rules.

namespace {

void check_conv1d_sizes(const Conv1dParams& p) {
  if (p.batch < 1) fail("batch must be >= 1, got ", p.batch);
  if (p.seqlen < 1) fail("seqlen must be >= 1, got ", p.seqlen);
  if (p.channels < 1) fail("channels must be >= 1, got ", p.channels);
  if (p.width < 2 || p.width > 4) fail("width must be 2, 3 or 4, got ", p.width);
  // The CUDA grid: batch rows and channel blocks are grid dimensions (at most 65535 and 2^31 - 1).
  if (p.batch > 65535) fail("batch must be at most 65535, got ", p.batch);
  if (p.channels > std::numeric_limits<int32_t>::max()) fail("channels must be < 2^31, got ", p.channels);
  check_elements({{"batch", p.batch}, {"seqlen", p.seqlen}, {"channels", p.channels}});
  check_dtype("dtype", p.dtype);
  if (p.dtype == DType::kF64) fail("dtype fp64 is not taken by the convolution (fp32, fp16 and bf16 are)");
}

// The forward's inputs as views, for both calls' checks.
std::vector<View> conv1d_inputs(const Conv1dParams& p) {
  if (!p.x) fail("x is null");
  if (!p.weight) fail("weight is null");
  const int64_t b = p.batch, L = p.seqlen, C = p.channels;
  std::vector<View> inputs = {view("x", p.x, dtype_size(p.dtype), {b, L, C}, p.x_stride),
                              contiguous_view("weight", p.weight, 4, {C, p.width})};
  if (p.bias) inputs.push_back(contiguous_view("bias", p.bias, 4, {C}));
  if (p.seq_idx) inputs.push_back(view("seq_idx", p.seq_idx, 4, {b, L}, p.seq_idx_stride));
  return inputs;
}

}  // namespace

void validate(const Conv1dParams& p) {
  check_conv1d_sizes(p);
  std::vector<View> inputs = conv1d_inputs(p);
  if (!p.out) fail("out (the output) is null");
  check_views(inputs, {view("out", p.out, dtype_size(p.dtype), {p.batch, p.seqlen, p.channels}, p.out_stride)});
}

void validate(const Conv1dBackwardParams& p) {
  const Conv1dParams& f = p.fwd;
  check_conv1d_sizes(f);
  std::vector<View> inputs = conv1d_inputs(f);
  if (!p.dout) fail("dout is null");
  if (!p.dx) fail("dx is null");
  if (!p.dweight) fail("dweight is null");
  const int64_t b = f.batch, L = f.seqlen, C = f.channels;
  const std::size_t es = dtype_size(f.dtype);
  inputs.push_back(view("dout", p.dout, es, {b, L, C}, p.dout_stride));
  std::vector<View> outputs = {view("dx", p.dx, es, {b, L, C}, p.dx_stride),
                               contiguous_view("dweight", p.dweight, 4, {C, f.width})};
  if (p.dbias) outputs.push_back(contiguous_view("dbias", p.dbias, 4, {C}));
  check_views(inputs, outputs);
}

// ---------------------------------------------------------------------------------------------
// The layer's gated RMSNorm (GatedRmsNormParams, GatedRmsNormBackwardParams): the same rules.

namespace {

std::vector<View> rmsnorm_inputs(const GatedRmsNormParams& p) {
  if (p.rows < 1) fail("rows must be >= 1, got ", p.rows);
  if (p.dim < 1) fail("dim must be >= 1, got ", p.dim);
  if (p.group_size < 1 || p.dim % p.group_size != 0)
    fail("group_size must divide dim = ", p.dim, ", got ", p.group_size);
  if (p.group_size > kMaxRmsNormGroup) fail("group_size must be at most ", kMaxRmsNormGroup, ", got ", p.group_size);
  // The CUDA grid: rows and groups are its x and y dimensions.
  if (p.rows > std::numeric_limits<int32_t>::max()) fail("rows must be < 2^31, got ", p.rows);
  if (p.dim / p.group_size > 65535)
    fail("dim / group_size (groups a row) must be at most 65535, got ", p.dim / p.group_size);
  check_elements({{"rows", p.rows}, {"dim", p.dim}});
  check_dtype("dtype", p.dtype);
  if (p.dtype == DType::kF64) fail("dtype fp64 is not taken by the norm (fp32, fp16 and bf16 are)");
  if (!(p.eps >= 0.0f) || !std::isfinite(p.eps)) fail("eps must be finite and >= 0, got ", p.eps);
  if (!p.y) fail("y is null");
  if (!p.weight) fail("weight is null");
  const std::size_t es = dtype_size(p.dtype);
  std::vector<View> inputs = {view("y", p.y, es, {p.rows, p.dim}, p.y_stride),
                              contiguous_view("weight", p.weight, 4, {p.dim})};
  if (p.z) inputs.push_back(view("z", p.z, es, {p.rows, p.dim}, p.z_stride));
  return inputs;
}

}  // namespace

void validate(const GatedRmsNormParams& p) {
  std::vector<View> inputs = rmsnorm_inputs(p);
  if (!p.out) fail("out (the output) is null");
  check_views(inputs, {view("out", p.out, dtype_size(p.dtype), {p.rows, p.dim}, p.out_stride)});
}

void validate(const GatedRmsNormBackwardParams& p) {
  const GatedRmsNormParams& f = p.fwd;
  std::vector<View> inputs = rmsnorm_inputs(f);
  if (!p.dout) fail("dout is null");
  if (!p.dy) fail("dy is null");
  if (!p.dweight) fail("dweight is null");
  if (f.z && !p.dz) fail("dz is null (z is given, so its gradient is computed)");
  if (!f.z && p.dz) fail("dz is given but z is null");
  const std::size_t es = dtype_size(f.dtype);
  inputs.push_back(view("dout", p.dout, es, {f.rows, f.dim}, p.dout_stride));
  std::vector<View> outputs = {view("dy", p.dy, es, {f.rows, f.dim}, p.dy_stride),
                               contiguous_view("dweight", p.dweight, 4, {f.dim})};
  if (p.dz) outputs.push_back(view("dz", p.dz, es, {f.rows, f.dim}, p.dz_stride));
  if (f.out) outputs.push_back(view("out", f.out, es, {f.rows, f.dim}, f.out_stride));
  check_views(inputs, outputs);
}

}  // namespace mamba2ssd
