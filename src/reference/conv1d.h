// The fp64 oracle of the layer's causal convolution (Conv1dParams): dense results in double, for
// conv1d_reference and the tests.
#pragma once

#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::reference {

// out [b, L, C], dense.
std::vector<double> conv1d64(const Conv1dParams& p);

// dx [b, L, C] dense, dweight [C, W], dbias [C].
struct Conv1dGrads64 {
  std::vector<double> dx, dweight, dbias;
};
Conv1dGrads64 conv1d_backward64(const Conv1dBackwardParams& p);

}  // namespace mamba2ssd::reference
