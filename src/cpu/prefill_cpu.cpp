// The CPU packed prefill: forward_cpu's scan (cpu::scan_forward) over the packed requests, each
// starting from and storing to its cache slot (and its intermediate states to theirs), multithreaded
// over the forward's work items (head and a block of head dims) as a packed forward is.
#include <cstdint>
#include <vector>

#include "api/internal.h"
#include "cpu/forward_scan.h"

namespace mamba2ssd {

void prefill_cpu(const PrefillParams& p, int num_threads) {
  validate(p);
  detail::check_prefill_host(p, "cpu");  // from here on each slot belongs to one request at most
  const int64_t S = p.fwd.nseqs;
  std::vector<int32_t> read(S), write(S);
  for (int64_t s = 0; s < S; ++s) {
    write[s] = p.slots[s] == p.pad_slot_id ? -1 : p.slots[s];
    read[s] = write[s] >= 0 && (!p.has_initial_state || p.has_initial_state[s]) ? write[s] : -1;
  }
  cpu::SequenceStates seqs{p.state, p.state_stride, p.state_dtype, read.data(), write.data()};
  // Intermediate slots as the scan takes them: -1 for a pad entry, every entry of a pad request.
  std::vector<int32_t> boundary;
  if (p.state_every > 0) {
    const int64_t M = p.max_intermediate;
    boundary.assign(p.intermediate_slots, p.intermediate_slots + S * M);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t m = 0; m < M; ++m)
        if (write[s] < 0 || boundary[s * M + m] == p.pad_slot_id) boundary[s * M + m] = -1;
    seqs.every = p.state_every, seqs.boundary = boundary.data(), seqs.max_boundaries = M;
  }
  ForwardParams f = p.fwd;
  f.seq_idx = nullptr;  // checked to agree with cu_seqlens, which the scan then follows
  cpu::scan_forward(f, &seqs, num_threads);
}

}  // namespace mamba2ssd
