// The per-op profiler (`lattice train --profile-ops`): how many times each kernel ran and
// how long it took, like PyTorch profiler's key_averages table.
//
// Every kernel entry (LATTICE_KERNEL_ENTRY, core/device.h) holds an OpTimer named after
// the kernel's function (__func__: "layernorm_forward", "gemm_bf16"). Off (the default),
// an OpTimer costs one predictable branch on a global flag (and a test of a local at the
// exit). On, the outermost kernel call of the thread that started the profiler is timed;
// kernels called by kernels, and calls from other threads (OpenMP workers, communication
// threads), are not:
//   - CPU kernels: host wall time (steady_clock) around the call;
//   - kernels on a GPU: a pair of CUDA events recorded on the compute stream around the
//     asynchronous launch: the GPU time between them. Nothing waits per call; the events
//     are read when the totals are asked for, or when all event pairs are in use.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace lattice {

// Profiles the calling thread's kernel calls from now on (the totals so far are kept).
void op_profiler_start();
// Stops profiling (the totals are kept).
void op_profiler_stop();
bool op_profiler_enabled();
// Forgets every total (starts a new profile window).
void op_profiler_reset();

// One kernel's totals over the profile window.
struct OpProfileEntry {
  std::string name;  // the kernel's function name
  int64_t calls = 0;
  double ms = 0;     // summed time of the calls
};
// Every kernel called in the window, the longest total first (then by name). Waits for
// the GPU timings still pending.
std::vector<OpProfileEntry> op_profiler_entries();

namespace op_profiler_detail {
extern std::atomic<bool> g_enabled;
}

// Which clock times a kernel call.
enum class OpClock { host, gpu };

// Times one kernel call, from construction to destruction, while the profiler is on.
class OpTimer {
 public:
  explicit OpTimer(const char* name, OpClock clock = OpClock::host) noexcept {
    if (op_profiler_detail::g_enabled.load(std::memory_order_relaxed)) [[unlikely]]
      begin(name, clock);
  }
  ~OpTimer() {
    if (name_) [[unlikely]]
      end();
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  void begin(const char* name, OpClock clock) noexcept;
  void end() noexcept;

  // Set while this call is timed; the others only then (begin), so that an untimed call
  // stores nothing else.
  const char* name_ = nullptr;
  int64_t start_ns_;  // host clock
  int gpu_pair_;      // GPU clock: its event pair; -1 on the host clock
};

}  // namespace lattice
