#include "core/device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace lattice {
namespace {

struct DeviceState {
  Device device = Device::cpu;
  bool emulate_requested = false;
  bool emulated = false;
  bool guard = false;  // emulation with PROT_NONE pages (one process)
  int access_depth = 0;
  std::map<void*, size_t> pages;  // emulated allocations (page-rounded sizes)
};

DeviceState& state() {
  static DeviceState s;
  return s;
}

size_t page_round(size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// Host memory (the CPU's buffers and the emulation's pages): an allocation larger than what
// the machine can still hold fails here, as an OutOfMemory, instead of succeeding (Linux
// over-commits) and getting the process killed when its pages are zeroed. Only large
// buffers are checked (reading /proc costs a few microseconds).
void check_host_memory(size_t bytes) {
  if (bytes < (size_t(64) << 20)) return;
  const HostMemory m = host_memory_available();
  if (bytes <= m.available) return;
  std::ostringstream os;
  os << "cannot allocate " << describe_bytes(bytes) << ": out of memory (" << describe_bytes(m.available, false)
     << " available: " << m.source << ")";
  throw OutOfMemory(os.str());
}

bool huge_pages_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LATTICE_HUGE_PAGES");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

void protect_all(int prot) {
  for (const auto& [p, n] : state().pages)
    LATTICE_CHECK(mprotect(p, n, prot) == 0) << "CUDA emulation: mprotect failed: " << std::strerror(errno);
}

bool single_process() {
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  return !s || std::atoi(s) <= 1;
}

}  // namespace

const char* device_name(Device d) { return d == Device::cuda ? "cuda" : "cpu"; }

Device parse_device(const char* name) {
  const std::string n = name ? name : "";
  if (n == "cpu") return Device::cpu;
  if (n == "cuda") return Device::cuda;
  LATTICE_FAIL() << "--device must be cpu or cuda, got '" << n << "'";
}

Device current_device() { return state().device; }

void set_cuda_emulation(bool on) { state().emulate_requested = on; }
bool cuda_emulated() { return state().device == Device::cuda && state().emulated; }
bool kernels_on_gpu() { return state().device == Device::cuda && !state().emulated; }

void set_device(Device d, int local_rank) {
  DeviceState& s = state();
  LATTICE_CHECK(s.pages.empty()) << "set_device after device memory was allocated";
  if (d == Device::cpu) {
    s.device = Device::cpu;
    s.emulated = s.guard = false;
    return;
  }
  const char* env = std::getenv("LATTICE_EMULATE_CUDA");
  if (s.emulate_requested || (env && std::string(env) == "1")) {
    s.device = Device::cuda;
    s.emulated = true;
    s.guard = single_process();
    return;
  }
  if (!cuda::available()) LATTICE_FAIL() << "--device cuda: " << cuda::unavailable_reason();
  cuda::select_device(local_rank);
  s.device = Device::cuda;
  s.emulated = s.guard = false;
}

namespace {

// device_alloc's running totals (buffers may be made on several threads).
std::atomic<size_t> g_allocated{0}, g_peak_allocated{0};
std::atomic<int64_t> g_allocations{0};

void count_alloc(size_t bytes) {
  const size_t now = g_allocated.fetch_add(bytes) + bytes;
  size_t peak = g_peak_allocated.load();
  while (now > peak && !g_peak_allocated.compare_exchange_weak(peak, now)) {
  }
  g_allocations.fetch_add(1);
}

// Zeroes bytes at p, large fills in 1 MiB pieces over the OpenMP threads: one thread's memset of
// 0.5 GB ran at 9.6 GB/s (build/kernel_bench --benchmark_filter=Zero), and a new buffer's first
// touch (the page faults that map it) runs in parallel too.
void zero_bytes(void* p, size_t bytes) {
  constexpr size_t kPiece = size_t(1) << 20;
  const int64_t pieces = int64_t((bytes + kPiece - 1) / kPiece);
  char* c = static_cast<char*>(p);
#pragma omp parallel for schedule(static) if (pieces > 4)
  for (int64_t k = 0; k < pieces; ++k) {
    const size_t at = size_t(k) * kPiece;
    std::memset(c + at, 0, std::min(kPiece, bytes - at));
  }
}

// A buffer of `bytes` on the current device (zeroed on the CPU), not yet counted in the totals.
void* alloc_uncounted(size_t bytes) {
  DeviceState& s = state();
  if (kernels_on_gpu()) return cuda::malloc_device(bytes);
  if (s.device == Device::cuda) {  // emulation: whole pages, guarded
    const size_t n = page_round(bytes ? bytes : 1);
    check_host_memory(n);
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw OutOfMemory("CUDA emulation: cannot map " + describe_bytes(n) + ": out of memory");
    if (s.guard && s.access_depth == 0) {
      LATTICE_CHECK(mprotect(p, n, PROT_NONE) == 0) << "CUDA emulation: mprotect failed: " << std::strerror(errno);
    }
    s.pages[p] = n;
    return p;
  }
  // Large buffers (parameters, gradients, optimizer state, the activation arena) start on a
  // 2 MB boundary and are advised as transparent huge pages: the kernels stream through
  // them, and with 4 KB pages every 4 KB is a TLB miss and a stop of the hardware
  // prefetcher. Where THP is "madvise" (Debian's and Ubuntu's default) nothing else would
  // give them huge pages. LATTICE_HUGE_PAGES=0 turns the advice off.
  constexpr size_t kHugePage = size_t(2) << 20;
  const size_t rounded = (bytes + 63) / 64 * 64;
  const bool huge = rounded >= 8 * kHugePage && huge_pages_enabled();
  const size_t n = huge ? (rounded + kHugePage - 1) / kHugePage * kHugePage : (rounded ? rounded : 64);
  check_host_memory(n);
  void* p = std::aligned_alloc(huge ? kHugePage : 64, n);
  if (p == nullptr) throw OutOfMemory("cannot allocate " + describe_bytes(n) + ": out of memory");
  if (huge) (void)madvise(p, n, MADV_HUGEPAGE);  // advice only: without THP it changes nothing
  zero_bytes(p, n);
  return p;
}

}  // namespace

DeviceAllocStats device_alloc_stats() {
  return DeviceAllocStats{g_allocated.load(), g_peak_allocated.load(), g_allocations.load()};
}

void* device_alloc(size_t bytes) {
  void* p = alloc_uncounted(bytes);
  count_alloc(bytes);
  return p;
}

void device_free(void* p, size_t bytes) {
  if (!p) return;
  g_allocated.fetch_sub(bytes);
  g_allocations.fetch_sub(1);
  DeviceState& s = state();
  if (kernels_on_gpu()) return cuda::free_device(p);
  auto it = s.pages.find(p);
  if (it != s.pages.end()) {
    munmap(it->first, it->second);
    s.pages.erase(it);
    return;
  }
  std::free(p);
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  if (kernels_on_gpu()) return cuda::copy_to_device(dst, src, bytes);
  DeviceAccess a;
  std::memcpy(dst, src, bytes);
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  if (kernels_on_gpu()) return cuda::copy_to_host(dst, src, bytes);
  DeviceAccess a;
  std::memcpy(dst, src, bytes);
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (!bytes || dst == src) return;
  if (kernels_on_gpu()) return cuda::copy_device_to_device(dst, src, bytes);
  DeviceAccess a;
  std::memmove(dst, src, bytes);
}

void copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
  if (!width || !rows) return;
  LATTICE_CHECK(width <= dst_pitch && width <= src_pitch)
      << "copy_rows_on_device: width " << width << " exceeds a pitch (" << dst_pitch << ", " << src_pitch << ")";
  if (kernels_on_gpu()) return cuda::copy_rows_device_to_device(dst, dst_pitch, src, src_pitch, width, rows);
  DeviceAccess a;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
#pragma omp parallel for schedule(static) if (rows * width > (1 << 16))
  for (int64_t r = 0; r < int64_t(rows); ++r) std::memcpy(d + size_t(r) * dst_pitch, s + size_t(r) * src_pitch, width);
}

void zero_on_device(void* p, size_t bytes) {
  if (!bytes) return;
  if (kernels_on_gpu()) return cuda::memset_device(p, 0, bytes);
  DeviceAccess a;
  zero_bytes(p, bytes);  // zero_grad's fill: every gradient, each step
}

void device_synchronize() {
  if (kernels_on_gpu()) cuda::synchronize();
}

// Kernels nest (a CPU kernel may call the GEMM facade from its OpenMP threads), so the
// depth is counted under a lock.
static std::mutex& access_mutex() {
  static std::mutex m;
  return m;
}

DeviceAccess::DeviceAccess() {
  DeviceState& s = state();
  if (!s.guard) return;
  std::lock_guard<std::mutex> lock(access_mutex());
  if (s.access_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}

DeviceAccess::~DeviceAccess() {
  DeviceState& s = state();
  if (!s.guard) return;
  std::lock_guard<std::mutex> lock(access_mutex());
  if (--s.access_depth == 0) protect_all(PROT_NONE);
}

}  // namespace lattice
