// Message text without iostreams: everything compiled into the PyTorch extension builds its error
// messages with these. On the GPU machine (g++ 13, torch 2.11) an ostringstream inside the extension
// crashed the interpreter in std::ostream::_M_insert<long>; std::to_string and snprintf do not.
#pragma once

#include <cstdio>
#include <string>
#include <type_traits>

namespace mamba2ssd::detail {

inline std::string text(const char* s) { return s; }
inline std::string text(const std::string& s) { return s; }
template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
std::string text(I v) {
  return std::to_string(v);
}
inline std::string text(double v) {  // as an ostream prints it: %g, 6 significant digits
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The parts one after another, each as text().
template <typename... Ts>
std::string concat(const Ts&... parts) {
  std::string s;
  ((s += text(parts)), ...);
  return s;
}

}  // namespace mamba2ssd::detail
