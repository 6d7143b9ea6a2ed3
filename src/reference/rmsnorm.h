// The fp64 oracle of the layer's gated RMSNorm (GatedRmsNormParams): dense results in double, for
// gated_rmsnorm_reference and the tests.
#pragma once

#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::reference {

// out [rows, dim], dense.
std::vector<double> gated_rmsnorm64(const GatedRmsNormParams& p);

// dy and dz [rows, dim] dense (dz empty without z), dweight [dim]. dy_terms and dz_terms: the scale
// of the terms each element is a difference of (dv = r (dn - n mean(dn n)): r times the root sum of
// squares of dn and n mean, then the factors after it), for the tests: where dn is nearly parallel
// to n (a group of one feature) dv cancels to a small part of its terms, and fp32 loses digits in
// proportion. dz_terms is |dz| where dz is no difference (the gate after the norm).
struct RmsNormGrads64 {
  std::vector<double> dy, dz, dweight;
  std::vector<double> dy_terms, dz_terms;
};
RmsNormGrads64 gated_rmsnorm_backward64(const GatedRmsNormBackwardParams& p);

}  // namespace mamba2ssd::reference
