// The fp64 oracle of the layer's gated RMSNorm (GatedRmsNormParams): dense results in double, for
// gated_rmsnorm_reference and the tests.
#pragma once

#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::reference {

// out [rows, dim], dense.
std::vector<double> gated_rmsnorm64(const GatedRmsNormParams& p);

// dy and dz [rows, dim] dense (dz empty without z), dweight [dim].
struct RmsNormGrads64 {
  std::vector<double> dy, dz, dweight;
};
RmsNormGrads64 gated_rmsnorm_backward64(const GatedRmsNormBackwardParams& p);

}  // namespace mamba2ssd::reference
