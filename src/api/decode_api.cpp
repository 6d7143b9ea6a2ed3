// The decode step's API pieces: the host backends' slot checks and the backend choice.
#include <string>
#include <unordered_map>
#include <utility>

#include "api/internal.h"
#include "common/decode_slots.h"
#include "common/text.h"

namespace mamba2ssd {
namespace detail {
namespace {

std::string dst_entry(const DecodeParams& p, int64_t b, int64_t t) {
  if (!p.dst_state_batch_indices) return concat("state_batch_indices[", b, "] (stored in place)");
  return concat("dst_state_batch_indices[", b, ", ", t, "]");
}

}  // namespace

void check_decode_slots_host(const DecodeParams& p) {
  const DecodeSlots s = decode_slots(p);
  auto in_range = [&](int64_t v) { return v == p.pad_slot_id || (v >= 0 && v < p.nslots); };
  auto bad = [&](const std::string& entry, int64_t v) {
    throw Error(concat(entry, " = ", v, " is outside the cache [0, nslots ", p.nslots, ") and is not pad_slot_id ",
                       p.pad_slot_id));
  };
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.state_batch_indices && !in_range(p.state_batch_indices[b]))
      bad(concat("state_batch_indices[", b, "]"), p.state_batch_indices[b]);
    if (p.dst_state_batch_indices)
      for (int64_t t = 0; t < p.ntokens; ++t) {
        const int64_t v = p.dst_state_batch_indices[b * s.dst_s0 + t * s.dst_s1];
        if (!in_range(v)) bad(concat("dst_state_batch_indices[", b, ", ", t, "]"), v);
      }
  }
  // Aliasing: each slot stored to by one request only, and not read by another.
  std::unordered_map<int32_t, std::pair<int64_t, int64_t>> writer;  // slot -> (request, token)
  for (int64_t b = 0; b < p.batch; ++b) {
    const int32_t r = read_slot(s, b);
    if (r < 0) continue;
    for (int64_t t = 0; t < p.ntokens; ++t) {
      const int32_t d = dst_slot(s, b, t, r);
      if (d < 0) continue;
      auto [it, fresh] = writer.emplace(d, std::make_pair(b, t));
      if (!fresh && it->second.first != b)
        throw Error(concat(dst_entry(p, it->second.first, it->second.second), " and ", dst_entry(p, b, t),
                           " both store to slot ", d, ": two requests may not store to one slot"));
    }
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int32_t r = read_slot(s, b);
    if (r < 0) continue;
    auto it = writer.find(r);
    if (it != writer.end() && it->second.first != b)
      throw Error(concat(dst_entry(p, it->second.first, it->second.second), " stores to slot ", r, ", which request ",
                         b, " reads (", p.state_batch_indices ? concat("state_batch_indices[", b, "]") : "its own index",
                         "): a request may not store to a slot that another request reads"));
  }
}

void require_host_pointers(const DecodeParams& p, const char* backend) {
  const std::pair<const char*, const void*> ptrs[] = {
      {"state", p.state}, {"x", p.x}, {"dt", p.dt}, {"A", p.A}, {"B", p.B}, {"C", p.C}, {"D", p.D}, {"z", p.z},
      {"dt_bias", p.dt_bias}, {"state_batch_indices", p.state_batch_indices},
      {"dst_state_batch_indices", p.dst_state_batch_indices}, {"out", p.out}};
  for (auto [name, ptr] : ptrs)
    if (ptr && is_device_pointer(ptr))
      throw Error(std::string(name) + " is device memory, but backend " + backend + " needs host memory");
}

}  // namespace detail

Backend decode(const DecodeParams& p, Backend backend, void* stream) {
  validate(p);
  if (backend == Backend::kAuto) backend = is_device_pointer(p.state) ? Backend::kCuda : Backend::kCpu;
  switch (backend) {
    case Backend::kReference: decode_reference(p); break;
    case Backend::kCpu: decode_cpu(p); break;
    case Backend::kCuda: detail::decode_cuda_blocking(p, stream); break;
    default: throw Error("backend: unknown value " + std::to_string(static_cast<int>(backend)));
  }
  return backend;
}

}  // namespace mamba2ssd
