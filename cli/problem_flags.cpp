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
  auto add = [&](const char* name, const std::string& value) {
    f.push_back(name);
    f.push_back(value);
  };
  auto num = [](int64_t v) { return std::to_string(v); };
  add("--batch", num(c.batch));
  add("--seqlen", num(c.seqlen));
  add("--heads", num(c.nheads));
  add("--headdim", num(c.headdim));
  add("--dstate", num(c.dstate));
  add("--groups", num(c.ngroups));
  add("--chunk", num(c.chunk_size));
  add("--dtype", dtype_word(c.dtype));
  add("--dt-dtype", dtype_word(c.dt_dtype));
  if (c.D_layout == DLayout::kPerHeadDim) f.push_back("--D-dim");
  if (c.D_layout == DLayout::kNone) f.push_back("--no-D");
  if (c.z) f.push_back("--z");
  if (c.dt_bias) f.push_back("--dt-bias");
  if (c.dt_softplus) f.push_back("--softplus");
  if (c.dt_min != 0.0f || !std::isinf(c.dt_max)) add("--dt-limit", float_word(c.dt_min) + "," + float_word(c.dt_max));
  if (c.initial_states) f.push_back("--initial-states");
  if (!c.final_states) f.push_back("--no-final-states");
  if (!c.seqlens.empty()) {
    std::string lens;
    for (int64_t l : c.seqlens) lens += (lens.empty() ? "" : ",") + num(l);
    add("--seqlens", lens);
    if (c.seq_idx) f.push_back("--seq-idx");
    if (!c.cu_seqlens) f.push_back("--no-cu-seqlens");
    if (c.cu_seqlens && !c.varlen_states) f.push_back("--no-varlen-states");
  }
  if (c.strided) f.push_back("--strided");
  if (c.misaligned) f.push_back("--misaligned");
  if (c.A_scale != 1.0f) add("--A-scale", float_word(c.A_scale));
  if (c.fp32_math != Fp32Math::kTf32) add("--fp32-math", to_string(c.fp32_math));
  add("--seed", std::to_string(c.seed));
  if (c.cuda_path != CudaPath::kAuto) add("--path", to_string(c.cuda_path));
  return f;
}

std::string repro_command(const testing::ProblemConfig& c, Backend backend) {
  std::string s = std::string("mamba2ssd run --impl ") + to_string(backend);
  for (const std::string& w : run_flags(c)) s += " " + w;
  return s + " --check-all --repeats 1";
}

}  // namespace mamba2ssd::cli
