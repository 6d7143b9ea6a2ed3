// A test switch of the library (detail::set_*_for_testing: forced segments, the decode kernel, the
// backward's portable kernels, ...) set for a scope and set back to `off` when the scope ends, thrown
// out of or not. Shared by the GPU tests and the CLI's fuzz sweep.
#pragma once

namespace mamba2ssd::testing {

template <typename Set, typename V>
class Forced {
 public:
  Forced(Set set, V on, V off) : set_(set), off_(off) { set_(on); }
  ~Forced() { set_(off_); }
  Forced(const Forced&) = delete;
  Forced& operator=(const Forced&) = delete;

 private:
  Set set_;
  V off_;
};

}  // namespace mamba2ssd::testing
