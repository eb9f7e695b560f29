// How much more host memory this process can fill before the kernel's OOM killer ends it:
// so that a buffer too large for the machine is a one-line error (OutOfMemory, naming what
// it is for), not a SIGKILL. Linux over-commits: malloc of more than is free succeeds, and
// the process dies later, when the zeroing touches the pages.
#pragma once
#include <cstddef>
#include <string>

namespace lattice {

struct HostMemory {
  size_t available = 0;  // bytes; SIZE_MAX when nothing could be read
  std::string source;    // what limits it, for the error message
};

// MemAvailable + SwapFree of /proc/meminfo, and, when this process's cgroup (v2, or v1's
// memory controller) has a memory limit, no more than the limit less the cgroup's use.
HostMemory host_memory_available();

// The same from the texts of /proc/meminfo and of the cgroup's limit and use (memory.max
// and memory.current, or v1's memory.limit_in_bytes and memory.usage_in_bytes; "" where
// there is none); for the tests.
HostMemory parse_host_memory(const std::string& meminfo, const std::string& cgroup_max,
                             const std::string& cgroup_current);

}  // namespace lattice
