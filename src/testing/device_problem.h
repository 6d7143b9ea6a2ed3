// A HostProblem mirrored on the GPU: every buffer copied to device memory, a workspace for
// forward_cuda, poisoning and download of the outputs. Built only with the CUDA backend.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "testing/backward_problem.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {

class DeviceProblem {
 public:
  explicit DeviceProblem(const HostProblem& host);
  ~DeviceProblem();
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;

  ForwardParams params() const;  // device pointers, the host problem's strides
  void* workspace() const { return workspace_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // Runs forward_cuda on `stream` (nullptr: the default stream) without synchronizing. The workspace
  // grows first if the host problem's config now needs more (e.g. another CUDA path).
  void launch(void* stream = nullptr);

  // Fills every output with NaN bytes (0xff), synchronously.
  void poison_outputs();
  // Copies the outputs back (y, final_states, varlen_states), synchronously.
  std::map<std::string, std::vector<uint8_t>> download_outputs() const;

 private:
  const HostProblem& host_;
  std::map<std::string, void*> device_;
  void ensure_workspace();
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

// A BackwardProblem mirrored on the GPU: the forward problem's buffers and the backward's
// (cotangents and gradients) copied to device memory, a workspace for backward_cuda.
class DeviceBackwardProblem {
 public:
  explicit DeviceBackwardProblem(const BackwardProblem& host);
  ~DeviceBackwardProblem();
  DeviceBackwardProblem(const DeviceBackwardProblem&) = delete;
  DeviceBackwardProblem& operator=(const DeviceBackwardProblem&) = delete;

  BackwardParams params() const;  // device pointers, the host problem's strides
  void* workspace() const { return workspace_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  // Runs backward_cuda on `stream` (nullptr: the default stream) without synchronizing.
  void launch(void* stream = nullptr);
  // Runs forward_cuda on the problem's inputs (its y and final states written, and the states it
  // saves for the backward) without synchronizing; for problems that save them
  // (BackwardProblem::save_states).
  void launch_forward(void* stream = nullptr);
  // Fills every gradient buffer with NaN bytes (0xff), synchronously.
  void poison_gradients();
  // The same for the forward's outputs (y, final states) and the saved states, and their copy back
  // (by buffer name), for launch_forward.
  void poison_forward_outputs();
  std::map<std::string, std::vector<uint8_t>> download_forward_outputs() const;
  // Copies the backward's buffers back (gradients and cotangents, by buffer name), synchronously.
  std::map<std::string, std::vector<uint8_t>> download() const;

 private:
  const BackwardProblem& host_;
  std::map<std::string, void*> device_;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  void* forward_workspace_ = nullptr;  // launch_forward's
  std::size_t forward_workspace_bytes_ = 0;
};

}  // namespace mamba2ssd::testing
