// The problem of `mamba2ssd run`: the ProblemConfig a command line asks for.
#pragma once

#include <string>
#include <vector>

#include "args.h"
#include "mamba2ssd/mamba2ssd.h"
#include "testing/problem.h"

namespace mamba2ssd::cli {

// The shape, dtypes, features and seed flags of `run` as a ProblemConfig (cuda_path stays auto).
// Each flag is checked on its own (UsageError naming it), then the sizes as validate_sizes() sees
// them: a problem past the API's limits is a UsageError naming the shape flags given, before
// anything is allocated.
testing::ProblemConfig config_from(const Args& args);

}  // namespace mamba2ssd::cli
