// The packed prefill in the op library: the schema of mamba2ssd::prefill (a fragment of
// TORCH_LIBRARY(mamba2ssd) in ops.cpp), its argument checks and its CPU kernel. The CUDA kernel is in
// cuda/prefill_ops_cuda.cpp (device guard, the caller's stream, a workspace from PyTorch's
// allocator); the Python face in python/mamba2ssd/prefill.py.
#include "prefill.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/text.h"
#include "torch_types.h"
#include "testing/tolerance.h"

namespace mamba2ssd::binding {
namespace {

constexpr const char* kPrefillFunction = "prefill: ";

// The parts of an error message as text, without iostreams (see src/common/text.h).
using detail::text;
std::string text(at::IntArrayRef v) { return shape_text(v); }
std::string text(at::ScalarType t) { return c10::toString(t); }

template <typename... Ts>
[[noreturn]] void fail(const Ts&... parts) {
  std::string message(kPrefillFunction);
  ((message += text(parts)), ...);
  TORCH_CHECK_VALUE(false, message);
}

// fp32, fp16, bf16: the prefill takes no fp64 (validate(PrefillParams) refuses it; its oracle is the
// reference backend, not an op).
std::optional<DType> to_dtype(at::ScalarType t) {
  const std::optional<DType> d = library_dtype(t);
  return d == DType::kF64 ? std::nullopt : d;
}

DType float_dtype(const char* name, const at::Tensor& t) {
  const std::optional<DType> d = to_dtype(t.scalar_type());
  if (!d) fail(name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  return *d;
}

void expect_rank(const char* name, const at::Tensor& t, int64_t rank, const char* dims) {
  if (t.dim() != rank) fail(name, " must be a ", rank, "-d tensor ", dims, ", got shape ", t.sizes());
}

void expect_shape(const char* name, const at::Tensor& t, at::IntArrayRef want, const char* dims) {
  if (t.sizes() != want) fail(name, " must have shape ", dims, " = ", want, ", got ", t.sizes());
}

void expect_floating(const char* name, const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type())) fail(name, " must be a floating-point tensor, got ", t.scalar_type());
}

// A 3-d token tensor [T, ...] as the library's [1, T, ...]: the batch stride spans the tokens.
Strides4 batch1_strides4(const at::Tensor& t) { return {t.size(0) * t.stride(0), t.stride(0), t.stride(1), t.stride(2)}; }

}  // namespace

void prefill_translate_errors(const std::function<void()>& f) { rethrow_as_torch(kPrefillFunction, f); }

