#include "testing/device_consistency.h"

#include <cuda_runtime_api.h>

#include "cuda/common/check.h"
#include "testing/device_problem.h"

namespace mamba2ssd::testing {
namespace {

// A device allocation freed at scope exit.
struct DeviceBytes {
  void* p = nullptr;
  std::size_t n = 0;
  void reserve(std::size_t bytes) {
    if (p && bytes <= n) return;
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(workspace)");
    cudaFree(p);
    p = nullptr;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc(consistency)");
    n = bytes;
  }
  ~DeviceBytes() { cudaFree(p); }
};

}  // namespace

std::vector<WayResult> run_ways_cuda(const ConsistencyConfig& config, const HostProblem& problem) {
  DeviceProblem dev(problem);
  DeviceBytes mid, workspace;
  mid.reserve(problem.buffers.at("final_states").size());
  Executor e;
  // A piece may need another workspace than the whole problem's: sized per call.
  e.forward = [&](const ForwardParams& p) {
    workspace.reserve(cuda_workspace_bytes(p));
    forward_cuda(p, workspace.p, workspace.n, nullptr);
  };
  e.decode = [](const DecodeParams& p) { decode_cuda(p, nullptr); };
  // The packed prefill's offsets and slot, uploaded before each call (cudaMemcpy from pageable
  // memory waits for the default stream, so the call before has read the previous ones).
  DeviceBytes meta, prefill_workspace;
  e.prefill = [&](PrefillParams p, const std::vector<int64_t>& cu, const std::vector<int32_t>& slots) {
    const std::size_t cu_bytes = cu.size() * sizeof(int64_t), slot_bytes = slots.size() * sizeof(int32_t);
    meta.reserve(cu_bytes + slot_bytes);
    cuda_check(cudaMemcpy(meta.p, cu.data(), cu_bytes, cudaMemcpyHostToDevice), "cudaMemcpy(cu_seqlens)");
    cuda_check(cudaMemcpy(static_cast<char*>(meta.p) + cu_bytes, slots.data(), slot_bytes, cudaMemcpyHostToDevice),
               "cudaMemcpy(slots)");
    p.fwd.cu_seqlens = static_cast<const int64_t*>(meta.p);
    p.slots = reinterpret_cast<const int32_t*>(static_cast<char*>(meta.p) + cu_bytes);
    prefill_workspace.reserve(cuda_prefill_workspace_bytes(p));
    prefill_cuda(p, prefill_workspace.p, prefill_workspace.n, nullptr);
  };
  e.copy = [](void* dst, const void* src, std::size_t n) {
    cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
  };
  e.fill = [](void* dst, uint8_t byte, std::size_t n) { cuda_check(cudaMemsetAsync(dst, byte, n, nullptr), "cudaMemsetAsync"); };
  e.download = [](const void* src, std::size_t n) {
    std::vector<uint8_t> h(n);
    cuda_check(cudaMemcpy(h.data(), src, n, cudaMemcpyDeviceToHost), "cudaMemcpy(download)");  // waits for the stream
    return h;
  };
  return run_ways(config, problem, dev.params(), static_cast<float*>(mid.p), e);
}

}  // namespace mamba2ssd::testing
