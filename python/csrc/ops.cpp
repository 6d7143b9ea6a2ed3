// The op library `mamba2ssd` (torch.ops.mamba2ssd): schemas, argument checks, the CPU kernel and the
// tolerance table. The CUDA kernel is in cuda/ops_cuda.cpp; the fake (meta) kernel and the Python
// face are in python/mamba2ssd/.
#include <Python.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <torch/version.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "chunk_scan.h"
#include "torch_types.h"
#include "common/text.h"
#include "testing/tolerance.h"

namespace mamba2ssd::binding {
namespace {

// Errors name the Python function users call.
constexpr const char* kFunction = "mamba_chunk_scan_combined";

// The parts of an error message as text, without iostreams (see src/common/text.h).
using detail::text;
std::string text(at::ScalarType t) { return c10::toString(t); }
std::string text(const c10::Device& d) { return d.str(); }
std::string text(at::IntArrayRef v) { return shape_text(v); }

template <typename... Ts>
[[noreturn]] void fail(const Ts&... parts) {
  std::string message;
  ((message += text(parts)), ...);  // text() of the library and of the overloads above
  throw_value_error(message.c_str());  // adds "mamba_chunk_scan_combined: "
}


// Each present tensor with its argument name, x first.
std::vector<std::pair<const char*, const at::Tensor*>> named_tensors(const Args& a) {
  std::vector<std::pair<const char*, const at::Tensor*>> v = {
      {"x", &a.x}, {"dt", &a.dt}, {"A", &a.A}, {"B", &a.B}, {"C", &a.C}};
  const std::pair<const char*, const OptTensor*> optional[] = {
      {"D", &a.D}, {"z", &a.z}, {"dt_bias", &a.dt_bias}, {"initial_states", &a.initial_states},
      {"seq_idx", &a.seq_idx}, {"cu_seqlens", &a.cu_seqlens}};
  for (auto [name, t] : optional)
    if (t->has_value()) v.emplace_back(name, &t->value());
  return v;
}

void expect_rank(const char* name, const at::Tensor& t, int64_t rank, const char* dims) {
  if (t.dim() != rank)
    fail(name, " must be a ", rank, "-d tensor ", dims, ", got shape ", t.sizes());
}

void expect_shape(const char* name, const at::Tensor& t, std::initializer_list<int64_t> want, const char* dims) {
  if (t.sizes() != at::IntArrayRef(want))
    fail(name, " must have shape ", dims, " = ", at::IntArrayRef(want), ", got ", t.sizes());
}

void expect_float(const char* name, const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()))
    fail(name, " must be a floating-point tensor, got ", t.scalar_type());
}

// A tensor's data as the library's float* (doubles in an fp64 call: mamba2ssd.h, DType::kF64).
float* float_ptr(const at::Tensor& t) { return static_cast<float*>(t.data_ptr()); }

// last_dim_contiguous(t), kept alive in `kept` for the call.
at::Tensor keep_last_dim_contiguous(std::vector<at::Tensor>& kept, const at::Tensor& t) {
  kept.push_back(last_dim_contiguous(t));
  return kept.back();
}

// Small parameters (A, D, dt_bias): contiguous in `type` (fp32, or fp64 in an fp64 call), converted if needed.
at::Tensor small_float(const at::Tensor& t, at::ScalarType type) { return t.to(type).contiguous(); }

at::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kF64: return at::kDouble;
    default: return at::kFloat;
  }
}


void check_devices(const Args& a) {
  for (auto [name, t] : named_tensors(a))
    if (t->device() != a.x.device())
      fail(name, " is on ", t->device(), " but x is on ", a.x.device(),
           "; every tensor must be on x's device");
}

}  // namespace

// One std::string argument: c10::str passes it through without an ostringstream (see text()).
[[noreturn]] void throw_value_error(const char* what) {
  TORCH_CHECK_VALUE(false, std::string(kFunction) + ": " + what);
}

[[noreturn]] void throw_runtime_error(const char* what) { TORCH_CHECK(false, std::string(kFunction) + ": " + what); }

// The CUDA kernels to run, by name (CudaPath's to_string names); the CPU backend ignores it.
CudaPath cuda_path_of(c10::string_view name) {
  const std::string s(name.data(), name.size());
  for (CudaPath c : {CudaPath::kAuto, CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper, CudaPath::kTile})
    if (s == to_string(c)) return c;
  fail("cuda_path must be one of auto, three-kernel, fused, hopper, tile, got '", s.c_str(), "'");
}

