#include "api/internal.h"
#include "cuda/check.h"

namespace mamba2ssd {
std::size_t cuda_workspace_bytes(const ForwardParams& p) {
  validate(p);
  return 0;
}
void forward_cuda(const ForwardParams& p, void*, std::size_t, void*) {
  validate(p);
  throw CudaError("forward_cuda: not built yet");
}
}  // namespace mamba2ssd
