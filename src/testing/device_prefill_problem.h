// A HostPrefillProblem mirrored on the GPU: the forward's buffers (DeviceProblem), the cache between
// two guard regions of a known byte pattern (one whole slot's bytes or more, so that a store to slot
// nslots or -1 would land in them) and the slot arrays in device memory; launches of prefill_cuda
// with a workspace of its own, reset and download back into the host problem (so that
// compare_prefill judges the GPU's results). Built only with the CUDA backend.
#pragma once

#include <cstdint>
#include <string>

#include "testing/device_problem.h"
#include "testing/prefill_problem.h"

namespace mamba2ssd::testing {

class DevicePrefillProblem {
 public:
  explicit DevicePrefillProblem(const HostPrefillProblem& host);
  ~DevicePrefillProblem();
  DevicePrefillProblem(const DevicePrefillProblem&) = delete;
  DevicePrefillProblem& operator=(const DevicePrefillProblem&) = delete;

  PrefillParams params() const;          // device pointers, the host problem's strides and options
  // prefill_cuda on `path` (fwd.cuda_path: auto, hopper or three_kernel), no synchronization. The
  // workspace fits both paths.
  void launch(void* stream = nullptr, CudaPath path = CudaPath::kAuto);
  void reset();                          // y poisoned with NaN, the cache back to as drawn, synchronously
  // y and the cache copied into `into` (a copy of the host problem), synchronously.
  void download(HostPrefillProblem& into) const;
  // Empty if every guard byte of the cache is intact, else where the first changed.
  std::string guard_damage() const;
  std::size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  static constexpr uint8_t kGuardByte = 0xa5;
  const HostPrefillProblem& host_;
  DeviceProblem fwd_;
  uint8_t* state_base_ = nullptr;  // guard, cache, guard
  std::size_t guard_ = 0;
  int32_t* slots_ = nullptr;
  uint8_t* has_initial_state_ = nullptr;
  int32_t* intermediate_slots_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  uint8_t* state() const { return state_base_ + guard_; }
};

}  // namespace mamba2ssd::testing