// How fp32 products run on CUDA, by name (Fp32Math's to_string names); the CPU ignores it.
Fp32Math fp32_math_of(c10::string_view name) {
  const std::string s(name.data(), name.size());
  for (Fp32Math m : {Fp32Math::kTf32, Fp32Math::kAccurate})
    if (s == to_string(m)) return m;
  fail("fp32_math must be one of tf32, accurate, got '", s.c_str(), "'");
}

namespace {

// prepare() without the outputs: the checks and the input half of params. context: the messages'
// prefix after the function's name, as the backend's errors have it ("backward: " in the backward).
Call prepare_inputs(const Args& a, const char* context) {
  check_devices(a);
  expect_rank("x", a.x, 4, "[batch, seqlen, nheads, headdim]");
  expect_rank("B", a.B, 4, "[batch, seqlen, ngroups, dstate]");
  const int64_t b = a.x.size(0), L = a.x.size(1), H = a.x.size(2), P = a.x.size(3);
  const int64_t G = a.B.size(2), N = a.B.size(3);

  // dtypes: x, B, C, z share one of fp32/fp16/bf16; dt is any of those. Or float64 x, B, C, z: an fp64
  // call, which only the reference backend (the fp64 oracle, on the CPU) runs, for exact gradient
  // checks; every floating tensor of it is taken as float64.
  const std::optional<DType> dtype = library_dtype(a.x.scalar_type());
  if (!dtype) fail("x must be float32, float16, bfloat16 or float64 (CPU only), got ", a.x.scalar_type());
  const bool f64 = *dtype == DType::kF64;
  if (f64 && !a.x.is_cpu())
    fail("x is float64 on ", a.x.device(), ": float64 runs on the CPU only (the fp64 oracle, for gradient checks)");
  expect_float("dt", a.dt);
  const std::optional<DType> dt_dtype = f64 ? DType::kF64 : library_dtype(a.dt.scalar_type());
  if (!dt_dtype || (!f64 && *dt_dtype == DType::kF64))
    fail("dt must be float32, float16 or bfloat16 (float64 only with float64 x), got ", a.dt.scalar_type());
  const at::ScalarType float_type = f64 ? at::kDouble : at::kFloat;  // A, D, dt_bias, the states
  auto same_dtype_as_x = [&](const char* name, const at::Tensor& t) {
    if (t.scalar_type() != a.x.scalar_type())
      fail(name, " must have x's dtype ", a.x.scalar_type(), ", got ", t.scalar_type());
  };
  same_dtype_as_x("B", a.B);
  same_dtype_as_x("C", a.C);
  if (a.z) same_dtype_as_x("z", *a.z);
  expect_float("A", a.A);
  if (a.D) expect_float("D", *a.D);
  if (a.dt_bias) expect_float("dt_bias", *a.dt_bias);
  if (a.initial_states) expect_float("initial_states", *a.initial_states);
  if (a.seq_idx && a.seq_idx->scalar_type() != at::kInt && a.seq_idx->scalar_type() != at::kLong)
    fail("seq_idx must be an int32 or int64 tensor, got ", a.seq_idx->scalar_type());
  if (a.cu_seqlens && a.cu_seqlens->scalar_type() != at::kInt && a.cu_seqlens->scalar_type() != at::kLong)
    fail("cu_seqlens must be an int32 or int64 tensor, got ", a.cu_seqlens->scalar_type());

  // Shapes, all against x's [b, L, H, P] and B's [G, N].
  expect_rank("dt", a.dt, 3, "[batch, seqlen, nheads]");
  expect_shape("dt", a.dt, {b, L, H}, "[batch, seqlen, nheads]");
  expect_rank("A", a.A, 1, "[nheads]");
  expect_shape("A", a.A, {H}, "[nheads]");
  expect_shape("B", a.B, {b, L, G, N}, "[batch, seqlen, ngroups, dstate]");
  expect_rank("C", a.C, 4, "[batch, seqlen, ngroups, dstate]");
  expect_shape("C", a.C, {b, L, G, N}, "[batch, seqlen, ngroups, dstate] (B's shape)");
  if (a.z) {
    expect_rank("z", *a.z, 4, "[batch, seqlen, nheads, headdim]");
    expect_shape("z", *a.z, {b, L, H, P}, "[batch, seqlen, nheads, headdim] (x's shape)");
  }
  if (a.D && !(a.D->dim() == 1 && a.D->size(0) == H) && !(a.D->dim() == 2 && a.D->size(0) == H && a.D->size(1) == P))
    fail("D must have shape [nheads] = [", H, "] or [nheads, headdim] = [", H, ", ", P, "], got ",
         a.D->sizes());
  if (a.dt_bias) {
    expect_rank("dt_bias", *a.dt_bias, 1, "[nheads]");
    expect_shape("dt_bias", *a.dt_bias, {H}, "[nheads]");
  }
  if (a.initial_states) {
    expect_rank("initial_states", *a.initial_states, 4, "[batch, nheads, headdim, dstate]");
    expect_shape("initial_states", *a.initial_states, {b, H, P, N}, "[batch, nheads, headdim, dstate]");
  }
  if (a.seq_idx) {
    expect_rank("seq_idx", *a.seq_idx, 2, "[batch, seqlen]");
    expect_shape("seq_idx", *a.seq_idx, {b, L}, "[batch, seqlen]");
  }
  if (a.cu_seqlens) {
    expect_rank("cu_seqlens", *a.cu_seqlens, 1, "[num_sequences + 1]");
    if (a.cu_seqlens->size(0) < 2)
      fail("cu_seqlens must hold num_sequences + 1 >= 2 offsets, got shape ", a.cu_seqlens->sizes());
  }
  if (a.return_varlen_states && !a.cu_seqlens)
    fail("return_varlen_states=True needs cu_seqlens");

  Call call;
  ForwardParams& p = call.params;
  p.cuda_path = cuda_path_of(a.cuda_path);
  p.fp32_math = fp32_math_of(a.fp32_math);
  p.batch = b;
  p.seqlen = L;
  p.nheads = H;
  p.headdim = P;
  p.ngroups = G;
  p.dstate = N;
  p.chunk_size = a.chunk_size;
  p.dtype = *dtype;
  p.dt_dtype = *dt_dtype;
  p.dt_softplus = a.dt_softplus;
  // The host backends check the contents themselves; the CUDA kernel (cuda/ops_cuda.cpp) adds the
  // device status it needs.
  p.check_inputs = a.check_inputs;
  if (a.cu_seqlens) p.nseqs = a.cu_seqlens->size(0) - 1;
  // The library's rules on dt_limit as given and on the sizes, before anything is copied or
  // allocated (the outputs are sized from them): past its limits a call is its ValueError naming
  // the sizes, not the allocator's error.
  translate_errors(
      [&] {
        std::tie(p.dt_min, p.dt_max) = float_dt_limit(a.dt_min, a.dt_max);
        validate_sizes(p);
      },
      context);

  // Inputs: every tensor the params point into is kept alive in call.inputs for the call.
  auto keep = [&](const at::Tensor& t) {
    call.inputs.push_back(t);
    return t;
  };
  auto strided4 = [&](const at::Tensor& t, const void*& ptr, Strides4& stride) {
    const at::Tensor kept = keep(last_dim_contiguous(t));
    ptr = kept.data_ptr();
    stride = strides4(kept);
  };
  strided4(a.x, p.x, p.x_stride);
  strided4(a.B, p.B, p.B_stride);
  strided4(a.C, p.C, p.C_stride);
  if (a.z) strided4(*a.z, p.z, p.z_stride);
  const at::Tensor dt = keep(last_dim_contiguous(f64 ? a.dt.to(at::kDouble) : a.dt));
  p.dt = dt.data_ptr();
  p.dt_stride = strides3(dt);
  // The library declares these float*; in an fp64 call they hold doubles (mamba2ssd.h, DType::kF64).
  p.A = float_ptr(keep(small_float(a.A, float_type)));
  if (a.D) {
    p.D_layout = a.D->dim() == 1 ? DLayout::kPerHead : DLayout::kPerHeadDim;
    p.D = float_ptr(keep(small_float(*a.D, float_type)));
  }
  if (a.dt_bias) p.dt_bias = float_ptr(keep(small_float(*a.dt_bias, float_type)));
  if (a.initial_states) {
    const at::Tensor s = keep(last_dim_contiguous(a.initial_states->to(float_type)));
    p.initial_states = float_ptr(s);
    p.initial_states_stride = strides4(s);
  }
  if (a.seq_idx) {
    const at::Tensor s =
        keep(last_dim_contiguous(int32_seq_idx(*a.seq_idx, [](const std::string& message) { fail(message); })));
    p.seq_idx = s.data_ptr<int32_t>();
    p.seq_idx_stride = strides2(s);
  }
  if (a.cu_seqlens) p.cu_seqlens = keep(a.cu_seqlens->to(at::kLong).contiguous()).data_ptr<int64_t>();
  return call;
}

}  // namespace

