// Checked mode (ForwardParams::check_inputs): the rules on the contents of cu_seqlens and seq_idx,
// shared by the device check (src/cuda/fwd/check_inputs.cu), which records the first broken one in
// the caller's input_status, and the host (check_input_status, the host backends), which names it.
#pragma once

#include <cstdint>
#include <string>

namespace mamba2ssd::detail {

// input_status = {rule, row, index, value}; rule 0: every entry is good. The order of the rules
// is the order of the tensors, so that the first bad entry is the smallest (tensor, index, rule).
enum InputRule : int64_t {
  kInputsGood = 0,
  kCuSeqlensFirstNotZero = 1,   // cu_seqlens[0] != 0
  kCuSeqlensDecreasing = 2,     // cu_seqlens[s] < cu_seqlens[s - 1]
  kCuSeqlensPastTheEnd = 3,     // cu_seqlens[s] > seqlen
  kCuSeqlensLastNotSeqlen = 4,  // cu_seqlens[S] != seqlen
  kSeqIdxDecreasing = 5,        // seq_idx[b, t] < seq_idx[b, t - 1]
};

// "cu_seqlens[2] = 100 is less than the entry before it: cu_seqlens must be non-decreasing".
inline std::string input_rule_message(int64_t rule, int64_t row, int64_t index, int64_t value) {
  const std::string v = std::to_string(value), i = std::to_string(index);
  switch (rule) {
    case kCuSeqlensFirstNotZero: return "cu_seqlens[0] = " + v + ": cu_seqlens must start at 0";
    case kCuSeqlensDecreasing:
      return "cu_seqlens[" + i + "] = " + v + " is less than the entry before it: cu_seqlens must be non-decreasing";
    case kCuSeqlensPastTheEnd: return "cu_seqlens[" + i + "] = " + v + " is past the end (seqlen)";
    case kCuSeqlensLastNotSeqlen: return "cu_seqlens[" + i + "] = " + v + ": the last offset must equal seqlen";
    case kSeqIdxDecreasing:
      return "seq_idx[" + std::to_string(row) + ", " + i + "] = " + v +
             " is less than the id before it: seq_idx must be non-decreasing along each row";
    default: return "input_status holds an unknown rule " + std::to_string(rule) + " (not written by mamba2ssd?)";
  }
}

}  // namespace mamba2ssd::detail
