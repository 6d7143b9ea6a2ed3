// The decode step's slot rules (include/mamba2ssd/mamba2ssd.h, "Decode"), shared by the oracle, the
// CPU path, the test problems and the CUDA kernel: which slot a request reads and where the state
// after each of its tokens is stored. -1 means none. An entry that is pad_slot_id, or outside
// [0, nslots), is none: the host backends refuse the latter before they get here
// (detail::check_decode_slots_host); the CUDA kernel, which cannot refuse, skips it.
#pragma once

#include <cstdint>

#include "common/dt.h"  // M2_HD
#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd {

// The slot indices and sizes the rules read, as plain values (a kernel argument too).
// (What read_slot reads comes first: a kernel's first argument reads are a request's critical path.)
struct DecodeSlots {
  const int32_t* read;  // [b] or null: slot b
  int64_t nslots;
  int32_t pad;
  const int32_t* dst;   // [b, T] or null: the last token's state back to the read slot
  int64_t dst_s0, dst_s1;
  int64_t ntokens;
};

inline DecodeSlots decode_slots(const DecodeParams& p) {
  return {p.state_batch_indices, p.nslots, p.pad_slot_id, p.dst_state_batch_indices,
          p.dst_state_batch_indices_stride.s0, p.dst_state_batch_indices_stride.s1, p.ntokens};
}

M2_HD int32_t usable_slot(const DecodeSlots& s, int64_t slot) {
  return slot == s.pad || slot < 0 || slot >= s.nslots ? -1 : static_cast<int32_t>(slot);
}

// The slot request b reads, or -1: the request is skipped (out rows zero, nothing stored). Without
// state_batch_indices request b reads slot b whatever pad_slot_id is: the pad marks index entries
// only, as in mamba_ssm (validate() has nslots >= batch).
M2_HD int32_t read_slot(const DecodeSlots& s, int64_t b) {
  if (!s.read) return b < s.nslots ? static_cast<int32_t>(b) : -1;
  return usable_slot(s, s.read[b]);
}

// The slot that receives the state after token t of request b (reading slot `read`, not -1), or -1.
M2_HD int32_t dst_slot(const DecodeSlots& s, int64_t b, int64_t t, int32_t read) {
  if (!s.dst) return t == s.ntokens - 1 ? read : -1;
  return usable_slot(s, s.dst[b * s.dst_s0 + t * s.dst_s1]);
}

}  // namespace mamba2ssd