Call prepare(const Args& a) {
  Call call = prepare_inputs(a, "");
  ForwardParams& p = call.params;
  const int64_t b = p.batch, L = p.seqlen, H = p.nheads, P = p.headdim, N = p.dstate;
  // The states for the backward: the CUDA forward writes them (the host backends recompute theirs).
  if (a.save_states && !a.x.is_cuda())
    fail("save_states keeps the CUDA forward's states for its backward, but x is on ", a.x.device());

  // Outputs.
  // The states are fp32 (fp64 in an fp64 call).
  const at::TensorOptions states = a.x.options().dtype(p.dtype == DType::kF64 ? at::kDouble : at::kFloat);
  call.y = at::empty({b, L, H, P}, a.x.options());
  p.y = call.y.data_ptr();
  p.y_stride = strides4(call.y);
  using Shape = std::vector<int64_t>;
  call.final_states = at::empty(a.return_final_states ? Shape{b, H, P, N} : Shape{0}, states);
  if (a.return_final_states) {
    p.final_states = float_ptr(call.final_states);
    p.final_states_stride = strides4(call.final_states);
  }
  call.varlen_states = at::empty(a.return_varlen_states ? Shape{p.nseqs, H, P, N} : Shape{0}, states);
  if (a.return_varlen_states) {
    p.varlen_states = float_ptr(call.varlen_states);
    p.varlen_states_stride = strides4(call.varlen_states);
  }
  const int64_t chunks = saved_states_chunks(L);
  call.saved_states = at::empty(a.save_states ? Shape{b, chunks, H, P, N} : Shape{0}, a.x.options());
  if (a.save_states) p.saved_states = call.saved_states.data_ptr();
  return call;
}

