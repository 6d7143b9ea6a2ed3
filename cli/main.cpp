// mamba2ssd: run, check and benchmark the Mamba-2 SSD forward from the command line.
// Exit status: 0 success, 1 a check failed or the forward failed at run time, 2 bad arguments.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "args.h"
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

CudaPath path_flag(const Args& args) {
  const std::string path = args.get_word("--path", "auto", {"auto", "three-kernel", "fused", "hopper", "tile"});
  for (CudaPath c : {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper, CudaPath::kTile})
    if (path == to_string(c)) return c;
  return CudaPath::kAuto;
}

int threads_flag(const Args& args) { return static_cast<int>(args.get_int("--threads", 0, 0, 4096)); }

namespace {

// `mamba2ssd --version`: the library's version, then what this build holds (the CUDA toolkit it was
// compiled with and the GPU code it carries).
std::string version_text() {
  const BuildInfo info = build_info();
  std::string text = std::string("mamba2ssd ") + info.version + "\n";
  if (info.cuda) {
    text += "CUDA backend: CUDA " + std::to_string(info.cuda_version / 1000) + "." +
            std::to_string(info.cuda_version % 1000 / 10) + ", GPU code " + info.gpu_targets;
    if (info.cuda_tile) text += ", CUDA Tile C++ backend";
    text += "\n";
  } else {
    text += "CUDA backend: not built (CPU only)\n";
  }
  return text;
}

int dispatch(int argc, const char* const* argv) {
  if (argc < 2) {
    std::fputs(program_usage().c_str(), stderr);
    return 2;
  }
  const std::string word = argv[1];
  if (word == "--help" || word == "-h" || word == "help") {
    std::fputs(program_usage().c_str(), stdout);
    return 0;
  }
  if (word == "--version") {
    std::fputs(version_text().c_str(), stdout);
    return 0;
  }
  Command command;
  if (word == "run") command = kRun;
  else if (word == "check") command = kCheck;
  else if (word == "bench") command = kBench;
  else throw UsageError("unknown command '" + word + "', expected run, check or bench (see 'mamba2ssd --help')");

  const Args args = Args::parse(command, argc, argv, 2);
  if (args.has("--help")) {
    std::fputs(command_usage(command).c_str(), stdout);
    return 0;
  }
  switch (command) {
    case kRun: return run_command(args);
    case kCheck: return check_command(args);
    case kBench: return bench_command(args);
  }
  return 2;
}

// One line on stderr, whatever the message holds.
void complain(const std::string& message) {
  std::string line = message;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  std::fflush(stdout);
  std::fprintf(stderr, "mamba2ssd: %s\n", line.c_str());
}

}  // namespace
}  // namespace mamba2ssd::cli

int main(int argc, char** argv) {
  using namespace mamba2ssd::cli;
  try {
    return dispatch(argc, argv);
  } catch (const UsageError& e) {
    complain(e.what());
    return 2;
  } catch (const mamba2ssd::Error& e) {
    complain(e.what());
    return 2;
  } catch (const mamba2ssd::CudaError& e) {
    complain(std::string("CUDA: ") + e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    complain("out of host memory");
    return 1;
  } catch (const std::exception& e) {
    complain(e.what());
    return 1;
  }
}
