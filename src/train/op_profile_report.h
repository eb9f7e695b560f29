// --profile-ops: where each training iteration's time goes, op by op. The first
// iteration is warm-up (allocations, cuBLASLt's algorithm search, caches); the profiler
// (core/op_profiler.h) then times every later iteration's kernels, and at the end the
// log gets one table: each op's calls and milliseconds per iteration and its share of
// the op time, the longest first, then the op time per iteration against the measured
// iteration time; the difference is what no kernel accounts for (communication, host
// work, launch gaps).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/op_profiler.h"

namespace lattice {

// The table for the log, the longest op first. ops: the profile window's totals;
// iterations: how many iterations the window holds; iteration_ms: their measured time
// in all; clock: how the ops were timed, for the heading.
std::string format_op_profile(std::vector<OpProfileEntry> ops, int64_t iterations, double iteration_ms,
                              const std::string& clock);

// The trainer's side: profiling on for each training step after the first, off between
// steps (logging, evaluation, checkpoints are not in the table).
class OpProfileWindow {
 public:
  explicit OpProfileWindow(bool enabled);
  ~OpProfileWindow();
  OpProfileWindow(const OpProfileWindow&) = delete;
  OpProfileWindow& operator=(const OpProfileWindow&) = delete;

  // Before a training step: profiling on, unless it is the first (warm-up).
  void before_step();
  // After it, with its measured time: profiling off.
  void after_step(double step_ms);
  // Logs the table (nothing when --profile-ops is off).
  void log_report();

 private:
  bool enabled_;
  bool profiling_ = false;
  int64_t steps_ = 0, profiled_steps_ = 0;
  double profiled_ms_ = 0;
};

}  // namespace lattice
