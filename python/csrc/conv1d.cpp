// The layer call's convolution in the op library: the schemas of mamba2ssd::causal_conv1d_fwd and
// causal_conv1d_bwd (a fragment of TORCH_LIBRARY(mamba2ssd) in ops.cpp), their checks, and their
// CPU kernels (the library's fp64 oracle: the host runs them for tests, the layer call's CPU path
// is PyTorch's). The CUDA kernels are in cuda/conv1d_ops_cuda.cpp; the Python face in
// python/mamba2ssd/layer.py.
#include "conv1d.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <string>

#include "common/text.h"
#include "torch_types.h"

namespace mamba2ssd::binding {
namespace {

constexpr const char* kConvFunction = "causal_conv1d: ";

template <typename... Ts>
[[noreturn]] void fail(const Ts&... parts) {
  TORCH_CHECK_VALUE(false, std::string(kConvFunction) + detail::concat(parts...));
}

}  // namespace

void conv1d_translate_errors(const std::function<void()>& f) { rethrow_as_torch(kConvFunction, f); }

Conv1dCall prepare_conv1d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          const std::optional<at::Tensor>& seq_idx, bool silu, const at::Tensor* dout,
                          bool bias_grad, const std::optional<at::Tensor>& dx_out) {
  const std::pair<const char*, const at::Tensor*> all[] = {
      {"weight", &weight}, {"bias", bias ? &*bias : nullptr}, {"seq_idx", seq_idx ? &*seq_idx : nullptr},
      {"dout", dout}};
  for (auto [name, t] : all)
    if (t && t->device() != x.device())
      fail(name, " is on ", t->device().str(), " but x is on ", x.device().str(),
           "; every tensor must be on x's device");
  if (x.dim() != 3) fail("x must be a 3-d tensor [batch, seqlen, channels], got shape ", shape_text(x.sizes()));
  const int64_t b = x.size(0), L = x.size(1), C = x.size(2);
  if (weight.dim() != 2 || weight.size(0) != C)
    fail("weight must have shape [channels, width] = [", C, ", width], got ", shape_text(weight.sizes()));
  if (bias && (bias->dim() != 1 || bias->size(0) != C))
    fail("bias must have shape [channels] = [", C, "], got ", shape_text(bias->sizes()));
  if (seq_idx && (seq_idx->dim() != 2 || seq_idx->size(0) != b || seq_idx->size(1) != L))
    fail("seq_idx must have shape [batch, seqlen] = [", b, ", ", L, "], got ", shape_text(seq_idx->sizes()));
  if (seq_idx && seq_idx->scalar_type() != at::kInt && seq_idx->scalar_type() != at::kLong)
    fail("seq_idx must be an int32 or int64 tensor, got ", dtype_text(*seq_idx));
  const std::optional<DType> dtype = library_dtype(x.scalar_type());
  if (!dtype || *dtype == DType::kF64) fail("x must be float32, float16 or bfloat16, got ", dtype_text(x));
  for (auto [name, t] :
       {std::pair<const char*, const at::Tensor*>{"weight", &weight}, {"bias", bias ? &*bias : nullptr}})
    if (t && !t->is_floating_point()) fail(name, " must be a float tensor, got ", dtype_text(*t));
  if (dout && dout->sizes() != x.sizes())
    fail("dout must have x's shape ", shape_text(x.sizes()), ", got ", shape_text(dout->sizes()));
  if (dout && dout->scalar_type() != x.scalar_type())
    fail("dout must have x's dtype ", dtype_text(x), ", got ", dtype_text(*dout));

  Conv1dCall call;
  Conv1dParams& p = call.params.fwd;
  const at::Tensor xs = last_dim_contiguous(x);
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  call.keep = {xs, w};
  p.batch = b, p.seqlen = L, p.channels = C, p.width = weight.size(1), p.dtype = *dtype, p.silu = silu;
  p.x = xs.data_ptr(), p.x_stride = strides3(xs), p.weight = w.data_ptr<float>();
  if (bias) {
    const at::Tensor bf = bias->to(at::kFloat).contiguous();
    call.keep.push_back(bf);
    p.bias = bf.data_ptr<float>();
  }
  if (seq_idx) {
    const at::Tensor s = int32_seq_idx(*seq_idx, [](const std::string& m) { fail(m); });
    call.keep.push_back(s);
    p.seq_idx = s.data_ptr<int32_t>(), p.seq_idx_stride = strides2(s);
  }
  if (!dout) {
    const at::Tensor out = at::empty({b, L, C}, x.options());
    call.keep.push_back(out);
    p.out = out.data_ptr(), p.out_stride = strides3(out);
    return call;
  }
  const at::Tensor ds = last_dim_contiguous(*dout);
  const at::Tensor dx = output_into("dx_out", dx_out, {b, L, C}, x.options(), [](const std::string& m) { fail(m); });
  const at::Tensor dweight = at::empty({C, p.width}, x.options().dtype(at::kFloat));
  const at::Tensor dbias = at::empty({bias_grad ? C : 0}, x.options().dtype(at::kFloat));
  call.keep.insert(call.keep.end(), {ds, dx, dx_out ? at::empty({0}, x.options()) : dx, dweight, dbias});
  Conv1dBackwardParams& bp = call.params;
  bp.dout = ds.data_ptr(), bp.dout_stride = strides3(ds), bp.dx = dx.data_ptr(), bp.dx_stride = strides3(dx);
  bp.dweight = dweight.data_ptr<float>(), bp.dbias = bias_grad ? dbias.data_ptr<float>() : nullptr;
  return call;
}

namespace {

at::Tensor conv1d_fwd_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          const std::optional<at::Tensor>& seq_idx, bool silu) {
  Conv1dCall call = prepare_conv1d(x, weight, bias, seq_idx, silu, nullptr, false, std::nullopt);
  conv1d_translate_errors([&] { conv1d_reference(call.params.fwd); });
  return call.keep.back();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv1d_bwd_cpu(const at::Tensor& x, const at::Tensor& weight,
                                                              const std::optional<at::Tensor>& bias,
                                                              const std::optional<at::Tensor>& seq_idx,
                                                              const at::Tensor& dout, bool silu, bool bias_grad,
                                                              const std::optional<at::Tensor>& dx_out) {
  Conv1dCall call = prepare_conv1d(x, weight, bias, seq_idx, silu, &dout, bias_grad, dx_out);
  conv1d_translate_errors([&] { conv1d_backward_reference(call.params); });
  const std::size_t n = call.keep.size();
  return {call.keep[n - 3], call.keep[n - 2], call.keep[n - 1]};
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_FRAGMENT(mamba2ssd, m) {
  m.def("causal_conv1d_fwd(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, bool silu) -> Tensor");
  // The backward returns dx, dweight and dbias (float32; empty [0] unless bias_grad). dx_out: where
  // to write dx instead (x's shape and dtype, a contiguous last dimension; a slice of a larger
  // gradient, say); the first output is then empty.
  m.def("causal_conv1d_bwd(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, Tensor dout, bool silu, "
        "bool bias_grad, Tensor(a!)? dx_out=None) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mamba2ssd, CPU, m) {
  m.impl("causal_conv1d_fwd", &mamba2ssd::binding::conv1d_fwd_cpu);
  m.impl("causal_conv1d_bwd", &mamba2ssd::binding::conv1d_bwd_cpu);
}
