// The command line: one table of flags (name, value, which subcommands take it, help), a parser that
// checks a command line against it, and typed getters whose failures name the flag and the value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mamba2ssd::cli {

// A bad command line. what() is one line, without the program name: "--headdim: expected ...".
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum Command : unsigned { kRun = 1u, kCheck = 2u, kBench = 4u, kFuzz = 8u, kDecode = 16u, kPrefill = 32u };

const char* command_name(Command c);

struct FlagSpec {
  const char* name;      // "--batch"
  const char* value;     // the value's name in help ("N"), nullptr for a switch
  unsigned commands;     // the Commands that accept it
  const char* help;
  bool hidden = false;   // for tests only: accepted, not listed by --help
};

// Every flag of every subcommand. A name may appear twice, for disjoint commands (decode's --batch
// has its own default and help).
const std::vector<FlagSpec>& flag_table();

// Help texts: the program's and one subcommand's.
std::string program_usage();
std::string command_usage(Command c);

// The flags of one command line, checked against the table.
class Args {
 public:
  // Parses argv[first..argc): "--flag value", "--flag=value" or "--switch". Throws UsageError on an
  // unknown flag, a missing value, a value given to a switch, a repeated flag or a stray argument.
  static Args parse(Command command, int argc, const char* const* argv, int first);
  static Args parse(Command command, const std::vector<std::string>& words);  // the flags alone

  Command command() const { return command_; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  // The value as given ("" for a switch or an absent flag).
  std::string raw(const std::string& name) const;

  // Each getter returns `fallback` when the flag is absent and throws UsageError when its value is bad.
  int64_t get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  int64_t get_choice(const std::string& name, int64_t fallback, std::initializer_list<int64_t> allowed) const;
  uint64_t get_u64(const std::string& name, uint64_t fallback) const;
  std::string get_word(const std::string& name, const std::string& fallback,
                       std::initializer_list<const char*> allowed) const;
  // "100,200,300": each in [lo, hi].
  std::vector<int64_t> get_int_list(const std::string& name, int64_t lo, int64_t hi) const;
  // "LO,HI": two numbers as written ("inf" and "nan" read too), in double: the caller judges them.
  std::pair<double, double> get_number_pair(const std::string& name, std::pair<double, double> fallback) const;
  // A finite number > 0.
  float get_positive_float(const std::string& name, float fallback) const;

 private:
  Command command_ = kRun;
  std::map<std::string, std::string> values_;  // "" for a switch
};

// "--flag: <message>", as a UsageError.
[[noreturn]] void bad_flag(const std::string& name, const std::string& message);

}  // namespace mamba2ssd::cli
