#include "report.h"

#include "execute.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace mamba2ssd::cli {

std::string fmt(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

std::string fmt_time(double s) {
  if (s < 1e-3) return fmt("%.1f us", s * 1e6);
  if (s < 1.0) return fmt("%.2f ms", s * 1e3);
  return fmt("%.2f s", s);
}

std::string fmt_rate(double v) {
  if (!std::isfinite(v)) return fmt("%g", v);
  if (v >= 100.0) return fmt("%.0f", v);
  if (v >= 10.0) return fmt("%.1f", v);
  if (v >= 1.0) return fmt("%.2f", v);
  return fmt("%.3g", v);
}

std::string fmt_sci(double v) { return std::isfinite(v) ? fmt("%.1e", v) : fmt("%g", v); }

void print_comparisons(const std::vector<testing::Comparison>& cmps, int name_width) {
  for (const auto& c : cmps) {
    std::printf("           %-*s rel L2 %-8s  max abs %-8s  tol %-8s", name_width, c.name.c_str(),
                fmt_sci(c.rel_l2).c_str(), fmt_sci(c.max_abs).c_str(), fmt_sci(c.tolerance).c_str());
    if (c.nonfinite) std::printf("  nonfinite %lld", static_cast<long long>(c.nonfinite));
    std::printf("  %s\n", c.pass() ? "PASS" : "FAIL");
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      out += fmt("\\u%04x", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string json_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out + "]";
}

JsonObject& JsonObject::field(const std::string& key, const std::string& json) {
  body_ += (body_.empty() ? "" : ",") + json_string(key) + ":" + json;
  return *this;
}
JsonObject& JsonObject::str(const std::string& key, const std::string& value) { return field(key, json_string(value)); }
std::string json_number(double value) { return std::isfinite(value) ? fmt("%.9g", value) : "null"; }

JsonObject& JsonObject::num(const std::string& key, double value) { return field(key, json_number(value)); }
JsonObject& JsonObject::integer(const std::string& key, long long value) { return field(key, std::to_string(value)); }
JsonObject& JsonObject::unsigned_integer(const std::string& key, unsigned long long value) {
  return field(key, std::to_string(value));
}
JsonObject& JsonObject::boolean(const std::string& key, bool value) { return field(key, value ? "true" : "false"); }
JsonObject& JsonObject::raw(const std::string& key, const std::string& json) { return field(key, json); }
JsonObject& JsonObject::timing(const Timing& t) {
  return integer("warmup", t.warmup)
      .integer("repeats", static_cast<long long>(t.seconds.size()))
      .num("time_s", t.median())
      .num("time_min_s", t.min())
      .num("time_max_s", t.max());
}

JsonObject config_json(const testing::ProblemConfig& c) {
  JsonObject o;
  o.str("describe", c.describe())
      .integer("batch", c.batch)
      .integer("seqlen", c.seqlen)
      .integer("heads", c.nheads)
      .integer("headdim", c.headdim)
      .integer("dstate", c.dstate)
      .integer("groups", c.ngroups)
      .integer("chunk", c.chunk_size)
      .str("dtype", to_string(c.dtype))
      .str("dt_dtype", to_string(c.dt_dtype))
      .str("D", c.D_layout == DLayout::kNone ? "none" : c.D_layout == DLayout::kPerHead ? "per_head" : "per_head_dim")
      .boolean("z", c.z)
      .boolean("dt_bias", c.dt_bias)
      .boolean("softplus", c.dt_softplus)
      .raw("dt_limit", json_array({json_number(c.dt_min), json_number(c.dt_max)}))  // null: no upper bound
      .boolean("initial_states", c.initial_states)
      .boolean("final_states", c.final_states);
  std::vector<std::string> lens;
  for (int64_t l : c.seqlens) lens.push_back(std::to_string(l));
  o.raw("seqlens", json_array(lens)).boolean("seq_idx", c.seq_idx);
  if (!c.seqlens.empty()) o.boolean("cu_seqlens", c.cu_seqlens).boolean("varlen_states", c.cu_seqlens && c.varlen_states);
  o.boolean("strided", c.strided).boolean("misaligned", c.misaligned).num("A_scale", c.A_scale);
  o.unsigned_integer("seed", c.seed).str("cuda_path", to_string(c.cuda_path)).str("fp32_math", to_string(c.fp32_math));
  return o;
}

JsonObject comparison_json(const testing::Comparison& c) {
  JsonObject o;
  o.str("name", c.name)
      .num("rel_l2", c.rel_l2)
      .num("max_abs", c.max_abs)
      .integer("nonfinite", c.nonfinite)
      .integer("count", c.count)
      .num("tolerance", c.tolerance)
      .boolean("pass", c.pass());
  return o;
}

}  // namespace mamba2ssd::cli
