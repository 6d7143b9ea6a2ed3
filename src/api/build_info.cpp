// build_info(): the version and the CUDA configuration this library was built with.
#include "api/build_config.h"
#include "mamba2ssd/mamba2ssd.h"
#include "mamba2ssd/version.h"

#ifdef MAMBA2SSD_HAVE_CUDA
#include <cuda_runtime_api.h>  // CUDART_VERSION
#endif

namespace mamba2ssd {

BuildInfo build_info() {
  BuildInfo info{};
  info.version = MAMBA2SSD_VERSION_STRING;
#ifdef MAMBA2SSD_HAVE_CUDA
  info.cuda = true;
  info.cuda_version = CUDART_VERSION;
  info.gpu_targets = MAMBA2SSD_GPU_TARGETS;
#else
  info.cuda = false;
  info.cuda_version = 0;
  info.gpu_targets = "";
#endif
#ifdef MAMBA2SSD_HAVE_TILE
  info.cuda_tile = true;
#else
  info.cuda_tile = false;
#endif
  return info;
}

}  // namespace mamba2ssd
