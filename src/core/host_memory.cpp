#include "core/host_memory.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace lattice {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// "Name:   123 kB" in /proc/meminfo -> bytes; -1 when absent.
int64_t meminfo_field(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + ":";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return -1;
  const char* p = text.c_str() + at + name.size() + 1;  // after "Name:"
  char* end = nullptr;
  const long long kb = std::strtoll(p, &end, 10);
  if (end == p || kb < 0) return -1;
  return int64_t(kb) * 1024;
}

// The cgroup files hold a decimal number of bytes, or "max".
int64_t cgroup_bytes(const std::string& text) {
  if (text.empty() || text.compare(0, 3, "max") == 0) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  return end == text.c_str() || v < 0 ? -1 : int64_t(v);
}

// This process's cgroup memory limit and use: (memory.max, memory.current) of cgroup v2
// ("0::/path" in /proc/self/cgroup), else (memory.limit_in_bytes, memory.usage_in_bytes) of
// v1's memory controller ("N:memory:/path"; inside a container's cgroup namespace the
// files may sit at the controller's root). ("", "") when none is readable.
std::pair<std::string, std::string> cgroup_limit_and_use() {
  std::istringstream in(read_text("/proc/self/cgroup"));
  std::string v2, v1;
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, 3, "0::") == 0) v2 = line.substr(3);
    const size_t at = line.find(":memory:");
    if (at != std::string::npos) v1 = line.substr(at + 8);
  }
  std::vector<std::pair<std::string, std::string>> candidates;
  if (!v2.empty()) {
    const std::string d = "/sys/fs/cgroup" + v2;
    candidates.push_back({d + "/memory.max", d + "/memory.current"});
  }
  if (!v1.empty()) {
    const std::string dirs[] = {"/sys/fs/cgroup/memory" + v1, "/sys/fs/cgroup/memory"};
    for (const std::string& d : dirs)
      candidates.push_back({d + "/memory.limit_in_bytes", d + "/memory.usage_in_bytes"});
  }
  for (const auto& [max_path, use_path] : candidates) {
    std::string max = read_text(max_path), use = read_text(use_path);
    if (!max.empty() && !use.empty()) return {max, use};
  }
  return {"", ""};
}

}  // namespace

HostMemory parse_host_memory(const std::string& meminfo, const std::string& cgroup_max,
                             const std::string& cgroup_current) {
  HostMemory m{SIZE_MAX, "unknown"};
  const int64_t avail = meminfo_field(meminfo, "MemAvailable"), swap = meminfo_field(meminfo, "SwapFree");
  if (avail >= 0) {
    m.available = size_t(avail) + size_t(swap > 0 ? swap : 0);
    m.source = "MemAvailable + SwapFree of /proc/meminfo";
  }
  const int64_t max = cgroup_bytes(cgroup_max), current = cgroup_bytes(cgroup_current);
  if (max >= 0 && current >= 0) {
    const size_t left = size_t(max > current ? max - current : 0);
    if (left < m.available) {
      m.available = left;
      m.source = "the cgroup's memory limit less its use";
    }
  }
  return m;
}

HostMemory host_memory_available() {
  const auto [limit, use] = cgroup_limit_and_use();
  return parse_host_memory(read_text("/proc/meminfo"), limit, use);
}

}  // namespace lattice
