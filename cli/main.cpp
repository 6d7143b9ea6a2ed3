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

namespace {

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