PrefillCall prepare_prefill(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                            const at::Tensor& B, const at::Tensor& C, int64_t chunk_size, const at::Tensor& cu_seqlens,
                            const std::optional<at::Tensor>& seq_idx, const std::optional<at::Tensor>& D,
                            const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                            bool dt_softplus, double dt_min, double dt_max, const at::Tensor& slots,
                            const std::optional<at::Tensor>& has_initial_state, int64_t pad_slot_id,
                            const at::Tensor& out, int64_t state_every,
                            const std::optional<at::Tensor>& intermediate_slots) {
  const std::pair<const char*, const at::Tensor*> all[] = {
      {"x", &x}, {"dt", &dt}, {"A", &A}, {"B", &B}, {"C", &C}, {"cu_seqlens", &cu_seqlens}, {"slots", &slots},
      {"out", &out}, {"seq_idx", seq_idx ? &*seq_idx : nullptr}, {"D", D ? &*D : nullptr}, {"z", z ? &*z : nullptr},
      {"dt_bias", dt_bias ? &*dt_bias : nullptr}, {"has_initial_state", has_initial_state ? &*has_initial_state : nullptr},
      {"intermediate_slots", intermediate_slots ? &*intermediate_slots : nullptr}};
  for (auto [name, t] : all)
    if (t && t->device() != state.device())
      fail(name, " is on ", t->device().str(), " but state is on ", state.device().str(),
           "; every tensor must be on the state's device");

  // Ranks and shapes: the cache gives H, P, N; x the tokens T; B the groups G; cu_seqlens the requests S.
  expect_rank("state", state, 4, "[nslots, nheads, headdim, dstate]");
  expect_rank("x", x, 3, "[tokens, nheads, headdim]");
  expect_rank("B", B, 3, "[tokens, ngroups, dstate]");
  expect_rank("cu_seqlens", cu_seqlens, 1, "[num_requests + 1]");
  const int64_t nslots = state.size(0), H = state.size(1), P = state.size(2), N = state.size(3);
  const int64_t T = x.size(0), G = B.size(1);
  if (cu_seqlens.size(0) < 2)
    fail("cu_seqlens must hold num_requests + 1 >= 2 offsets, got shape ", cu_seqlens.sizes());
  const int64_t S = cu_seqlens.size(0) - 1;
  expect_shape("x", x, {T, H, P}, "[tokens, nheads, headdim] (nheads, headdim: the state's)");
  expect_rank("dt", dt, 2, "[tokens, nheads]");
  expect_shape("dt", dt, {T, H}, "[tokens, nheads]");
  expect_rank("A", A, 1, "[nheads]");
  expect_shape("A", A, {H}, "[nheads]");
  expect_shape("B", B, {T, G, N}, "[tokens, ngroups, dstate] (dstate: the state's)");
  expect_rank("C", C, 3, "[tokens, ngroups, dstate]");
  expect_shape("C", C, {T, G, N}, "[tokens, ngroups, dstate] (B's shape)");
  expect_rank("out", out, 3, "[tokens, nheads, headdim]");
  expect_shape("out", out, {T, H, P}, "[tokens, nheads, headdim] (x's shape)");
  if (z) {
    expect_rank("z", *z, 3, "[tokens, nheads, headdim]");
    expect_shape("z", *z, {T, H, P}, "[tokens, nheads, headdim] (x's shape)");
  }
  if (dt_bias) {
    expect_rank("dt_bias", *dt_bias, 1, "[nheads]");
    expect_shape("dt_bias", *dt_bias, {H}, "[nheads]");
  }
  if (D && !(D->dim() == 1 && D->size(0) == H) && !(D->dim() == 2 && D->size(0) == H && D->size(1) == P))
    fail("D must have shape [nheads] = [", H, "] or [nheads, headdim] = [", H, ", ", P, "], got ", D->sizes());
  if (seq_idx) {
    expect_rank("seq_idx", *seq_idx, 1, "[tokens]");
    expect_shape("seq_idx", *seq_idx, {T}, "[tokens]");
  }
  expect_rank("slots", slots, 1, "[num_requests]");
  expect_shape("slots", slots, {S}, "[num_requests] (cu_seqlens has num_requests + 1 entries)");
  if (has_initial_state) {
    expect_rank("has_initial_state", *has_initial_state, 1, "[num_requests]");
    expect_shape("has_initial_state", *has_initial_state, {S}, "[num_requests] (slots' shape)");
  }
  if (intermediate_slots) {
    expect_rank("intermediate_slots", *intermediate_slots, 2, "[num_requests, max_intermediate]");
    if (intermediate_slots->size(0) != S)
      fail("intermediate_slots must have shape [num_requests, max_intermediate] = [", S, ", M], got ",
           intermediate_slots->sizes());
    if (intermediate_slots->size(1) == 0 && state_every > 0)  // (its data pointer would be null: "not given")
      fail("intermediate_slots must have at least one column (a slot per stored state) with state_every ",
           state_every, ", got shape ", intermediate_slots->sizes());
  }

  // dtypes: x, B, C, z, out share one of fp32/fp16/bf16; dt its own; the cache fp32/fp16/bf16.
  const DType dtype = float_dtype("x", x);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"B", &B}, {"C", &C}, {"out", &out}, {"z", z ? &*z : nullptr}})
    if (t && t->scalar_type() != x.scalar_type())
      fail(name, " must have x's dtype ", x.scalar_type(), ", got ", t->scalar_type());
  const DType dt_dtype = float_dtype("dt", dt);
  const DType state_dtype = float_dtype("state", state);
  expect_floating("A", A);
  if (D) expect_floating("D", *D);
  if (dt_bias) expect_floating("dt_bias", *dt_bias);
  if (cu_seqlens.scalar_type() != at::kInt && cu_seqlens.scalar_type() != at::kLong)
    fail("cu_seqlens must be an int32 or int64 tensor, got ", cu_seqlens.scalar_type());
  if (seq_idx && seq_idx->scalar_type() != at::kInt && seq_idx->scalar_type() != at::kLong)
    fail("seq_idx must be an int32 or int64 tensor, got ", seq_idx->scalar_type());
  // Slots are int32 in the library (as in vLLM's cache indices); no narrowing copy that could wrap.
  if (slots.scalar_type() != at::kInt) fail("slots must be an int32 tensor, got ", slots.scalar_type());
  if (intermediate_slots && intermediate_slots->scalar_type() != at::kInt)
    fail("intermediate_slots must be an int32 tensor, got ", intermediate_slots->scalar_type());
  if (has_initial_state && has_initial_state->scalar_type() != at::kBool && has_initial_state->scalar_type() != at::kByte)
    fail("has_initial_state must be a bool or uint8 tensor, got ", has_initial_state->scalar_type());
  // The cache and out are written in place: no copies, so their rows must already be contiguous.
  if (N > 1 && state.stride(3) != 1)
    fail("state's last dimension must be contiguous (stride 1), got strides ", state.strides());
  if (P > 1 && out.stride(2) != 1) fail("out's last dimension must be contiguous (stride 1), got strides ", out.strides());
  const int32_t pad = static_cast<int32_t>(pad_slot_id);
  if (pad != pad_slot_id) fail("pad_slot_id must fit in int32, got ", pad_slot_id);

  PrefillCall call;
  PrefillParams& p = call.params;
  ForwardParams& f = p.fwd;
  f.batch = 1, f.seqlen = T, f.nheads = H, f.headdim = P, f.ngroups = G, f.dstate = N;
  f.chunk_size = chunk_size;
  f.dtype = dtype, f.dt_dtype = dt_dtype;
  f.dt_softplus = dt_softplus;
  // dt_limit judged as given, before it is narrowed to fwd's floats (which validate(PrefillParams)
  // sees), its Error worded as that validate words fwd's ("fwd: ...").
  prefill_translate_errors([&] {
    try {
      std::tie(f.dt_min, f.dt_max) = float_dt_limit(dt_min, dt_max);
    } catch (const Error& e) {
      throw Error(std::string("fwd: ") + e.what());
    }
  });
  auto keep = [&](at::Tensor t) {
    call.keep.push_back(t);
    return t;
  };
  const at::Tensor xk = keep(last_dim_contiguous(x)), Bk = keep(last_dim_contiguous(B)), Ck = keep(last_dim_contiguous(C));
  f.x = xk.data_ptr(), f.x_stride = batch1_strides4(xk);
  f.B = Bk.data_ptr(), f.B_stride = batch1_strides4(Bk);
  f.C = Ck.data_ptr(), f.C_stride = batch1_strides4(Ck);
  const at::Tensor dtk = keep(last_dim_contiguous(dt));
  f.dt = dtk.data_ptr(), f.dt_stride = {dtk.size(0) * dtk.stride(0), dtk.stride(0), dtk.stride(1)};
  f.A = keep(A.to(at::kFloat).contiguous()).data_ptr<float>();
  if (D) {
    f.D_layout = D->dim() == 1 ? DLayout::kPerHead : DLayout::kPerHeadDim;
    f.D = keep(D->to(at::kFloat).contiguous()).data_ptr<float>();
  }
  if (z) {
    const at::Tensor zk = keep(last_dim_contiguous(*z));
    f.z = zk.data_ptr(), f.z_stride = batch1_strides4(zk);
  }
  if (dt_bias) f.dt_bias = keep(dt_bias->to(at::kFloat).contiguous()).data_ptr<float>();
  if (seq_idx) {
    const at::Tensor s = keep(int32_seq_idx(*seq_idx, [](const std::string& message) { fail(message); }).contiguous());
    f.seq_idx = s.data_ptr<int32_t>(), f.seq_idx_stride = {s.size(0), 1};
  }
  f.cu_seqlens = keep(cu_seqlens.to(at::kLong).contiguous()).data_ptr<int64_t>();
  f.nseqs = S;
  f.y = out.data_ptr(), f.y_stride = batch1_strides4(out);

  p.state = state.data_ptr(), p.state_stride = strides4(state);
  p.state_dtype = state_dtype;
  p.nslots = nslots;
  p.slots = keep(slots.contiguous()).data_ptr<int32_t>();
  if (has_initial_state)
    p.has_initial_state = static_cast<const uint8_t*>(keep(has_initial_state->contiguous()).data_ptr());
  p.pad_slot_id = pad;
  p.state_every = state_every;  // its rules (a multiple of chunk_size, with intermediate_slots) are validate's
  if (intermediate_slots) {
    p.intermediate_slots = keep(intermediate_slots->contiguous()).data_ptr<int32_t>();
    p.max_intermediate = intermediate_slots->size(1);
  }
  return call;
}

