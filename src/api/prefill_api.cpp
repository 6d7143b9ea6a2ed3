// The packed prefill's API pieces: the host backends' checks of the contents (slots, intermediate
// slots, seq_idx) and the backend choice.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "api/internal.h"
#include "common/text.h"

namespace mamba2ssd {
namespace detail {

namespace {

// The intermediate slots (mamba2ssd.h, "Intermediate states"): every entry pad_slot_id or in the
// cache; each entry that is stored names a slot of its own. `owner`: the requests' slots -> request.
void check_intermediate_slots(const PrefillParams& p, const std::unordered_map<int32_t, int64_t>& owner) {
  const ForwardParams& f = p.fwd;
  const int64_t M = p.max_intermediate, k = p.state_every;
  std::unordered_map<int32_t, std::pair<int64_t, int64_t>> stored;  // slot -> the entry (s, m) storing there
  for (int64_t s = 0; s < f.nseqs; ++s) {
    const int64_t len = f.cu_seqlens[s + 1] - f.cu_seqlens[s];
    // Entries [0, boundaries) are stored (boundary m + 1 after token (m + 1) * k); a pad stores none.
    const int64_t boundaries = p.slots[s] == p.pad_slot_id ? 0 : std::min(M, len / k);
    for (int64_t m = 0; m < M; ++m) {
      const int32_t v = p.intermediate_slots[s * M + m];
      if (v == p.pad_slot_id) continue;
      if (v < 0 || v >= p.nslots)
        throw Error(concat("intermediate_slots[", s, ", ", m, "] = ", v, " is outside the cache [0, nslots ",
                           p.nslots, ") and is not pad_slot_id ", p.pad_slot_id));
      if (m >= boundaries) continue;
      // The one shared slot allowed: the boundary at the last token of a request whose length is a
      // multiple of k, in the request's own slot. Both stores write its final state, the same bits.
      const bool last = m + 1 == len / k && len % k == 0;
      if (auto it = owner.find(v); it != owner.end() && !(it->second == s && last))
        throw Error(concat("slots[", it->second, "] and intermediate_slots[", s, ", ", m, "] are both slot ", v,
                           ": an intermediate state stored there would clobber the state request ", it->second,
                           " reads or stores"));
      if (auto [it, fresh] = stored.emplace(v, std::pair{s, m}); !fresh)
        throw Error(concat("intermediate_slots[", it->second.first, ", ", it->second.second,
                           "] and intermediate_slots[", s, ", ", m, "] are both slot ", v,
                           ": two stored intermediate states may not share a slot"));
    }
  }
}

}  // namespace

void check_prefill_host(const PrefillParams& p, const char* backend) {
  const ForwardParams& f = p.fwd;
  require_host_pointers(f, backend);
  for (auto [name, ptr] : {std::pair<const char*, const void*>{"state", p.state}, {"slots", p.slots},
                           {"has_initial_state", p.has_initial_state}, {"intermediate_slots", p.intermediate_slots}})
    if (ptr && is_device_pointer(ptr))
      throw Error(std::string(name) + " is device memory, but backend " + backend + " needs host memory");
  validate_cu_seqlens_host(f);
  // The requests are cu_seqlens'; seq_idx, which the engines pass too, must say the same: its id
  // changes exactly where a (non-empty) request starts. Its one row is named by token alone, as the
  // engines hold it ([T]) and as cu_seqlens and slots are named.
  if (f.seq_idx)
    for (int64_t t = 1, s = 0; t < f.seqlen; ++t) {
      while (f.cu_seqlens[s + 1] <= t) ++s;
      const int64_t id = f.seq_idx[t * f.seq_idx_stride.s1], prev = f.seq_idx[(t - 1) * f.seq_idx_stride.s1];
      const bool starts = f.cu_seqlens[s] == t;
      if ((id != prev) != starts)
        throw Error(concat("seq_idx[", t, "] = ", id, " after ", prev, starts ? " at the start of request " :
                           " inside request ", s, ": seq_idx must change exactly where cu_seqlens starts a request"));
    }
  std::unordered_map<int32_t, int64_t> owner;  // slot -> the request that reads and writes it
  for (int64_t s = 0; s < f.nseqs; ++s) {
    const int32_t v = p.slots[s];
    if (v == p.pad_slot_id) continue;
    if (v < 0 || v >= p.nslots)
      throw Error(concat("slots[", s, "] = ", v, " is outside the cache [0, nslots ", p.nslots,
                         ") and is not pad_slot_id ", p.pad_slot_id));
    auto [it, fresh] = owner.emplace(v, s);
    if (!fresh)
      throw Error(concat("slots[", it->second, "] and slots[", s, "] are both slot ", v,
                         ": two requests may not share a slot (each stores its state there)"));
  }
  if (p.state_every > 0) check_intermediate_slots(p, owner);
}

}  // namespace detail

Backend prefill(const PrefillParams& p, Backend backend, void* stream) {
  validate(p);
  if (backend == Backend::kAuto) backend = is_device_pointer(p.state) ? Backend::kCuda : Backend::kCpu;
  switch (backend) {
    case Backend::kReference: prefill_reference(p); break;
    case Backend::kCpu: prefill_cpu(p); break;
    case Backend::kCuda: detail::prefill_cuda_blocking(p, stream); break;
    default: throw Error("backend: unknown value " + std::to_string(static_cast<int>(backend)));
  }
  return backend;
}

}  // namespace mamba2ssd
