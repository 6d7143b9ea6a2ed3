// The layer call's gated RMSNorm in the op library: the schemas of mamba2ssd::gated_rmsnorm_fwd and
// gated_rmsnorm_bwd (a fragment of TORCH_LIBRARY(mamba2ssd) in ops.cpp), their checks, and their CPU
// kernels (the library's fp64 oracle, for the tests). The CUDA kernels are in
// cuda/rmsnorm_ops_cuda.cpp; the Python face in python/mamba2ssd/layer.py.
#include "rmsnorm.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "common/text.h"
#include "torch_types.h"

namespace mamba2ssd::binding {
namespace {

constexpr const char* kNormFunction = "gated_rmsnorm: ";

template <typename... Ts>
[[noreturn]] void fail(const Ts&... parts) {
  TORCH_CHECK_VALUE(false, std::string(kNormFunction) + detail::concat(parts...));
}

// [..., dim] as [rows, dim] rows: a view where the strides allow (a slice of wider rows does), else a copy.
at::Tensor rows_of(const at::Tensor& t) { return last_dim_contiguous(t.reshape({-1, t.size(-1)})); }

// An output as [rows, dim] rows: a view only (the op writes through it), so its rows must be evenly spaced.
at::Tensor row_view(const char* name, const at::Tensor& t) {
  try {
    return t.view({-1, t.size(-1)});
  } catch (const c10::Error&) {
    fail(name, " must be viewable as [rows, dim] (evenly spaced rows), got shape ", shape_text(t.sizes()),
         " and strides ", shape_text(t.strides()));
  }
}

}  // namespace

void rmsnorm_translate_errors(const std::function<void()>& f) { rethrow_as_torch(kNormFunction, f); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_outputs(const RmsNormCall& call) {
  const std::size_t n = call.keep.size();
  return {call.keep[n - 4], call.keep[n - 3], call.keep[n - 2], call.keep[n - 1]};
}

RmsNormCall prepare_rmsnorm(const at::Tensor& y, const std::optional<at::Tensor>& z, const at::Tensor& weight,
                            int64_t group_size, double eps, bool norm_before_gate, const at::Tensor* dout,
                            const std::optional<at::Tensor>& dz_out) {
  const std::pair<const char*, const at::Tensor*> all[] = {
      {"z", z ? &*z : nullptr}, {"weight", &weight}, {"dout", dout}};
  for (auto [name, t] : all)
    if (t && t->device() != y.device())
      fail(name, " is on ", t->device().str(), " but y is on ", y.device().str(),
           "; every tensor must be on y's device");
  if (y.dim() < 1 || y.numel() == 0)
    fail("y must be a non-empty tensor [..., dim], got shape ", shape_text(y.sizes()));
  const int64_t dim = y.size(-1);
  if (weight.dim() != 1 || weight.size(0) != dim)
    fail("weight must have shape [dim] = [", dim, "], got ", shape_text(weight.sizes()));
  if (!weight.is_floating_point()) fail("weight must be a float tensor, got ", dtype_text(weight));
  const std::optional<DType> dtype = library_dtype(y.scalar_type());
  if (!dtype || *dtype == DType::kF64) fail("y must be float32, float16 or bfloat16, got ", dtype_text(y));
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"z", z ? &*z : nullptr}, {"dout", dout}}) {
    if (!t) continue;
    if (t->sizes() != y.sizes())
      fail(name, " must have y's shape ", shape_text(y.sizes()), ", got ", shape_text(t->sizes()));
    if (t->scalar_type() != y.scalar_type())
      fail(name, " must have y's dtype ", dtype_text(y), ", got ", dtype_text(*t));
  }

  RmsNormCall call;
  GatedRmsNormParams& p = call.params.fwd;
  const at::Tensor y2 = rows_of(y), w = weight.to(at::kFloat).contiguous();
  call.keep = {y2, w};
  p.rows = y2.size(0), p.dim = dim, p.group_size = group_size, p.dtype = *dtype;
  p.eps = static_cast<float>(eps), p.norm_before_gate = norm_before_gate;
  p.y = y2.data_ptr(), p.y_stride = strides2(y2), p.weight = w.data_ptr<float>();
  if (z) {
    const at::Tensor z2 = rows_of(*z);
    call.keep.push_back(z2);
    p.z = z2.data_ptr(), p.z_stride = strides2(z2);
  }
  GatedRmsNormBackwardParams& bp = call.params;
  if (dout) {
    const at::Tensor d2 = rows_of(*dout);
    call.keep.push_back(d2);
    bp.dout = d2.data_ptr(), bp.dout_stride = strides2(d2);
  }
  const at::Tensor out = at::empty(y.sizes(), y.options());  // the backward writes it again too
  call.keep.push_back(out);
  p.out = out.data_ptr(), p.out_stride = {dim, 1};
  if (!dout) return call;
  const at::Tensor dy = at::empty(y.sizes(), y.options());
  if (dz_out && !z) fail("dz_out is given but z is not");
  const at::Tensor dz = z ? output_into("dz_out", dz_out, y.sizes(), y.options(), [](const std::string& m) { fail(m); })
                          : at::empty({0}, y.options());
  const at::Tensor dweight = at::empty({dim}, y.options().dtype(at::kFloat));
  call.keep.insert(call.keep.end(), {dy, dz_out ? at::empty({0}, y.options()) : dz, dweight});
  bp.dy = dy.data_ptr(), bp.dy_stride = {dim, 1};
  if (z) {  // a view: dz (kept) or the caller's dz_out holds its memory
    const at::Tensor dz2 = row_view("dz_out", dz);
    bp.dz = dz2.data_ptr(), bp.dz_stride = strides2(dz2);
  }
  bp.dweight = dweight.data_ptr<float>();
  return call;
}

