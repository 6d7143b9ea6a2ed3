// A HostDecodeProblem mirrored on the GPU: every buffer in device memory, the cache and out each
// between two guard regions of a known byte pattern (one whole slot's bytes or more, so that a
// store to slot nslots or -1 would land in them), launches of decode_cuda, poisoning, reset and
// download. Built only with the CUDA backend.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "testing/decode_problem.h"

namespace mamba2ssd::testing {

class DeviceDecodeProblem {
 public:
  explicit DeviceDecodeProblem(const HostDecodeProblem& host);
  ~DeviceDecodeProblem();
  DeviceDecodeProblem(const DeviceDecodeProblem&) = delete;
  DeviceDecodeProblem& operator=(const DeviceDecodeProblem&) = delete;

  DecodeParams params() const;               // device pointers, the host problem's strides
  void launch(void* stream = nullptr);       // decode_cuda, no synchronization
  void poison_outputs();                     // out to NaN bytes (0xff), synchronously
  void reset_state();                        // the cache back to the host problem's initial_state
  // out and the cache copied back (as the host problem lays them out), synchronously.
  std::map<std::string, std::vector<uint8_t>> download() const;
  // Empty if every guard byte is intact, else which guard changed and where first.
  std::string guard_damage() const;
  std::size_t state_bytes() const { return host_.buffers.at("state").size(); }

 private:
  static constexpr uint8_t kGuardByte = 0xa5;
  const HostDecodeProblem& host_;
  std::map<std::string, uint8_t*> base_;  // allocations: guard, buffer, guard
  std::map<std::string, std::size_t> guard_;
  uint8_t* ptr(const std::string& name) const { return base_.at(name) + guard_.at(name); }
};

}  // namespace mamba2ssd::testing
