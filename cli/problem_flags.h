// The problems of `mamba2ssd run`, `prefill` and `decode` and their flags, both ways: the config a
// command line asks for, and the flags that ask for a given config (how `fuzz` prints a failing case
// so that the command reproduces it). The two are inverses: config_from(Args::parse(kRun,
// run_flags(c))) == c for every valid c, and likewise for prefill and decode
// (tests/cli/problem_flags_test.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "args.h"
#include "mamba2ssd/mamba2ssd.h"
#include "testing/decode_problem.h"
#include "testing/prefill_problem.h"
#include "testing/problem.h"

namespace mamba2ssd::cli {

// --dtype-like flags: fp32, fp16 or bf16.
DType dtype_flag(const Args& a, const char* name, DType fallback);

// The flags of the heads, the dtype and the features that run, decode and prefill share, read into
// any config that names its fields as testing::ProblemConfig does (nheads, headdim, dstate,
// ngroups, dtype, D_layout, z, dt_bias, dt_softplus, dt_min, dt_max), from the config's own
// defaults; each checked on its own (UsageError naming it).
template <typename Config>
void read_head_flags(const Args& a, Config& c, int64_t max_heads) {
  c.nheads = a.get_int("--heads", c.nheads, 1, max_heads);
  c.headdim = a.get_int("--headdim", c.headdim, INT64_MIN, INT64_MAX);
  if (c.headdim < 16 || c.headdim > 128 || c.headdim % 16 != 0)
    bad_flag("--headdim", "expected a multiple of 16 in [16, 128], got " + std::to_string(c.headdim));
  c.dstate = a.get_int("--dstate", c.dstate, INT64_MIN, INT64_MAX);
  if (c.dstate < 16 || c.dstate > 256 || c.dstate % 16 != 0)
    bad_flag("--dstate", "expected a multiple of 16 in [16, 256], got " + std::to_string(c.dstate));
  c.ngroups = a.get_int("--groups", c.ngroups, 1, max_heads);
  if (c.nheads % c.ngroups != 0)
    bad_flag("--groups", "expected a divisor of --heads " + std::to_string(c.nheads) + ", got " +
                             std::to_string(c.ngroups));
  c.dtype = dtype_flag(a, "--dtype", c.dtype);
  if (a.has("--D-dim") && a.has("--no-D")) bad_flag("--no-D", "cannot be combined with --D-dim");
  if (a.has("--D-dim")) c.D_layout = DLayout::kPerHeadDim;
  if (a.has("--no-D")) c.D_layout = DLayout::kNone;
  c.z = a.has("--z");
  c.dt_bias = a.has("--dt-bias");
  c.dt_softplus = a.has("--softplus");
  // dt_limit's rules are the library's (validate_dt_limit), applied to the bounds as typed, before
  // they are narrowed to float: so -1e-50 is refused (its float, -0, would pass as >= 0), and an
  // upper bound past float's range is no bound, as in the API.
  const auto [lo, hi] = a.get_number_pair("--dt-limit", {c.dt_min, c.dt_max});
  try {
    std::tie(c.dt_min, c.dt_max) = float_dt_limit(lo, hi);
  } catch (const Error& e) {
    bad_flag("--dt-limit", e.what());
  }
}

// The sizes of a command's call as the API sees them (validate_sizes), before anything is built or
// the memory it needs is weighed: past the API's limits is a UsageError (exit 2) naming the shape
// flags given, "problem too large (--batch 1099511627776 --seqlen 8192): batch * seqlen ...".
void check_api_sizes(const Args& args, const ForwardParams& shape);
void check_api_sizes(const Args& args, const DecodeParams& shape);

// The shape, dtypes, features and seed flags of `run` as a ProblemConfig (cuda_path stays auto).
// Each flag is checked on its own (UsageError naming it), then the sizes as validate_sizes() sees
// them: a problem past the API's limits is a UsageError naming the shape flags given, before
// anything is allocated.
testing::ProblemConfig config_from(const Args& args);

// The flags that make config_from return `config` (shape and dtypes always; features, layouts,
// --fp32-math and the seed when they differ from the defaults; --path when not auto).
std::vector<std::string> run_flags(const testing::ProblemConfig& config);

// "mamba2ssd run --impl I <run_flags> --check-all --repeats 1": one case, checked in full, once.
std::string repro_command(const testing::ProblemConfig& config, Backend backend);

// `mamba2ssd prefill`'s problem (the command's defaults: the seqlens 1000,0,1,300,2047,64, H 8, P 64,
// N 128), each flag checked on its own, then the sizes as the API sees them; and the flags that ask
// for a config. The flags express every PrefillConfig field but the explicit slots, nslots,
// max_intermediate and pad_slot_id, which stay at their defaults.
testing::PrefillConfig prefill_config_from(const Args& args);
std::vector<std::string> prefill_flags(const testing::PrefillConfig& config);

// `mamba2ssd decode`'s problem (defaults: batch 128, H 32, P 64, N 128) and its flags, likewise; the
// explicit slots, nslots and pad_slot_id stay at their defaults.
testing::DecodeConfig decode_config_from(const Args& args);
std::vector<std::string> decode_flags(const testing::DecodeConfig& config);

}  // namespace mamba2ssd::cli
