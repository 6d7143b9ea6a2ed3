#include "memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "report.h"

namespace mamba2ssd::cli {
namespace {

// The number after `key` in a "Key:   1234 kB" file (/proc/meminfo, /proc/self/status), in bytes.
bool read_kb_field(const char* path, const std::string& key, double& bytes) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    double kb = 0.0;
    if (!(fields >> kb)) return false;
    bytes = kb * 1024.0;
    return true;
  }
  return false;
}

// One number from a cgroup file ("max" or a huge v1 value means no limit: false).
bool read_number(const std::string& path, double& value) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return false;
  try {
    value = std::stod(word);
  } catch (const std::exception&) {
    return false;
  }
  return value < 4e18;  // v1 writes 2^63 rounded to a page for "no limit"
}

void consider(HostMemory& m, double bytes, const std::string& source) {
  if (bytes < m.bytes) m = {std::max(bytes, 0.0), source};
}

// The memory cgroup of this process: v2 ("0::/path") and v1 ("N:memory:/path"); every level from
// it up to the root, as the kernel enforces each.
void consider_cgroups(HostMemory& m) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = controllers.empty();
    if (!v2 && controllers.find("memory") == std::string::npos) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char* limit_file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    const char* usage_file = v2 ? "/memory.current" : "/memory.usage_in_bytes";
    while (true) {
      double limit = 0.0, usage = 0.0;
      const std::string dir = root + (path == "/" ? "" : path);
      if (read_number(dir + limit_file, limit) && read_number(dir + usage_file, usage))
        consider(m, limit - usage, std::string("the memory cgroup's limit (") + (limit_file + 1) + ")");
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.rfind('/'));
      if (path.empty()) path = "/";
    }
  }
}

void consider_rlimit(HostMemory& m, int resource, const char* status_key, const char* source) {
  rlimit r{};
  if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return;
  double used = 0.0;
  read_kb_field("/proc/self/status", status_key, used);
  consider(m, static_cast<double>(r.rlim_cur) - used, source);
}

}  // namespace

HostMemory available_host_memory() {
  HostMemory m{std::numeric_limits<double>::infinity(), "no limit found"};
  double avail = 0.0;
  if (read_kb_field("/proc/meminfo", "MemAvailable:", avail)) consider(m, avail, "MemAvailable in /proc/meminfo");
  consider_cgroups(m);
  consider_rlimit(m, RLIMIT_AS, "VmSize:", "the address-space limit, ulimit -v");
  consider_rlimit(m, RLIMIT_DATA, "VmData:", "the data-segment limit, ulimit -d");
  return m;
}

double run_host_bytes(const testing::ProblemConfig& c, Backend backend, const reference::Slice& slice) {
  double bytes = static_cast<double>(testing::host_bytes(c));
  const double L = static_cast<double>(c.seqlen), P = static_cast<double>(c.headdim);
  const double N = static_cast<double>(c.dstate), S = static_cast<double>(c.seqlens.size());
  const int64_t heads_per_group = c.nheads / c.ngroups;
  // The oracle's fp64 arrays for nb batch rows and nh heads (reference::run: the inputs it loads and
  // the outputs it keeps).
  auto oracle = [&](int64_t batch_rows, int64_t head_begin, int64_t head_end) {
    const double nb = static_cast<double>(batch_rows), nh = static_cast<double>(head_end - head_begin);
    const double ng = static_cast<double>((head_end - 1) / heads_per_group - head_begin / heads_per_group + 1);
    double elems = nb * L * nh * P * (c.z ? 3.0 : 2.0)  // x, z, y
                   + nb * L * ng * N * 2.0            // B, C
                   + nb * L * (nh + 1.0)              // dt, sequence ids
                   + nb * nh * P * N * (c.initial_states ? 2.0 : 1.0)  // initial and final states
                   + S * nh * P * N + P * N;          // varlen states, the running state
    return elems * 8.0;
  };
  const int64_t b_end = slice.batch_end < 0 ? c.batch : slice.batch_end;
  const int64_t h_end = slice.head_end < 0 ? c.nheads : slice.head_end;
  bytes += oracle(b_end - slice.batch_begin, slice.head_begin, h_end);
  if (backend == Backend::kReference) bytes += oracle(c.batch, 0, c.nheads);
  if (backend == Backend::kCuda) {  // the outputs, downloaded
    const double es = static_cast<double>(dtype_size(c.dtype));
    bytes += static_cast<double>(c.batch) * L * static_cast<double>(c.nheads) * P * es +
             (static_cast<double>(c.batch) + S) * static_cast<double>(c.nheads) * P * N * 4.0;
  }
  return bytes + 64.0 * 1024 * 1024;  // the program itself, the CPU backend's scratch, the allocator
}

double exact_prefill_host_bytes(const testing::ProblemConfig& c, Backend backend) {
  if (backend != Backend::kReference) return 0.0;
  const double outs = static_cast<double>(c.batch) * static_cast<double>(c.seqlen) * static_cast<double>(c.nheads) *
                      static_cast<double>(c.headdim);
  return outs * (static_cast<double>(c.dstate) + 1.0) * 8.0;  // the states, and out
}

double backward_run_host_bytes(const testing::ProblemConfig& c, Backend backend, const reference::Slice& slice) {
  // The gradients and cotangents take about what the inputs and outputs do (host_bytes), twice with
  // the downloaded copies; the oracle's inputs and gradients about twice its forward's arrays, and
  // with the reference backend its backward runs on the whole problem.
  const double grads = static_cast<double>(testing::host_bytes(c)) * (backend == Backend::kCuda ? 2.0 : 1.0);
  const double states = (static_cast<double>(c.seqlen) + 1.0) * static_cast<double>(c.headdim * c.dstate) * 8.0;
  const double oracle = 2.0 * (run_host_bytes(c, backend, slice) - static_cast<double>(testing::host_bytes(c)));
  return run_host_bytes(c, backend, slice) + grads + oracle + states;
}

std::string fmt_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) bytes /= 1024.0, ++u;
  return u == 0 ? fmt("%.0f B", bytes) : fmt("%.2f %s", bytes, units[u]);
}

void require_host_memory(double needed, const HostMemory& available) {
  if (needed <= available.bytes) return;
  throw ResourceError("this run needs " + fmt_bytes(needed) + " of host memory, but only " +
                      fmt_bytes(available.bytes) + " is available (" + available.source + ")");
}

}  // namespace mamba2ssd::cli