BwdCall prepare_backward(const Args& a, const at::Tensor& dout, const OptTensor& dfinal_states,
                         const OptTensor& dvarlen_states, const OptTensor& saved_states, const GradsInto& into) {
  Call fwd = prepare_inputs(a, "backward: ");
  BwdCall call;
  call.inputs = std::move(fwd.inputs);
  BackwardParams& p = call.params;
  p.fwd = fwd.params;
  const ForwardParams& f = p.fwd;
  const int64_t b = f.batch, L = f.seqlen, H = f.nheads, P = f.headdim, G = f.ngroups, N = f.dstate;
  const at::ScalarType float_type = f.dtype == DType::kF64 ? at::kDouble : at::kFloat;

  // Cotangents. Autograd hands them in the outputs' shapes and dtypes; a direct call may not.
  auto on_x_device = [&](const char* name, const at::Tensor& t) {
    if (t.device() != a.x.device())
      fail("backward: ", name, " is on ", t.device(), " but x is on ", a.x.device());
  };
  on_x_device("dout", dout);
  expect_rank("dout", dout, 4, "[batch, seqlen, nheads, headdim]");
  expect_shape("dout", dout, {b, L, H, P}, "[batch, seqlen, nheads, headdim] (y's shape)");
  if (dout.scalar_type() != a.x.scalar_type())
    fail("backward: dout must have y's dtype ", a.x.scalar_type(), ", got ", dout.scalar_type());
  const at::Tensor dy = keep_last_dim_contiguous(call.inputs, dout);
  p.dout = dy.data_ptr();
  p.dout_stride = strides4(dy);
  // A state's cotangent: taken when given and not empty (an output not asked for is an empty tensor).
  auto state_cotangent = [&](const char* name, const OptTensor& t, int64_t n0, const char* dims,
                             const float*& ptr, Strides4& stride) {
    if (!t || t->numel() == 0) return;
    on_x_device(name, *t);
    expect_float(name, *t);
    expect_rank(name, *t, 4, dims);
    expect_shape(name, *t, {n0, H, P, N}, dims);
    const at::Tensor kept = keep_last_dim_contiguous(call.inputs, t->to(float_type));
    ptr = float_ptr(kept);
    stride = strides4(kept);
  };
  state_cotangent("dfinal_states", dfinal_states, b, "[batch, nheads, headdim, dstate]", p.dfinal_states,
                  p.dfinal_states_stride);
  if (dvarlen_states && dvarlen_states->numel() > 0 && !a.cu_seqlens)
    fail("backward: dvarlen_states needs cu_seqlens");
  state_cotangent("dvarlen_states", dvarlen_states, f.nseqs, "[num_sequences, nheads, headdim, dstate]",
                  p.dvarlen_states, p.dvarlen_states_stride);
  // The states the forward saved (its fourth output, as it allocated them: contiguous, x's dtype).
  if (saved_states && saved_states->numel() > 0) {
    const int64_t chunks = saved_states_chunks(L);
    on_x_device("saved_states", *saved_states);
    expect_shape("saved_states", *saved_states, {b, chunks, H, P, N},
                 "[batch, ceil(seqlen / 64), nheads, headdim, dstate]");
    if (saved_states->scalar_type() != a.x.scalar_type() || !saved_states->is_contiguous())
      fail("backward: saved_states must be contiguous with x's dtype ", a.x.scalar_type(), " (chunk_scan_fwd's), got ",
           saved_states->scalar_type(), saved_states->is_contiguous() ? "" : ", not contiguous");
    p.fwd.saved_states = saved_states->data_ptr();
  }

  // Gradients: contiguous, in their inputs' dtypes as the library takes them (x's for dx, dB, dC, dz;
  // dt's for ddt; fp32, or fp64 in an fp64 call, for the rest), or the caller's buffers (`into`;
  // the library's validate() refuses one that overlaps an input or another gradient). Absent inputs:
  // empty tensors.
  const at::TensorOptions x_options = a.x.options(), float_options = x_options.dtype(float_type);
  auto none = [&] { return at::empty({0}, float_options); };  // one each: outputs must not alias
  // The buffer p points at; `returned` is the op's output: that buffer, or empty when it is the caller's.
  auto gradient = [&](const char* name, const OptTensor& given, at::IntArrayRef sizes,
                      const at::TensorOptions& options, at::Tensor& returned) {
    at::Tensor t = output_into(name, given, sizes, options, [](const std::string& m) { fail("backward: ", m); });
    returned = given ? at::empty({0}, options) : t;
    return t;
  };
  const at::Tensor dx = gradient("dx", into.dx, {b, L, H, P}, x_options, call.dx);
  p.dx = dx.data_ptr(), p.dx_stride = strides4(dx);
  const at::Tensor ddt = gradient("ddt", into.ddt, {b, L, H}, x_options.dtype(scalar_type(f.dt_dtype)), call.ddt);
  p.ddt = ddt.data_ptr(), p.ddt_stride = strides3(ddt);
  call.dA = at::empty({H}, float_options);
  p.dA = float_ptr(call.dA);
  const at::Tensor dB = gradient("dB", into.dB, {b, L, G, N}, x_options, call.dB);
  p.dB = dB.data_ptr(), p.dB_stride = strides4(dB);
  const at::Tensor dC = gradient("dC", into.dC, {b, L, G, N}, x_options, call.dC);
  p.dC = dC.data_ptr(), p.dC_stride = strides4(dC);
  call.dD = a.D ? at::empty(a.D->sizes(), float_options) : none();
  if (a.D) p.dD = float_ptr(call.dD);
  if (into.dz && !a.z) fail("backward: dz is given but z is not");
  if (a.z) {
    const at::Tensor dz = gradient("dz", into.dz, {b, L, H, P}, x_options, call.dz);
    p.dz = dz.data_ptr(), p.dz_stride = strides4(dz);
  } else {
    call.dz = none();
  }
  call.ddt_bias = a.dt_bias ? at::empty({H}, float_options) : none();
  if (a.dt_bias) p.ddt_bias = float_ptr(call.ddt_bias);
  call.dinitial_states = a.initial_states ? at::empty({b, H, P, N}, float_options) : none();
  if (a.initial_states) {
    p.dinitial_states = float_ptr(call.dinitial_states);
    p.dinitial_states_stride = strides4(call.dinitial_states);
  }
  return call;
}