namespace {

// testing::prefill_rel_l2_tolerance for torch dtypes (the op mamba2ssd::prefill_tolerance).
double prefill_tolerance(at::ScalarType dtype, at::ScalarType state_dtype) {
  auto d = [](at::ScalarType t) {
    const std::optional<DType> v = to_dtype(t);
    TORCH_CHECK_VALUE(v, std::string("prefill_tolerance: dtype must be float32, float16 or bfloat16, got ") +
                             c10::toString(t));
    return *v;
  };
  return testing::prefill_rel_l2_tolerance(d(dtype), d(state_dtype));
}

// The call's sizes by the library's rules (validate_sizes(PrefillParams)), which mamba2ssd.prefill runs
// when allocating its out (x's shape, [T, H, P]) failed: past them the ValueError naming them, not
// the allocator's error.
void validate_prefill_sizes(int64_t tokens, int64_t nheads, int64_t headdim, int64_t ngroups, int64_t dstate,
                            int64_t nslots, int64_t chunk_size) {
  PrefillParams p;
  ForwardParams& f = p.fwd;
  f.batch = 1, f.seqlen = tokens, f.nheads = nheads, f.headdim = headdim, f.ngroups = ngroups, f.dstate = dstate;
  f.chunk_size = chunk_size;
  p.nslots = nslots;
  prefill_translate_errors([&] { validate_sizes(p); });
}

// The op's CPU kernel: prefill_cpu (it validates and checks the slots before writing anything),
// torch's thread count.
void prefill_kernel_cpu(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                        const at::Tensor& B, const at::Tensor& C, int64_t chunk_size, const at::Tensor& cu_seqlens,
                        const std::optional<at::Tensor>& seq_idx, const std::optional<at::Tensor>& D,
                        const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus,
                        double dt_min, double dt_max, const at::Tensor& slots,
                        const std::optional<at::Tensor>& has_initial_state, int64_t pad_slot_id, const at::Tensor& out,
                        int64_t state_every, const std::optional<at::Tensor>& intermediate_slots) {
  PrefillCall call = prepare_prefill(state, x, dt, A, B, C, chunk_size, cu_seqlens, seq_idx, D, z, dt_bias, dt_softplus,
                                     dt_min, dt_max, slots, has_initial_state, pad_slot_id, out, state_every,
                                     intermediate_slots);
  prefill_translate_errors([&] { prefill_cpu(call.params, at::get_num_threads()); });
}

}  // namespace
}  // namespace mamba2ssd::binding

