#include "problem_flags.h"

#include <cmath>

#include "report.h"

namespace mamba2ssd::cli {
namespace {

const char* dtype_word(DType t) { return to_string(t); }

// A float as the command line reads it back exactly ("inf" for +inf).
std::string float_word(float v) { return std::isinf(v) && v > 0 ? "inf" : fmt("%.9g", static_cast<double>(v)); }

// The shape flags the command line gave, as typed: "--batch 1099511627776 --seqlen 8192".
std::string shape_flags_given(const Args& a) {
  std::string s;
  for (const char* f : {"--batch", "--seqlen", "--seqlens", "--tokens", "--heads", "--headdim", "--groups", "--dstate"})
    if (a.has(f)) s += (s.empty() ? "" : " ") + std::string(f) + " " + a.raw(f);
  return s.empty() ? "the default shape" : s;
}

template <typename Params>
void check_sizes_of(const Args& a, const Params& shape) {
  try {
    validate_sizes(shape);
  } catch (const Error& e) {
    throw UsageError("problem too large (" + shape_flags_given(a) + "): " + e.what());
  }
}

// "--name value" appended to a command line's words.
void add(std::vector<std::string>& f, const char* name, const std::string& value) {
  f.push_back(name);
  f.push_back(value);
}

// The flags read_head_flags reads, for a config with those fields: shape and dtype always, the
// features when they differ from the defaults.
template <typename Config>
void add_head_flags(std::vector<std::string>& f, const Config& c) {
  add(f, "--heads", std::to_string(c.nheads));
  add(f, "--headdim", std::to_string(c.headdim));
  add(f, "--dstate", std::to_string(c.dstate));
  add(f, "--groups", std::to_string(c.ngroups));
  add(f, "--dtype", dtype_word(c.dtype));
  if (c.D_layout == DLayout::kPerHeadDim) f.push_back("--D-dim");
  if (c.D_layout == DLayout::kNone) f.push_back("--no-D");
  if (c.z) f.push_back("--z");
  if (c.dt_bias) f.push_back("--dt-bias");
  if (c.dt_softplus) f.push_back("--softplus");
  if (c.dt_min != 0.0f || !std::isinf(c.dt_max))
    add(f, "--dt-limit", float_word(c.dt_min) + "," + float_word(c.dt_max));
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

}  // namespace

void check_api_sizes(const Args& a, const ForwardParams& shape) { check_sizes_of(a, shape); }
void check_api_sizes(const Args& a, const DecodeParams& shape) { check_sizes_of(a, shape); }

DType dtype_flag(const Args& a, const char* name, DType fallback) {
  const std::string w = a.get_word(name, to_string(fallback), {"fp32", "fp16", "bf16"});
  return w == "fp32" ? DType::kF32 : w == "fp16" ? DType::kF16 : DType::kBF16;
}

testing::ProblemConfig config_from(const Args& a) {
  testing::ProblemConfig c;  // the seed's headline shape, D per head, bf16
  constexpr int64_t kMaxLen = int64_t{1} << 40;
  c.seqlens = a.get_int_list("--seqlens", 0, kMaxLen);
  const bool packed = !c.seqlens.empty();
  int64_t total = 0;
  for (int64_t len : c.seqlens)
    if ((total += len) > kMaxLen) bad_flag("--seqlens", "the lengths sum past 2^40");  // each <= 2^40: no wrap
  if (packed && total == 0) bad_flag("--seqlens", "the lengths sum to 0; a problem needs a token");

  c.batch = a.get_int("--batch", packed ? 1 : c.batch, 1, kMaxLen);
  c.seqlen = a.get_int("--seqlen", packed ? total : c.seqlen, 1, kMaxLen);
  read_head_flags(a, c, int64_t{1} << 20);
  c.chunk_size = a.get_choice("--chunk", c.chunk_size, {64, 128, 256});
  c.dt_dtype = dtype_flag(a, "--dt-dtype", c.dt_dtype);
  c.seed = a.get_u64("--seed", 0);
  c.initial_states = a.has("--initial-states");
  c.final_states = !a.has("--no-final-states");
  c.strided = a.has("--strided");
  c.misaligned = a.has("--misaligned");
  c.A_scale = a.get_positive_float("--A-scale", c.A_scale);
  c.fp32_math = a.get_word("--fp32-math", "tf32", {"tf32", "accurate"}) == "accurate" ? Fp32Math::kAccurate
                                                                                     : Fp32Math::kTf32;
  c.seq_idx = a.has("--seq-idx");
  c.cu_seqlens = !a.has("--no-cu-seqlens");
  c.varlen_states = c.cu_seqlens && !a.has("--no-varlen-states");
  if (c.seq_idx && !packed) bad_flag("--seq-idx", "needs --seqlens");
  if (!c.cu_seqlens && !(packed && c.seq_idx)) bad_flag("--no-cu-seqlens", "needs --seqlens and --seq-idx");
  if (a.has("--no-varlen-states") && !packed) bad_flag("--no-varlen-states", "needs --seqlens");
  if (a.has("--no-varlen-states") && !c.cu_seqlens)
    bad_flag("--no-varlen-states", "is implied by --no-cu-seqlens (varlen states need cu_seqlens)");
  if (packed) {
    if (c.batch != 1) bad_flag("--seqlens", "packed sequences need --batch 1, got --batch " + std::to_string(c.batch));
    if (total != c.seqlen)
      bad_flag("--seqlens", "lengths sum to " + std::to_string(total) + ", but --seqlen is " + std::to_string(c.seqlen));
  }
  check_api_sizes(a, testing::shape_params(c));
  return c;
}

std::vector<std::string> run_flags(const testing::ProblemConfig& c) {
  std::vector<std::string> f;
  auto num = [](int64_t v) { return std::to_string(v); };
  add(f, "--batch", num(c.batch));
  add(f, "--seqlen", num(c.seqlen));
  add_head_flags(f, c);
  add(f, "--chunk", num(c.chunk_size));
  add(f, "--dt-dtype", dtype_word(c.dt_dtype));
  if (c.initial_states) f.push_back("--initial-states");
  if (!c.final_states) f.push_back("--no-final-states");
  if (!c.seqlens.empty()) {
    add(f, "--seqlens", join(c.seqlens));
    if (c.seq_idx) f.push_back("--seq-idx");
    if (!c.cu_seqlens) f.push_back("--no-cu-seqlens");
    if (c.cu_seqlens && !c.varlen_states) f.push_back("--no-varlen-states");
  }
  if (c.strided) f.push_back("--strided");
  if (c.misaligned) f.push_back("--misaligned");
  if (c.A_scale != 1.0f) add(f, "--A-scale", float_word(c.A_scale));
  if (c.fp32_math != Fp32Math::kTf32) add(f, "--fp32-math", to_string(c.fp32_math));
  add(f, "--seed", std::to_string(c.seed));
  if (c.cuda_path != CudaPath::kAuto) add(f, "--path", to_string(c.cuda_path));
  return f;
}

std::string repro_command(const testing::ProblemConfig& c, Backend backend) {
  std::string s = std::string("mamba2ssd run --impl ") + to_string(backend);
  for (const std::string& w : run_flags(c)) s += " " + w;
  return s + " --check-all --repeats 1";
}

testing::PrefillConfig prefill_config_from(const Args& a) {
  testing::PrefillConfig c;
  constexpr int64_t kMaxLen = int64_t{1} << 40;
  if (a.has("--seqlens")) c.seqlens = a.get_int_list("--seqlens", 0, kMaxLen);
  else c.seqlens = {1000, 0, 1, 300, 2047, 64};
  if (c.seqlens.size() > (std::size_t{1} << 24)) bad_flag("--seqlens", "more than 2^24 requests");
  int64_t total = 0;
  for (int64_t len : c.seqlens)
    if ((total += len) > kMaxLen) bad_flag("--seqlens", "the lengths sum past 2^40");  // each <= 2^40: no wrap
  if (total == 0) bad_flag("--seqlens", "the lengths sum to 0; a prefill needs a token");
  c.nheads = 8, c.headdim = 64, c.dstate = 128, c.ngroups = 1;  // the command's defaults
  read_head_flags(a, c, int64_t{1} << 16);
  c.chunk_size = a.get_choice("--chunk", 128, {64, 128, 256});
  c.dt_dtype = dtype_flag(a, "--dt-dtype", c.dt_dtype);
  c.state_dtype = dtype_flag(a, "--state-dtype", DType::kF32);
  c.seq_idx = a.has("--seq-idx");
  c.pads = a.get_int("--pads", 0, 0, c.requests());
  c.has_initial_state = !a.has("--all-cached");
  // Intermediate states: max_intermediate is the longest request's boundaries (PrefillConfig).
  c.state_every = a.get_int("--state-every", 0, 0, kMaxLen);
  if (c.state_every % c.chunk_size != 0)
    bad_flag("--state-every", "expected a multiple of --chunk " + std::to_string(c.chunk_size) + ", got " +
                                  std::to_string(c.state_every));
  c.strided = a.has("--strided");
  c.misaligned = a.has("--misaligned");
  c.odd_cache = a.has("--odd-cache");
  c.seed = a.get_u64("--seed", 0);
  // The packed call's sizes (tokens, heads, head dim, groups, state size) by the forward's limits,
  // before the memory it needs is weighed.
  check_api_sizes(a, testing::shape_params(c.forward_config()));
  return c;
}

std::vector<std::string> prefill_flags(const testing::PrefillConfig& c) {
  std::vector<std::string> f = {"--seqlens", join(c.seqlens)};
  add_head_flags(f, c);
  add(f, "--chunk", std::to_string(c.chunk_size));
  add(f, "--dt-dtype", dtype_word(c.dt_dtype));
  add(f, "--state-dtype", dtype_word(c.state_dtype));
  if (c.seq_idx) f.push_back("--seq-idx");
  if (c.pads) add(f, "--pads", std::to_string(c.pads));
  if (!c.has_initial_state) f.push_back("--all-cached");
  if (c.state_every) add(f, "--state-every", std::to_string(c.state_every));
  if (c.strided) f.push_back("--strided");
  if (c.misaligned) f.push_back("--misaligned");
  if (c.odd_cache) f.push_back("--odd-cache");
  add(f, "--seed", std::to_string(c.seed));
  return f;
}

testing::DecodeConfig decode_config_from(const Args& a) {
  testing::DecodeConfig c;
  c.batch = a.get_int("--batch", 128, 1, int64_t{1} << 24);
  c.nheads = 32, c.headdim = 64, c.dstate = 128, c.ngroups = 1;  // the command's defaults
  read_head_flags(a, c, int64_t{1} << 16);
  c.ntokens = a.get_int("--tokens", 1, 1, 64);
  c.dt_dtype = dtype_flag(a, "--dt-dtype", c.dt_dtype);
  c.state_dtype = dtype_flag(a, "--state-dtype", DType::kF32);
  c.indices = !a.has("--no-indices");
  c.dst_indices = a.has("--dst");
  c.pads = a.get_int("--pads", 0, 0, c.batch);
  if (c.pads && !c.indices)
    bad_flag("--pads", "marks read slots of state_batch_indices, which --no-indices leaves out");
  c.pad_dsts = a.get_int("--pad-dsts", 0, 0, c.batch * c.ntokens);
  if (c.pad_dsts && !c.dst_indices) bad_flag("--pad-dsts", "marks entries of dst_state_batch_indices: add --dst");
  c.strided = a.has("--strided");
  c.misaligned = a.has("--misaligned");
  c.seed = a.get_u64("--seed", 0);
  // The cache: every request's slot and, with --dst, every token's: at most 2^31 slots.
  if (c.slots() > (int64_t{1} << 31) - 1) bad_flag("--batch", "the cache would need more than 2^31 slots");
  check_api_sizes(a, testing::shape_params(c));  // before the memory it needs is weighed
  return c;
}

std::vector<std::string> decode_flags(const testing::DecodeConfig& c) {
  std::vector<std::string> f = {"--batch", std::to_string(c.batch)};
  add_head_flags(f, c);
  add(f, "--tokens", std::to_string(c.ntokens));
  add(f, "--dt-dtype", dtype_word(c.dt_dtype));
  add(f, "--state-dtype", dtype_word(c.state_dtype));
  if (!c.indices) f.push_back("--no-indices");
  if (c.dst_indices) f.push_back("--dst");
  if (c.pads) add(f, "--pads", std::to_string(c.pads));
  if (c.pad_dsts) add(f, "--pad-dsts", std::to_string(c.pad_dsts));
  if (c.strided) f.push_back("--strided");
  if (c.misaligned) f.push_back("--misaligned");
  add(f, "--seed", std::to_string(c.seed));
  return f;
}

}  // namespace mamba2ssd::cli
