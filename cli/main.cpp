// mamba2ssd: run, check, benchmark and fuzz the Mamba-2 SSD forward, and run the decode step and the
// packed prefill, from the command line.
// Exit status: 0 success; 1 a check failed, the forward failed at run time, the run needs more host
// memory than is available, or the report could not be written to stdout; 2 bad arguments (a flag's
// value, or sizes past the API's limits).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "args.h"
#include "commands.h"
#include "execute.h"

namespace mamba2ssd::cli {

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
  else if (word == "fuzz") command = kFuzz;
  else if (word == "decode") command = kDecode;
  else if (word == "prefill") command = kPrefill;
  else throw UsageError("unknown command '" + word + "', expected run, check, bench, fuzz, decode or prefill (see 'mamba2ssd --help')");

  const Args args = Args::parse(command, argc, argv, 2);
  if (args.has("--help")) {
    std::fputs(command_usage(command).c_str(), stdout);
    return 0;
  }
  switch (command) {
    case kRun: return run_command(args);
    case kCheck: return check_command(args);
    case kBench: return bench_command(args);
    case kFuzz: return fuzz_command(args);
    case kDecode: return decode_command(args);
    case kPrefill: return prefill_command(args);
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

// The report is written: stdout flushed without an error. A report that could not be written (a
// full disk, a closed pipe) turns success into exit status 1, with the reason on stderr.
int finish(int status) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return status;
  const int err = errno;
  std::fprintf(stderr, "mamba2ssd: cannot write the report to stdout: %s\n",
               err ? std::strerror(err) : "write error");
  return status == 0 ? 1 : status;
}

// Runs the command; every exception becomes one line on stderr and its exit status.
int guarded(int argc, const char* const* argv) {
  try {
    return dispatch(argc, argv);
  } catch (const UsageError& e) {
    complain(e.what());
    return 2;
  } catch (const Error& e) {
    complain(e.what());
    return 2;
  } catch (const CudaError& e) {
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

}  // namespace
}  // namespace mamba2ssd::cli

int main(int argc, char** argv) {
  using namespace mamba2ssd::cli;
  return finish(guarded(argc, argv));
}
