// Placeholder until the chunked CPU path lands: runs the oracle.
#include "api/internal.h"

namespace mamba2ssd {
void forward_cpu(const ForwardParams& p, int) { forward_reference(p); }
}  // namespace mamba2ssd
