// The packed prefill's fp64 oracle: the forward's oracle (reference::forward64) on each request alone,
// from the request's starting state, so that the prefill's ground truth is the contract's
// recurrence itself, with nothing of the packing in between; the intermediate states are its states
// at the boundaries.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "api/internal.h"
#include "common/host_dtype.h"
#include "reference/reference.h"

namespace mamba2ssd {
namespace {

// The element `offset` elements past p in a buffer of dtype t.
template <typename T>
T* advance(T* p, int64_t offset, DType t) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + offset * static_cast<int64_t>(dtype_size(t)));
}

}  // namespace

void prefill_reference(const PrefillParams& p) {
  validate(p);
  detail::check_prefill_host(p, "reference");
  const ForwardParams& f = p.fwd;
  const int64_t H = f.nheads, P = f.headdim, N = f.dstate;
  const Strides4& ss = p.state_stride;
  auto cache_at = [&](int64_t slot, int64_t h, int64_t i, int64_t n) {
    return slot * ss.s0 + h * ss.s1 + i * ss.s2 + n * ss.s3;
  };
  auto store = [&](int32_t slot, const double* state) {  // state [H, P, N], rounded into the slot
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < N; ++n)
          host::store_double(p.state, cache_at(slot, h, i, n), p.state_dtype, state[(h * P + i) * N + n]);
  };
  std::vector<float> start(H * P * N);  // fp32 holds every cache dtype exactly
  for (int64_t s = 0; s < f.nseqs; ++s) {
    const int64_t t0 = f.cu_seqlens[s], len = f.cu_seqlens[s + 1] - t0;
    const int32_t slot = p.slots[s] == p.pad_slot_id ? -1 : p.slots[s];
    const bool reads = slot >= 0 && (!p.has_initial_state || p.has_initial_state[s]);
    // The intermediate states this request stores: boundaries 1 .. boundaries (mamba2ssd.h).
    const int64_t boundaries = slot < 0 || p.state_every == 0 ? 0 : std::min(p.max_intermediate, len / p.state_every);
    if (reads)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < P; ++i)
          for (int64_t n = 0; n < N; ++n)
            start[(h * P + i) * N + n] = host::load(p.state, cache_at(slot, h, i, n), p.state_dtype);
    std::vector<double> final_state(H * P * N, 0.0);
    if (reads) final_state.assign(start.begin(), start.end());  // a request of no tokens keeps it
    if (len > 0) {
      ForwardParams r = f;  // request s alone: tokens [t0, t0 + len) as a batch of one
      r.seqlen = len, r.cu_seqlens = nullptr, r.nseqs = 0, r.seq_idx = nullptr;
      r.check_inputs = false, r.input_status = nullptr;
      r.x = advance(f.x, t0 * f.x_stride.s1, f.dtype);
      r.dt = advance(f.dt, t0 * f.dt_stride.s1, f.dt_dtype);
      r.B = advance(f.B, t0 * f.B_stride.s1, f.dtype);
      r.C = advance(f.C, t0 * f.C_stride.s1, f.dtype);
      if (f.z) r.z = advance(f.z, t0 * f.z_stride.s1, f.dtype);
      r.y = advance(f.y, t0 * f.y_stride.s1, f.dtype);
      if (reads) r.initial_states = start.data(), r.initial_states_stride = contiguous_strides(1, H, P, N);
      reference::Inputs64 in = reference::load_inputs(r);
      // The boundaries' states: the oracle keeps the state at the last token of each packed sequence
      // of in.cu_seqlens (varlen_states), while only in.seq, one sequence here, resets it. So
      // cu_seqlens cut at tokens k, 2k, .. reads the states there, the recurrence untouched.
      if (boundaries > 0)
        for (int64_t m = 0; m <= boundaries; ++m) in.cu_seqlens.push_back(m * p.state_every);
      const reference::Outputs64 res = reference::forward64(in);
      for (int64_t t = 0; t < len; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < P; ++i)
            host::store_double(f.y, (t0 + t) * f.y_stride.s1 + h * f.y_stride.s2 + i, f.dtype,
                               res.y[(t * H + h) * P + i]);
      for (int64_t m = 0; m < boundaries; ++m)
        if (const int32_t v = p.intermediate_slots[s * p.max_intermediate + m]; v != p.pad_slot_id)
          store(v, &res.varlen_states[m * H * P * N]);
      final_state = res.final_states;
    }
    if (slot >= 0) store(slot, final_state.data());  // a pad stores nothing
  }
}

}  // namespace mamba2ssd
