// The decode step in the op library: the schema of mamba2ssd::selective_state_update (a fragment of
// TORCH_LIBRARY(mamba2ssd) in ops.cpp), its argument checks and its CPU kernel. The CUDA kernel is in
// cuda/decode_ops_cuda.cpp; the Python face (mamba_ssm's argument forms) in python/mamba2ssd/decode.py.
#include "decode.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <tuple>

#include "common/text.h"
#include "torch_types.h"
#include "testing/tolerance.h"

namespace mamba2ssd::binding {
namespace {

constexpr const char* kDecodeFunction = "selective_state_update: ";

std::string text(at::IntArrayRef v) { return shape_text(v); }

template <typename... Ts>
[[noreturn]] void fail(const Ts&... parts) {
  TORCH_CHECK_VALUE(false, std::string(kDecodeFunction) + detail::concat(parts...));
}

// The decode step takes no fp64 (its oracle is the reference backend of the library, not an op).
std::optional<DType> to_dtype(at::ScalarType t) {
  const std::optional<DType> d = library_dtype(t);
  return d == DType::kF64 ? std::nullopt : d;
}

DType float_dtype(const char* name, const at::Tensor& t) {
  const std::optional<DType> d = to_dtype(t.scalar_type());
  if (!d) fail(name, " must be float32, float16 or bfloat16, got ", std::string(c10::toString(t.scalar_type())));
  return *d;
}

void expect_shape(const char* name, const at::Tensor& t, at::IntArrayRef want, const char* dims) {
  if (t.sizes() != want) fail(name, " must have shape ", dims, " = ", text(want), ", got ", text(t.sizes()));
}

// Slot indices as the kernels take them, int32. An int64 entry past int32's range would wrap onto
// another slot: on the host it is refused by name; on a GPU (reading it would be a synchronization)
// it becomes INT32_MIN, outside every cache, so that its request is skipped or its store dropped, as
// for any entry outside the cache (mamba2ssd.h, "Bad slots").
at::Tensor int32_slots(const char* name, const at::Tensor& t) {
  auto outside = [&](const std::string& at, int64_t v) {
    fail(name, "[", at, "] = ", v, " is outside the cache (slot indices are int32)");
  };
  return int32_entries(t, outside, [](const at::Tensor& g) {
    return g.where(g.ge(kInt32Lo).logical_and(g.le(kInt32Hi)), at::Scalar(kInt32Lo));
  });
}

}  // namespace

void decode_translate_errors(const std::function<void()>& f) { rethrow_as_torch(kDecodeFunction, f); }

DecodeCall prepare_decode(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                          const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                          const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                          bool dt_softplus, double dt_min, double dt_max,
                          const std::optional<at::Tensor>& state_batch_indices,
                          const std::optional<at::Tensor>& dst_state_batch_indices, int64_t pad_slot_id,
                          const at::Tensor& out) {
  const std::pair<const char*, const at::Tensor*> all[] = {
      {"x", &x}, {"dt", &dt}, {"A", &A}, {"B", &B}, {"C", &C}, {"out", &out},
      {"D", D ? &*D : nullptr}, {"z", z ? &*z : nullptr}, {"dt_bias", dt_bias ? &*dt_bias : nullptr},
      {"state_batch_indices", state_batch_indices ? &*state_batch_indices : nullptr},
      {"dst_state_batch_indices", dst_state_batch_indices ? &*dst_state_batch_indices : nullptr}};
  for (auto [name, t] : all)
    if (t && t->device() != state.device())
      fail(name, " is on ", t->device().str(), " but state is on ", state.device().str(),
           "; every tensor must be on the state's device");
  if (state.dim() != 4) fail("state must be a 4-d tensor [nslots, nheads, headdim, dstate], got shape ", text(state.sizes()));
  if (x.dim() != 4) fail("x must be a 4-d tensor [batch, tokens, nheads, headdim], got shape ", text(x.sizes()));
  if (B.dim() != 4) fail("B must be a 4-d tensor [batch, tokens, ngroups, dstate], got shape ", text(B.sizes()));
  const int64_t S = state.size(0), H = state.size(1), P = state.size(2), N = state.size(3);
  const int64_t b = x.size(0), T = x.size(1), G = B.size(2);
  expect_shape("x", x, {b, T, H, P}, "[batch, tokens, nheads, headdim] (nheads, headdim: the state's)");
  expect_shape("dt", dt, {b, T, H}, "[batch, tokens, nheads]");
  expect_shape("A", A, {H}, "[nheads]");
  expect_shape("B", B, {b, T, G, N}, "[batch, tokens, ngroups, dstate]");
  expect_shape("C", C, {b, T, G, N}, "[batch, tokens, ngroups, dstate] (B's shape)");
  expect_shape("out", out, {b, T, H, P}, "[batch, tokens, nheads, headdim] (x's shape)");
  if (z) expect_shape("z", *z, {b, T, H, P}, "[batch, tokens, nheads, headdim] (x's shape)");
  if (dt_bias) expect_shape("dt_bias", *dt_bias, {H}, "[nheads]");
  if (D && !(D->dim() == 1 && D->size(0) == H) && !(D->dim() == 2 && D->size(0) == H && D->size(1) == P))
    fail("D must have shape [nheads] = [", H, "] or [nheads, headdim] = [", H, ", ", P, "], got ", text(D->sizes()));
  if (state_batch_indices) expect_shape("state_batch_indices", *state_batch_indices, {b}, "[batch]");
  if (dst_state_batch_indices) expect_shape("dst_state_batch_indices", *dst_state_batch_indices, {b, T}, "[batch, tokens]");

  const DType dtype = float_dtype("x", x);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"B", &B}, {"C", &C}, {"out", &out}})
    if (t->scalar_type() != x.scalar_type())
      fail(name, " must have x's dtype ", std::string(c10::toString(x.scalar_type())), ", got ",
           std::string(c10::toString(t->scalar_type())));
  if (z && z->scalar_type() != x.scalar_type())
    fail("z must have x's dtype ", std::string(c10::toString(x.scalar_type())), ", got ",
         std::string(c10::toString(z->scalar_type())));
  // The cache and out are written in place: no copies, so their rows must already be contiguous.
  if (N > 1 && state.stride(3) != 1) fail("state's last dimension must be contiguous (stride 1), got strides ", text(state.strides()));
  if (P > 1 && out.stride(3) != 1) fail("out's last dimension must be contiguous (stride 1), got strides ", text(out.strides()));
  for (auto [name, t] : {std::pair<const char*, const std::optional<at::Tensor>*>{"state_batch_indices", &state_batch_indices},
                         {"dst_state_batch_indices", &dst_state_batch_indices}})
    if (*t && (*t)->scalar_type() != at::kInt && (*t)->scalar_type() != at::kLong)
      fail(name, " must be an int32 or int64 tensor, got ", std::string(c10::toString((*t)->scalar_type())));

  DecodeCall call;
  DecodeParams& p = call.params;
  p.batch = b, p.ntokens = T, p.nheads = H, p.headdim = P, p.ngroups = G, p.dstate = N, p.nslots = S;
  p.dtype = dtype, p.dt_dtype = float_dtype("dt", dt), p.state_dtype = float_dtype("state", state);
  p.dt_softplus = dt_softplus;
  decode_translate_errors([&] { std::tie(p.dt_min, p.dt_max) = float_dt_limit(dt_min, dt_max); });
  p.pad_slot_id = static_cast<int32_t>(pad_slot_id);
  if (pad_slot_id != p.pad_slot_id) fail("pad_slot_id must fit in int32, got ", pad_slot_id);
  auto keep = [&](at::Tensor t) {
    call.keep.push_back(t);
    return t;
  };
  p.state = state.data_ptr(), p.state_stride = strides4(state);
  const at::Tensor xk = keep(last_dim_contiguous(x)), Bk = keep(last_dim_contiguous(B)), Ck = keep(last_dim_contiguous(C));
  p.x = xk.data_ptr(), p.x_stride = strides4(xk);
  p.B = Bk.data_ptr(), p.B_stride = strides4(Bk);
  p.C = Ck.data_ptr(), p.C_stride = strides4(Ck);
  const at::Tensor dtk = keep(last_dim_contiguous(dt));
  p.dt = dtk.data_ptr(), p.dt_stride = {dtk.stride(0), dtk.stride(1), dtk.stride(2)};
  p.A = keep(A.to(at::kFloat).contiguous()).data_ptr<float>();
  if (D) {
    p.D_layout = D->dim() == 1 ? DLayout::kPerHead : DLayout::kPerHeadDim;
    p.D = keep(D->to(at::kFloat).contiguous()).data_ptr<float>();
  }
  if (z) {
    const at::Tensor zk = keep(last_dim_contiguous(*z));
    p.z = zk.data_ptr(), p.z_stride = strides4(zk);
  }
  if (dt_bias) p.dt_bias = keep(dt_bias->to(at::kFloat).contiguous()).data_ptr<float>();
  if (state_batch_indices) {
    const at::Tensor r = keep(int32_slots("state_batch_indices", *state_batch_indices).contiguous());
    p.state_batch_indices = r.data_ptr<int32_t>();
  }
  if (dst_state_batch_indices) {
    const at::Tensor d = keep(last_dim_contiguous(int32_slots("dst_state_batch_indices", *dst_state_batch_indices)));
    p.dst_state_batch_indices = d.data_ptr<int32_t>();
    p.dst_state_batch_indices_stride = {d.stride(0), d.stride(1)};
  }
  p.out = out.data_ptr(), p.out_stride = strides4(out);
  return call;
}

