// Small helpers to print reports: numbers with units for people, and JSON for programs.
#pragma once

#include <string>
#include <vector>

#include "testing/problem.h"

namespace mamba2ssd::cli {

struct Timing;  // execute.h

std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string fmt_time(double seconds);  // "41.2 us", "3.20 ms", "1.52 s"
std::string fmt_sci(double v);         // "3.1e-03"
std::string fmt_rate(double v);        // three significant digits: "4270", "41.2", "0.0147"

// The report's comparison lines, one per output: name (in a column name_width wide), rel L2, max
// abs, tolerance, non-finite count if any, PASS or FAIL.
void print_comparisons(const std::vector<testing::Comparison>& cmps, int name_width);

// A number as JSON: %.9g (a float or an fp32 value reads back exactly), and null for inf, -inf and
// NaN, which JSON cannot hold. Every number the CLI prints as JSON goes through this or the integer
// fields below.
std::string json_number(double value);

// One JSON object, built field by field; non-finite numbers become null (json_number).
class JsonObject {
 public:
  JsonObject& str(const std::string& key, const std::string& value);
  JsonObject& num(const std::string& key, double value);
  JsonObject& integer(const std::string& key, long long value);
  JsonObject& unsigned_integer(const std::string& key, unsigned long long value);  // seeds: all 64 bits
  JsonObject& boolean(const std::string& key, bool value);
  JsonObject& raw(const std::string& key, const std::string& json);  // an object or array already built
  // A timing's fields: warmup, repeats, time_s (the median), time_min_s, time_max_s.
  JsonObject& timing(const Timing& t);
  std::string dump() const { return "{" + body_ + "}"; }

 private:
  JsonObject& field(const std::string& key, const std::string& json);
  std::string body_;
};

std::string json_array(const std::vector<std::string>& items);
std::string json_string(const std::string& s);

// A problem's shape and features as JSON fields (the ProblemConfig).
JsonObject config_json(const testing::ProblemConfig& c);
// One comparison with the oracle.
JsonObject comparison_json(const testing::Comparison& c);

}  // namespace mamba2ssd::cli