namespace {

at::Tensor rmsnorm_fwd_cpu(const at::Tensor& y, const std::optional<at::Tensor>& z, const at::Tensor& weight,
                           int64_t group_size, double eps, bool norm_before_gate) {
  RmsNormCall call = prepare_rmsnorm(y, z, weight, group_size, eps, norm_before_gate, nullptr, std::nullopt);
  rmsnorm_translate_errors([&] { gated_rmsnorm_reference(call.params.fwd); });
  return call.keep.back();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rmsnorm_bwd_cpu(
    const at::Tensor& y, const std::optional<at::Tensor>& z, const at::Tensor& weight, const at::Tensor& dout,
    int64_t group_size, double eps, bool norm_before_gate, const std::optional<at::Tensor>& dz_out) {
  RmsNormCall call = prepare_rmsnorm(y, z, weight, group_size, eps, norm_before_gate, &dout, dz_out);
  rmsnorm_translate_errors([&] { gated_rmsnorm_backward_reference(call.params); });
  return backward_outputs(call);
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_FRAGMENT(mamba2ssd, m) {
  m.def("gated_rmsnorm_fwd(Tensor y, Tensor? z, Tensor weight, int group_size, float eps, bool norm_before_gate) "
        "-> Tensor");
  // The backward returns out (the forward's output, written again on the way: the layer's
  // out-projection reads it), dy, dz (empty without z) and dweight (float32). dz_out: where to write
  // dz instead (z's shape and dtype, evenly spaced rows with a contiguous last dimension: a slice of
  // a larger gradient, say); dz then comes back empty.
  m.def("gated_rmsnorm_bwd(Tensor y, Tensor? z, Tensor weight, Tensor dout, int group_size, float eps, "
        "bool norm_before_gate, Tensor(a!)? dz_out=None) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mamba2ssd, CPU, m) {
  m.impl("gated_rmsnorm_fwd", &mamba2ssd::binding::rmsnorm_fwd_cpu);
  m.impl("gated_rmsnorm_bwd", &mamba2ssd::binding::rmsnorm_bwd_cpu);
}