namespace {

// The decode op's sizes by the library's limits (validate_sizes), which mamba2ssd.selective_state_update
// runs when allocating out failed: past them the ValueError naming them, not the allocator's error.
void validate_decode_sizes(int64_t batch, int64_t ntokens, int64_t nheads, int64_t headdim, int64_t ngroups,
                           int64_t dstate, int64_t nslots) {
  DecodeParams p;
  p.batch = batch, p.ntokens = ntokens, p.nheads = nheads, p.headdim = headdim, p.ngroups = ngroups;
  p.dstate = dstate, p.nslots = nslots;
  decode_translate_errors([&] { validate_sizes(p); });
}

}  // namespace

double decode_tolerance(at::ScalarType dtype, at::ScalarType state_dtype) {
  auto d = [](at::ScalarType t) {
    const std::optional<DType> v = to_dtype(t);
    TORCH_CHECK_VALUE(v, std::string("decode_tolerance: dtype must be float32, float16 or bfloat16, got ") + c10::toString(t));
    return *v;
  };
  return testing::decode_rel_l2_tolerance(d(dtype), d(state_dtype));
}

namespace {

void selective_state_update_cpu(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                                bool dt_softplus, double dt_min, double dt_max,
                                const std::optional<at::Tensor>& state_batch_indices,
                                const std::optional<at::Tensor>& dst_state_batch_indices, int64_t pad_slot_id,
                                const at::Tensor& out) {
  DecodeCall call = prepare_decode(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max,
                                   state_batch_indices, dst_state_batch_indices, pad_slot_id, out);
  decode_translate_errors([&] { decode_cpu(call.params, at::get_num_threads()); });
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_FRAGMENT(mamba2ssd, m) {
  // The decode step (include/mamba2ssd/mamba2ssd.h, "Decode"), in the library's layout: state
  // [nslots, H, P, N] and out [b, T, H, P] are written in place; dt_limit = (dt_min, dt_max).
  m.def(
      "selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, "
      "Tensor? z, Tensor? dt_bias, bool dt_softplus, float dt_min, float dt_max, Tensor? state_batch_indices, "
      "Tensor? dst_state_batch_indices, int pad_slot_id, Tensor(b!) out) -> ()");
  // Relative L2 tolerance of the decode step's out and stored states against the fp64 oracle
  // (src/testing/tolerance.h), for the Python tests.
  m.def("decode_tolerance(ScalarType dtype, ScalarType state_dtype) -> float", &mamba2ssd::binding::decode_tolerance);
  // mamba2ssd.selective_state_update's check when allocating out failed (in the library's layout).
  m.def("_validate_decode_sizes(int batch, int ntokens, int nheads, int headdim, int ngroups, int dstate, "
        "int nslots) -> ()",
        &mamba2ssd::binding::validate_decode_sizes);
}

TORCH_LIBRARY_IMPL(mamba2ssd, CPU, m) {
  m.impl("selective_state_update", &mamba2ssd::binding::selective_state_update_cpu);
}
