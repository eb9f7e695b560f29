#include "core/op_profiler.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/device.h"
#include "core/op_profiler_gpu.h"

namespace lattice {

namespace op_profiler_detail {
std::atomic<bool> g_enabled{false};
}  // namespace op_profiler_detail

namespace {

using op_profiler_detail::g_enabled;

struct Totals {
  int64_t calls = 0;
  double ms = 0;
};

// A GPU-timed call whose events have not been read yet.
struct PendingGpuCall {
  const char* name;
  int pair;
};

struct Profile {
  std::mutex mu;  // the totals and pending calls (written by the profiled thread, read by anyone)
  // Keyed by the call site's __func__ (one static string per kernel definition); merged
  // by name when read.
  std::unordered_map<const char*, Totals> by_site;
  std::vector<PendingGpuCall> pending;  // in the order of their event pairs
  std::atomic<std::thread::id> owner{};  // the profiled thread
};

Profile& profile() {
  static Profile p;
  return p;
}

// Kernel calls in progress on this thread that are timed (0 or 1: nested ones are not).
thread_local int t_depth = 0;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Reads every pending GPU call's events (waiting for the GPU) into the totals and frees
// the pairs. Holds p.mu.
void resolve_pending_locked(Profile& p) {
  if (p.pending.empty()) return;
  for (const PendingGpuCall& c : p.pending) {
    Totals& t = p.by_site[c.name];
    ++t.calls;
    const float ms = op_profiler_detail::gpu_elapsed_ms(c.pair);
    if (ms > 0) t.ms += ms;
  }
  p.pending.clear();
  op_profiler_detail::gpu_release_pairs();
}

}  // namespace

void op_profiler_start() {
  Profile& p = profile();
  p.owner.store(std::this_thread::get_id(), std::memory_order_relaxed);
  if (kernels_on_gpu()) op_profiler_detail::gpu_prepare_events();
  g_enabled.store(true, std::memory_order_release);
}

void op_profiler_stop() { g_enabled.store(false, std::memory_order_release); }

bool op_profiler_enabled() { return g_enabled.load(std::memory_order_relaxed); }

void op_profiler_reset() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  resolve_pending_locked(p);  // waits for the recorded events before their pairs are reused
  p.by_site.clear();
}

std::vector<OpProfileEntry> op_profiler_entries() {
  Profile& p = profile();
  std::map<std::string, Totals> by_name;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    resolve_pending_locked(p);
    for (const auto& [site, t] : p.by_site) {
      Totals& n = by_name[site];
      n.calls += t.calls;
      n.ms += t.ms;
    }
  }
  std::vector<OpProfileEntry> out;
  for (const auto& [name, t] : by_name) out.push_back({name, t.calls, t.ms});
  std::stable_sort(out.begin(), out.end(), [](const OpProfileEntry& a, const OpProfileEntry& b) { return a.ms > b.ms; });
  return out;
}

void OpTimer::begin(const char* name, OpClock clock) noexcept {
  Profile& p = profile();
  if (std::this_thread::get_id() != p.owner.load(std::memory_order_relaxed) || t_depth != 0) return;
  if (clock == OpClock::gpu) {
    std::lock_guard<std::mutex> lock(p.mu);
    gpu_pair_ = op_profiler_detail::gpu_record_start();
    if (gpu_pair_ < 0 && !p.pending.empty()) {  // every pair in use: read them, then reuse
      resolve_pending_locked(p);
      gpu_pair_ = op_profiler_detail::gpu_record_start();
    }
    if (gpu_pair_ < 0) return;  // CUDA failed: the call is not timed
  } else {
    gpu_pair_ = -1;
    start_ns_ = now_ns();
  }
  t_depth = 1;
  name_ = name;
}

void OpTimer::end() noexcept {
  t_depth = 0;
  Profile& p = profile();
  if (gpu_pair_ >= 0) {
    std::lock_guard<std::mutex> lock(p.mu);
    if (op_profiler_detail::gpu_record_stop(gpu_pair_)) {
      p.pending.push_back({name_, gpu_pair_});
    } else {
      ++p.by_site[name_].calls;  // counted, not timed
    }
    return;
  }
  const double ms = double(now_ns() - start_ns_) * 1e-6;
  std::lock_guard<std::mutex> lock(p.mu);
  Totals& t = p.by_site[name_];
  ++t.calls;
  t.ms += ms;
}

}  // namespace lattice