TORCH_LIBRARY_FRAGMENT(mamba2ssd, m) {
  // The packed prefill (include/mamba2ssd/mamba2ssd.h, "Packed prefill") in vLLM's varlen layout:
  // x [T, H, P], requests by cu_seqlens [S+1]; request s reads cache slot slots[s] (zero where
  // has_initial_state[s] is false) and stores its state after its last token there. state
  // [nslots, H, P, N] and out [T, H, P] are written in place; dt_limit = (dt_min, dt_max). With
  // state_every = k > 0, request s also stores its state after token m*k to slot intermediate_slots[s, m-1]
  // ([S, M] int32), for m <= M.
  m.def(
      "prefill(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size, "
      "Tensor cu_seqlens, Tensor? seq_idx, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, float dt_min, "
      "float dt_max, Tensor slots, Tensor? has_initial_state, int pad_slot_id, Tensor(b!) out, int state_every=0, "
      "Tensor? intermediate_slots=None) -> ()");
  // Relative L2 tolerance of the prefill's y and stored states against the fp64 oracle
  // (src/testing/tolerance.h, prefill_rel_l2_tolerance), for the Python tests.
  m.def("prefill_tolerance(ScalarType dtype, ScalarType state_dtype) -> float",
        &mamba2ssd::binding::prefill_tolerance);
  // mamba2ssd.prefill's check when allocating out failed (x's shape [tokens, nheads, headdim]).
  m.def("_validate_prefill_sizes(int tokens, int nheads, int headdim, int ngroups, int dstate, int nslots, "
        "int chunk_size) -> ()",
        &mamba2ssd::binding::validate_prefill_sizes);
}

TORCH_LIBRARY_IMPL(mamba2ssd, CPU, m) { m.impl("prefill", &mamba2ssd::binding::prefill_kernel_cpu); }
