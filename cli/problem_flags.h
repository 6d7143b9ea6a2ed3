// The problem of `mamba2ssd run` and its flags, both ways: the ProblemConfig a command line asks for,
// and the flags that ask for a given ProblemConfig (how `fuzz` prints a failing case so that
// `mamba2ssd run` reproduces it). The two are inverses: config_from(Args::parse(kRun,
// run_flags(c))) == c for every valid c (tests/cli/problem_flags_test.cpp).
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

// The flags that make config_from return `config` (shape and dtypes always; features, layouts and
// the seed when they differ from the defaults; --path when not auto).
std::vector<std::string> run_flags(const testing::ProblemConfig& config);

// "mamba2ssd run --impl I <run_flags> --check-all --repeats 1": one case, checked in full, once.
std::string repro_command(const testing::ProblemConfig& config, Backend backend);

}  // namespace mamba2ssd::cli
