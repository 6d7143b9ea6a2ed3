#include "args.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace mamba2ssd::cli {
namespace {

constexpr unsigned kForward = kRun | kCheck | kBench | kFuzz;  // the commands of the forward
constexpr unsigned kAll = kForward | kDecode | kPrefill;

const std::vector<FlagSpec> kFlags = {
    // Shape.
    {"--batch", "B", kRun, "batch size (default 4; 1 with --seqlens)"},
    {"--seqlen", "L", kRun, "tokens per batch row (default 16384; the sum of --seqlens)"},
    {"--heads", "H", kRun, "heads (default 8)"},
    {"--headdim", "P", kRun, "head dim: a multiple of 16 in [16, 128] (default 64)"},
    {"--dstate", "N", kRun, "state size: a multiple of 16 in [16, 256] (default 128)"},
    {"--groups", "G", kRun, "groups of B and C; divides --heads (default 1)"},
    {"--chunk", "Q", kRun, "chunk length: 64, 128 or 256 (default 128)"},
    {"--dtype", "T", kRun, "x, B, C, z, y: fp32, fp16 or bf16 (default bf16)"},
    {"--dt-dtype", "T", kRun, "dt: fp32, fp16 or bf16 (default fp32)"},
    // Features.
    {"--z", nullptr, kRun, "output gate z"},
    {"--D-dim", nullptr, kRun, "D per (head, dim) instead of per head"},
    {"--no-D", nullptr, kRun, "no D (skip connection)"},
    {"--dt-bias", nullptr, kRun, "dt_bias per head"},
    {"--softplus", nullptr, kRun, "softplus on dt"},
    {"--dt-limit", "LO,HI", kRun, "clamp dt to [LO, HI]: LO finite, >= 0; HI >= LO, may be inf"},
    {"--initial-states", nullptr, kRun, "initial states [b, H, P, N]"},
    {"--no-final-states", nullptr, kRun, "do not ask for the final states"},
    {"--seqlens", "L1,L2,..", kRun, "packed sequences in one row (batch 1; lengths >= 0); returns varlen states"},
    {"--seq-idx", nullptr, kRun, "with --seqlens: pass seq_idx too"},
    {"--no-cu-seqlens", nullptr, kRun, "with --seqlens and --seq-idx: seq_idx alone marks the sequences"},
    {"--no-varlen-states", nullptr, kRun, "with --seqlens: do not ask for each sequence's final state"},
    {"--strided", nullptr, kRun, "inputs and outputs as padded, non-contiguous views"},
    {"--misaligned", nullptr, kRun, "views padded by an odd number of elements: rows not 16-byte aligned"},
    {"--A-scale", "F", kRun, "A times F (default 1; 8 or more: decays fast)"},
    // Execution.
    {"--impl", "I", kForward | kDecode, "auto, reference, cpu or cuda (default auto: cuda if a GPU is visible)"},
    {"--path", "K", kForward | kPrefill, "CUDA kernels: auto, three-kernel, fused, hopper or tile (default auto; not auto: --impl cuda; prefill: auto, hopper or three-kernel)"},
    {"--fp32-math", "M", kRun, "fp32 products on the CUDA forward: tf32 or accurate (3xTF32) (default tf32; fp16, bf16, the CPU and --backward ignore it)"},
    {"--explain", nullptr, kRun, "say which CUDA path runs the problem and why the others do not, then stop (with --backward: which form of each backward kernel runs)"},
    {"--segments", "K", kRun, "fused and hopper walks (with --backward, the backward's hopper walks too): K segments per sequence in place of the planned count (tuning; 1-32)"},
    {"--segments", "K", kPrefill, "hopper walk: K segments of the packed tokens in place of the planned count (tuning; 1-32)"},
    {"--request-groups", "K", kPrefill, "hopper walk: K segments of whole requests in place of the planned form (tuning; K >= requests: one a request)"},
    {"--seed", "S", kRun | kCheck | kFuzz, "random seed of the inputs (default 0; fuzz: of the cases)"},
    {"--check-all", nullptr, kRun, "check every batch row and head against the oracle, not a slice"},
    {"--exact-prefill", nullptr, kRun, "also time and check the exact mode on the same prompt: the decode step over its L tokens (fp32 cache)"},
    {"--backward", nullptr, kRun, "time forward + backward and the backward alone; check every gradient"},
    {"--save-states", nullptr, kRun, "with --backward on cuda: the forward saves the states the backward reads (ForwardParams::saved_states) instead of the backward recomputing them"},
    {"--portable", nullptr, kRun, "with --backward on cuda: the backward's portable kernels even where the Hopper ones take the call (testing)"},
    {"--no-backward", nullptr, kCheck, "check the forward only (default: the backward too)"},
    {"--cases", "N", kFuzz, "random problems to run (default 100)"},
    {"--seconds", "S", kFuzz, "start no case after S seconds (the counts cover the cases that ran; default: no limit)"},
    {"--op", "O", kFuzz, "what each case runs: forward, backward, prefill or decode (default forward)"},
    {"--testing-perturb", "I", kFuzz, "tests only: spoil an output of case I, so that it fails", true},
    {"--repeats", "R", kRun | kBench, "timed runs, the median reported (default: cuda 20 in run, 100 in bench; cpu 3; reference 1)"},
    {"--threads", "K", kAll, "CPU threads (default 0: every hardware thread)"},
    {"--quick", nullptr, kBench, "three rows instead of the whole list"},
    {"--json", nullptr, kRun | kCheck | kBench | kDecode | kPrefill, "print the report as one JSON object (inf and NaN as null)"},
    // decode: the state update of serving (a batch of requests, one or a few tokens each).
    {"--batch", "B", kDecode, "requests (default 128)"},
    {"--heads", "H", kDecode, "heads (default 32)"},
    {"--headdim", "P", kDecode, "head dim: a multiple of 16 in [16, 128] (default 64)"},
    {"--dstate", "N", kDecode, "state size: a multiple of 16 in [16, 256] (default 128)"},
    {"--groups", "G", kDecode, "groups of B and C; divides --heads (default 1)"},
    {"--tokens", "T", kDecode, "tokens per request (default 1; more: speculative decoding)"},
    {"--state-dtype", "T", kDecode, "the state cache: fp32, fp16 or bf16 (default fp32)"},
    {"--dtype", "T", kDecode, "x, B, C, z, out: fp32, fp16 or bf16 (default bf16)"},
    {"--z", nullptr, kDecode, "output gate z"},
    {"--D-dim", nullptr, kDecode, "D per (head, dim) instead of per head"},
    {"--no-D", nullptr, kDecode, "no D (skip connection)"},
    {"--dt-bias", nullptr, kDecode, "dt_bias per head"},
    {"--softplus", nullptr, kDecode, "softplus on dt"},
    {"--dt-limit", "LO,HI", kDecode, "clamp dt to [LO, HI]: LO finite, >= 0; HI >= LO, may be inf"},
    {"--dt-dtype", "T", kDecode, "dt: fp32, fp16 or bf16 (default fp32)"},
    {"--dst", nullptr, kDecode, "store each token's state to its own slot (default: the last one in place)"},
    {"--pads", "K", kDecode, "requests that are pads (read slot -1: skipped, zero output)"},
    {"--pad-dsts", "K", kDecode, "with --dst: destination entries that are the pad id (that token's state not stored)"},
    {"--no-indices", nullptr, kDecode, "no state_batch_indices: request b reads and stores slot b"},
    {"--strided", nullptr, kDecode, "every tensor a padded, non-contiguous view (the cache's rows stay 16-byte aligned)"},
    {"--misaligned", nullptr, kDecode, "the cache's rows padded by one element: off 16-byte alignment"},
    {"--seed", "S", kDecode, "random seed of the inputs and the cache (default 0)"},
    {"--repeats", "R", kDecode, "timed runs, the median reported (default: cuda 100; cpu 3; reference 1)"},
    {"--kernel", "K", kDecode, "cuda: auto, rows or stream (tuning: one decode kernel whatever the call; default auto)"},
    {"--check-all", nullptr, kDecode, "check every request and head against the oracle, not a slice"},
    // prefill: the packed prefill of serving (requests of mixed lengths, each from and to its cache slot).
    {"--seqlens", "L1,L2,..", kPrefill, "the requests' lengths, packed in one row (>= 0; default 1000,0,1,300,2047,64)"},
    {"--heads", "H", kPrefill, "heads (default 8)"},
    {"--headdim", "P", kPrefill, "head dim: a multiple of 16 in [16, 128] (default 64)"},
    {"--dstate", "N", kPrefill, "state size: a multiple of 16 in [16, 256] (default 128)"},
    {"--groups", "G", kPrefill, "groups of B and C; divides --heads (default 1)"},
    {"--chunk", "Q", kPrefill, "chunk length: 64, 128 or 256 (default 128)"},
    {"--state-dtype", "T", kPrefill, "the state cache: fp32, fp16 or bf16 (default fp32)"},
    {"--dt-dtype", "T", kPrefill, "dt: fp32, fp16 or bf16 (default fp32)"},
    {"--strided", nullptr, kPrefill, "every tensor a padded, non-contiguous view, the cache too"},
    {"--misaligned", nullptr, kPrefill, "the inputs padded by an odd number of elements: rows not 16-byte aligned"},
    {"--odd-cache", nullptr, kPrefill, "the cache's rows N + 1 elements apart (odd strides)"},
    {"--dtype", "T", kPrefill, "x, B, C, z, y: fp32, fp16 or bf16 (default bf16)"},
    {"--z", nullptr, kPrefill, "output gate z"},
    {"--D-dim", nullptr, kPrefill, "D per (head, dim) instead of per head"},
    {"--no-D", nullptr, kPrefill, "no D (skip connection)"},
    {"--dt-bias", nullptr, kPrefill, "dt_bias per head"},
    {"--softplus", nullptr, kPrefill, "softplus on dt"},
    {"--dt-limit", "LO,HI", kPrefill, "clamp dt to [LO, HI]: LO finite, >= 0; HI >= LO, may be inf"},
    {"--seq-idx", nullptr, kPrefill, "pass seq_idx next to cu_seqlens"},
    {"--pads", "K", kPrefill, "requests whose slot is the pad id (state neither read nor stored)"},
    {"--state-every", "K", kPrefill, "also store each request's state every K tokens (a multiple of --chunk; default 0: none) to slots of its own, as many as the longest request has"},
    {"--all-cached", nullptr, kPrefill, "every request reads its slot (has_initial_state null; default: about half are new)"},
    {"--impl", "I", kPrefill, "auto, reference, cpu or cuda (default auto: cuda if a GPU is visible)"},
    {"--seed", "S", kPrefill, "random seed of the inputs, the cache and the slots (default 0)"},
    {"--repeats", "R", kPrefill, "timed runs, the median reported (default: cuda 20; cpu 3; reference 1)"},
    {"--no-check", nullptr, kPrefill, "time only: skip the fp64 oracle (on large mixes it takes most of the command's time); the result is then the guards' alone"},
    {"--help", nullptr, kAll, "this help"},
};

// The entry of `name` for `command`, else any entry of that name (to say it does not apply), else null.
const FlagSpec* find_flag(const std::string& name, Command command) {
  const FlagSpec* any = nullptr;
  for (const FlagSpec& f : kFlags)
    if (name == f.name) {
      if (f.commands & command) return &f;
      if (!any) any = &f;
    }
  return any;
}

const char* command_summary(Command c) {
  switch (c) {
    case kRun: return "one forward pass (--backward: forward + backward) on one problem: time, GB/s, GFLOP/s, error against the fp64 oracle";
    case kCheck: return "a fixed sweep of small problems covering every feature, forward and backward, each checked against the oracle";
    case kBench: return "times the forward over the benchmark shapes and, on a GPU, against the measured floor";
    case kFuzz: return "random small problems (shapes, dtypes, strides, features, packed sequences), each checked against the oracle";
    case kDecode: return "the decode step (state update of a batch of requests in a cache): time, GB/s, fraction of the copy ceiling, error against the oracle";
    case kPrefill: return "the packed prefill (requests of mixed lengths, each from and to its cache slot): time, tokens/s, error against the oracle";
  }
  return "";
}

bool parse_i64(const std::string& s, int64_t& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// A number as strtod reads it ("1e3", "0.5", "inf", "nan"), the whole word and nothing around it
// (strtod would skip leading blanks; the integers' from_chars does not). Range and finiteness are
// the caller's rules.
bool parse_number(const std::string& s, double& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string::size_type start = 0;
  while (true) {
    const auto pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace

const char* command_name(Command c) {
  switch (c) {
    case kRun: return "run";
    case kCheck: return "check";
    case kBench: return "bench";
    case kFuzz: return "fuzz";
    case kDecode: return "decode";
    case kPrefill: return "prefill";
  }
  return "?";
}

const std::vector<FlagSpec>& flag_table() { return kFlags; }

std::string program_usage() {
  std::ostringstream os;
  os << "usage: mamba2ssd <command> [flags]\n\n"
        "Mamba-2 SSD forward and backward (chunked state-space scan), decode step and packed prefill: run, check and benchmark them.\n\ncommands:\n";
  for (Command c : {kRun, kCheck, kBench, kFuzz, kDecode, kPrefill}) {
    const std::string name = command_name(c);
    os << "  " << name << std::string(8 - name.size(), ' ') << command_summary(c) << "\n";
  }
  os << "\n'mamba2ssd <command> --help' lists a command's flags; 'mamba2ssd --version' prints the version\n"
        "and the CUDA build (toolkit, GPU code).\n"
        "Exit status: 0 success; 1 a check failed, the run failed, it needs more host memory than is\n"
        "available, or the report could not be written; 2 bad arguments (sizes past the API's limits too).\n";
  return os.str();
}

std::string command_usage(Command c) {
  std::ostringstream os;
  os << "usage: mamba2ssd " << command_name(c) << " [flags]\n\n" << command_summary(c) << ".\n\nflags:\n";
  for (const FlagSpec& f : kFlags) {
    if (!(f.commands & c) || f.hidden) continue;
    std::string head = std::string(f.name) + (f.value ? std::string(" ") + f.value : "");
    os << "  " << head << std::string(head.size() < 22 ? 22 - head.size() : 1, ' ') << f.help << "\n";
  }
  if (c == kRun)
    os << "\nDefault problem: batch 4, seqlen 16384, 8 heads, head dim 64, state 128, 1 group, chunk 128,\n"
          "bf16, D per head. The error is measured on the first batch row and the first two heads\n"
          "(--check-all: on all of them). Sizes past the API's limits exit with status 2 before anything\n"
          "is allocated; a run that needs more host memory than is available exits with status 1 at once.\n"
          "--backward times forward + backward and the backward alone (random cotangents for y and the\n"
          "states) and checks every gradient on the same slice: the check runs the backward once more\n"
          "with the cotangents zero outside it, so that the sums over batch rows and heads (dA, dD,\n"
          "ddt_bias, dB, dC) are the slice's alone.\n";
  if (c == kCheck)
    os << "\nEach problem runs forward, then backward (random cotangents, gradient buffers laid out\n"
          "contiguous, padded or as slices of one buffer in turn), every output and gradient compared\n"
          "with the fp64 oracle under src/testing/tolerance.h.\n";
  if (c == kFuzz)
    os << "\nEach case runs on the backend (with --impl cuda: on every CUDA path that takes it, or the one\n"
          "--path names; the backward in both kernel forms and with forced segments, the prefill on both\n"
          "paths with forced segments, the decode on both kernels) and is compared with the fp64 oracle,\n"
          "all outputs, with the tolerances of src/testing/tolerance.h. A failing case is printed as the\n"
          "'mamba2ssd run' ('run --backward', 'prefill', 'decode') command line that reproduces it. The\n"
          "last line is 'N passed, M failed' (runs: a case on each path).\n";
  if (c == kDecode)
    os << "\nDefault problem: 128 requests, 32 heads, head dim 64, state 128, 1 group, 1 token, state fp32,\n"
          "x/B/C/out bf16, D per head; each request reads its own random slot of a cache of\n"
          "batch * (tokens + 1) + 3 slots and stores in place (--dst: each token's state to a slot of its\n"
          "own). GB/s counts every byte that must move (the state read once and written once per store,\n"
          "x, B, C, dt, z, out). On a GPU the copy ceiling is measured in the same run: a device-to-device\n"
          "cudaMemcpyAsync that moves as many bytes (half read, half written), L2 cleared before each, like\n"
          "the decode launches. The error is measured on the first two requests and the last (--check-all:\n"
          "all), and the guard bytes around the cache and out must be intact.\n";
  if (c == kPrefill)
    os << "\nDefault problem: requests of 1000, 0, 1, 300, 2047 and 64 tokens, 8 heads, head dim 64, state 128,\n"
          "1 group, state fp32, x/B/C/y bf16, D per head; each request has its own random slot of a cache of\n"
          "requests + 3 slots, and about half of them start from it (the others are new: zero). One run is\n"
          "checked against the fp64 oracle: y, the stored states, and every other slot's bits kept. On a GPU\n"
          "each timed launch of prefill_cuda is between two cudaEvents, L2 cleared before each (the timed\n"
          "launches advance the cache; the checked one starts from it as drawn), and the guard bytes around\n"
          "the cache must be intact.\n";
  if (c == kCheck)
    os << "\nAfter the forward's problems, the decode step's test matrix (every feature, slot rule and\n"
          "cache dtype) against its oracle, and the packed prefill's (with --impl cuda: prefill_cuda, the\n"
          "guard bytes around the cache checked too).\n";
  if (c == kBench)
    os << "\nOn a GPU each row is compared with the floor max(bytes / copy bandwidth, flops / bf16 matmul\n"
          "rate), both measured in the same run. Without a GPU the CPU path runs three rows at seqlen / 16.\n";
  return os.str();
}

void bad_flag(const std::string& name, const std::string& message) { throw UsageError(name + ": " + message); }

Args Args::parse(Command command, int argc, const char* const* argv, int first) {
  Args args;
  args.command_ = command;
  const std::string cmd = command_name(command);
  for (int i = first; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) != 0 || word.size() == 2)
      throw UsageError(cmd + ": unexpected argument " + quoted(word) + " (flags start with --)");
    std::string name = word, value;
    bool inline_value = false;
    if (auto eq = word.find('='); eq != std::string::npos) {
      name = word.substr(0, eq);
      value = word.substr(eq + 1);
      inline_value = true;
    }
    const FlagSpec* spec = find_flag(name, command);
    if (!spec)
      throw UsageError(cmd + ": unknown flag " + name + " (see 'mamba2ssd " + cmd + " --help')");
    if (!(spec->commands & command))
      throw UsageError(cmd + ": flag " + name + " does not apply to this command (see 'mamba2ssd " + cmd +
                       " --help')");
    if (args.has(name)) bad_flag(name, "given twice");
    if (spec->value) {
      if (!inline_value) {
        if (i + 1 >= argc) bad_flag(name, std::string("expected a value (") + spec->value + ")");
        value = argv[++i];
      }
    } else if (inline_value) {
      bad_flag(name, "takes no value, got " + quoted(value));
    }
    args.values_[name] = value;
  }
  return args;
}

Args Args::parse(Command command, const std::vector<std::string>& words) {
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  return parse(command, static_cast<int>(argv.size()), argv.data(), 0);
}

std::string Args::raw(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? "" : it->second;
}

int64_t Args::get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v = 0;
  if (!parse_i64(it->second, v)) bad_flag(name, "expected an integer, got " + quoted(it->second));
  if (v < lo || v > hi)
    bad_flag(name, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                       it->second);
  return v;
}

int64_t Args::get_choice(const std::string& name, int64_t fallback, std::initializer_list<int64_t> allowed) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::string list;
  for (int64_t a : allowed) list += (list.empty() ? "" : ", ") + std::to_string(a);
  int64_t v = 0;
  if (!parse_i64(it->second, v)) bad_flag(name, "expected one of " + list + ", got " + quoted(it->second));
  for (int64_t a : allowed)
    if (v == a) return v;
  bad_flag(name, "expected one of " + list + ", got " + it->second);
}