namespace {

// An fp64 call runs on the reference backend, the only one that takes it.
void run_cpu(Call& call) {
  translate_errors([&] {
    if (call.params.dtype == DType::kF64) forward_reference(call.params);
    else forward_cpu(call.params, at::get_num_threads());
  });
}

void run_cpu_backward(BwdCall& call) {
  translate_errors(
      [&] {
        if (call.params.fwd.dtype == DType::kF64) backward_reference(call.params);
        else backward_cpu(call.params, at::get_num_threads());
      },
      "backward: ");
}

// The project's one table of tolerances (src/testing/tolerance.h), for the Python tests.
DType tolerance_dtype(at::ScalarType t) {
  const std::optional<DType> d = library_dtype(t);
  TORCH_CHECK_VALUE(d, std::string("tolerance: dtype must be float32, float16, bfloat16 or float64, got ") +
                           c10::toString(t));
  return *d;
}
// fp32_math: the bar of a call with that fp32_math ("accurate" tightens float32's).
double tolerance(at::ScalarType t, c10::string_view fp32_math) {
  return testing::rel_l2_tolerance(tolerance_dtype(t), fp32_math_of(fp32_math));
}
// sum: the bar of the gradients that sum over every token (dA, ddt_bias, dD).
double backward_tolerance(at::ScalarType t, bool sum) {
  const DType d = tolerance_dtype(t);
  return sum ? testing::backward_sum_rel_l2_tolerance(d) : testing::backward_rel_l2_tolerance(d);
}

bool has_cuda_backend() {
#ifdef MAMBA2SSD_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY(mamba2ssd, m) {
  // The fake (meta) kernel and the autograd formula live in this Python module.
  m.set_python_module("mamba2ssd._ops");
  // mamba_ssm's mamba_chunk_scan_combined. dt_limit = (dt_min, dt_max). Outputs not
  // asked for (final_states, varlen_states) come back as empty tensors. cuda_path: see CudaPath.
  // check_inputs: ForwardParams::check_inputs, the contents of cu_seqlens and seq_idx validated
  // (ValueError naming the first bad entry; on CUDA after a stream sync, none during graph capture).
  // fp32_math: "tf32" or "accurate" (3xTF32), ForwardParams::fp32_math; the backward has none (its
  // fp32 products are TF32). save_states (CUDA): the fourth output holds the states for the backward
  // (ForwardParams::saved_states, [b, ceil(L / 64), H, P, N] in x's dtype), else it is empty.
  m.def(
      "chunk_scan_fwd(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size, Tensor? D, Tensor? z, "
      "Tensor? dt_bias, Tensor? initial_states, Tensor? seq_idx, Tensor? cu_seqlens, bool dt_softplus, "
      "float dt_min, float dt_max, bool return_final_states, bool return_varlen_states, str cuda_path=\"auto\", "
      "bool check_inputs=False, str fp32_math=\"tf32\", bool save_states=False) "
      "-> (Tensor y, Tensor final_states, Tensor varlen_states, Tensor saved_states)");
  // The gradients of chunk_scan_fwd (its autograd formula, in mamba2ssd._ops, calls it): dout and the
  // states' cotangents (each None or empty when absent), then chunk_scan_fwd's inputs and options
  // (check_inputs as the forward's: the autograd formula passes the forward's). An absent input's
  // gradient comes back as an empty tensor. Deterministic on every backend. saved_states:
  // chunk_scan_fwd's fourth output, read instead of recomputing the states (None or empty: recompute).
  m.def(
      "chunk_scan_bwd(Tensor dout, Tensor? dfinal_states, Tensor? dvarlen_states, Tensor x, Tensor dt, Tensor A, "
      "Tensor B, Tensor C, int chunk_size, Tensor? D, Tensor? z, Tensor? dt_bias, Tensor? initial_states, "
      "Tensor? seq_idx, Tensor? cu_seqlens, bool dt_softplus, float dt_min, float dt_max, str cuda_path=\"auto\", "
      "bool check_inputs=False, Tensor? saved_states=None) "
      "-> (Tensor dx, Tensor ddt, Tensor dA, Tensor dB, Tensor dC, Tensor dD, Tensor dz, Tensor ddt_bias, "
      "Tensor dinitial_states)");
  // chunk_scan_bwd writing dx, ddt, dB, dC and dz (given exactly when z is) into the caller's buffers
  // (each its gradient's shape and dtype, a contiguous last dimension, any other strides: the layer
  // call passes slices of the gradients it returns, so that nothing is concatenated); returns the
  // rest. Not differentiable (the layer's backward calls it).
  m.def(
      "chunk_scan_bwd_into(Tensor dout, Tensor? dfinal_states, Tensor? dvarlen_states, Tensor x, Tensor dt, "
      "Tensor A, Tensor B, Tensor C, int chunk_size, Tensor? D, Tensor? z, Tensor? dt_bias, "
      "Tensor? initial_states, Tensor? seq_idx, Tensor? cu_seqlens, bool dt_softplus, float dt_min, float dt_max, "
      "str cuda_path, bool check_inputs, Tensor? saved_states, Tensor(a!) dx, Tensor(b!) ddt, Tensor(c!) dB, "
      "Tensor(d!) dC, Tensor(e!)? dz) -> (Tensor dA, Tensor dD, Tensor ddt_bias, Tensor dinitial_states)");
  // Relative L2 tolerance against the fp64 oracle for outputs of this dtype (and fp32_math).
  m.def("tolerance(ScalarType dtype, str fp32_math=\"tf32\") -> float", &mamba2ssd::binding::tolerance);
  // The same for the backward's gradients; sum: for dA, ddt_bias and dD (sums over every token).
  m.def("backward_tolerance(ScalarType dtype, bool sum=False) -> float", &mamba2ssd::binding::backward_tolerance);
  // Whether this build has the CUDA backend (it may still see no GPU).
  m.def("has_cuda_backend() -> bool", &mamba2ssd::binding::has_cuda_backend);
}

TORCH_LIBRARY_IMPL(mamba2ssd, CPU, m) {
  m.impl("chunk_scan_fwd", &mamba2ssd::binding::chunk_scan_fwd<mamba2ssd::binding::run_cpu>);
  m.impl("chunk_scan_bwd", &mamba2ssd::binding::chunk_scan_bwd<mamba2ssd::binding::run_cpu_backward>);
  m.impl("chunk_scan_bwd_into", &mamba2ssd::binding::chunk_scan_bwd_into<mamba2ssd::binding::run_cpu_backward>);
}

namespace {

// _C.build_info(): what this build of the extension holds, as a dict (mamba2ssd.build_info()).
PyObject* build_info(PyObject*, PyObject*) {
  const mamba2ssd::BuildInfo info = mamba2ssd::build_info();
  PyObject* targets = PyList_New(0);
  if (!targets) return nullptr;
  const std::string all = info.gpu_targets;
  for (std::size_t start = 0; start < all.size();) {
    std::size_t end = all.find(' ', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) {
      PyObject* target = PyUnicode_FromStringAndSize(all.data() + start, static_cast<Py_ssize_t>(end - start));
      if (!target || PyList_Append(targets, target) != 0) {
        Py_XDECREF(target);
        Py_DECREF(targets);
        return nullptr;
      }
      Py_DECREF(target);
    }
    start = end + 1;
  }
  const std::string cuda_version =
      std::to_string(info.cuda_version / 1000) + "." + std::to_string(info.cuda_version % 1000 / 10);
  // "N" hands over a new reference, "O" takes one of its own (Py_None).
  return Py_BuildValue("{s:s,s:O,s:N,s:N,s:O,s:s}", "version", info.version, "cuda", info.cuda ? Py_True : Py_False,
                       "cuda_version", info.cuda ? PyUnicode_FromString(cuda_version.c_str()) : Py_NewRef(Py_None),
                       "gpu_targets", targets, "cuda_tile", info.cuda_tile ? Py_True : Py_False, "torch_version",
                       TORCH_VERSION);
}

PyMethodDef kMethods[] = {
    {"build_info", build_info, METH_NOARGS, "What this build holds: version, CUDA toolkit, GPU targets."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// `import mamba2ssd._C` loads this library and with it the registrations above. The module itself
// holds only build_info (no pybind11: the ops go through torch.ops.mamba2ssd).
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "mamba2ssd's op library (see torch.ops.mamba2ssd)",
                               -1, kMethods};
  return PyModule_Create(&module);
}
