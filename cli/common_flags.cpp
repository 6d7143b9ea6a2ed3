// The flags every command shares: the backend (--impl), the CUDA kernels (--path), the threads.
#include <string>

#include "api/internal.h"  // detail::set_fused_segments_for_testing (--segments)
#include "commands.h"
#include "execute.h"

namespace mamba2ssd::cli {

Backend impl_flag(const Args& args) {
  const std::string impl = args.get_word("--impl", "auto", {"auto", "reference", "cpu", "cuda"});
  if (impl == "reference") return Backend::kReference;
  if (impl == "cpu") return Backend::kCpu;
  if (impl == "cuda") {
    if (!cuda_available()) bad_flag("--impl", "cuda needs a visible CUDA device, and there is none");
    return Backend::kCuda;
  }
  return resolve(Backend::kAuto);
}

CudaPath path_flag(const Args& args, Backend backend) {
  const std::string path = args.get_word("--path", "auto", {"auto", "three-kernel", "fused", "hopper", "tile"});
  if (path != "auto" && backend != Backend::kCuda) {
    const std::string impl = args.has("--impl") ? "--impl is " + args.raw("--impl")
                                                : std::string("--impl auto chose ") + to_string(backend) +
                                                      " (no CUDA device visible)";
    throw UsageError("--path " + path + " needs --impl cuda, but " + impl + "; leave --path out or set it to auto");
  }
  for (CudaPath c : {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper, CudaPath::kTile})
    if (path == to_string(c)) return c;
  return CudaPath::kAuto;
}

int threads_flag(const Args& args) { return static_cast<int>(args.get_int("--threads", 0, 0, 4096)); }

void segments_flag(const Args& args, Backend backend) {
  if (!args.has("--segments")) return;
  if (backend != Backend::kCuda) bad_flag("--segments", "cuts the CUDA walks, but the backend is " + std::string(to_string(backend)));
  detail::set_fused_segments_for_testing(args.get_int("--segments", 0, 1, 32));
}

void request_groups_flag(const Args& args, Backend backend) {
  if (!args.has("--request-groups")) return;
  if (backend != Backend::kCuda)
    bad_flag("--request-groups", "groups the CUDA walk's requests, but the backend is " + std::string(to_string(backend)));
  detail::set_prefill_request_groups_for_testing(args.get_int("--request-groups", 0, 1, int64_t{1} << 31));
}

}  // namespace mamba2ssd::cli
