// The CUDA backward's entry points (work in progress: the kernels land next).
#include <string>

#include "api/internal.h"

namespace mamba2ssd {

std::size_t cuda_backward_workspace_bytes(const BackwardParams& p) {
  validate(p);
  return 0;
}

void backward_cuda(const BackwardParams& p, void*, std::size_t, void*) {
  validate(p);
  throw Error("backward_cuda: the CUDA backward is not built yet; use backend cpu");
}

}  // namespace mamba2ssd