uint64_t Args::get_u64(const std::string& name, uint64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  uint64_t v = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    bad_flag(name, "expected a non-negative integer, got " + quoted(s));
  return v;
}

std::string Args::get_word(const std::string& name, const std::string& fallback,
                           std::initializer_list<const char*> allowed) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::string list;
  for (const char* a : allowed) {
    if (it->second == a) return it->second;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  bad_flag(name, "expected one of " + list + ", got " + quoted(it->second));
}

std::vector<int64_t> Args::get_int_list(const std::string& name, int64_t lo, int64_t hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return {};
  std::vector<int64_t> out;
  for (const std::string& part : split(it->second, ',')) {
    int64_t v = 0;
    if (!parse_i64(part, v) || v < lo || v > hi)
      bad_flag(name, "expected a comma-separated list of integers in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "], got " + quoted(it->second));
    out.push_back(v);
  }
  return out;
}

std::pair<double, double> Args::get_number_pair(const std::string& name, std::pair<double, double> fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::vector<std::string> parts = split(it->second, ',');
  std::pair<double, double> v;
  if (parts.size() != 2 || !parse_number(parts[0], v.first) || !parse_number(parts[1], v.second))
    bad_flag(name, "expected LO,HI (two numbers, HI may be inf), got " + quoted(it->second));
  return v;
}

float Args::get_positive_float(const std::string& name, float fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double d = 0.0;
  // Judged as the float it becomes: 1e-50 would be 0, and 1e39 is past float's range (whose
  // conversion would be undefined), so both are refused.
  const bool fits = parse_number(it->second, d) && std::fabs(d) <= std::numeric_limits<float>::max();
  const float v = fits ? static_cast<float>(d) : 0.0f;
  if (!(v > 0.0f))
    bad_flag(name, "expected a finite number > 0, got " + quoted(it->second));
  return v;
}

}  // namespace mamba2ssd::cli
