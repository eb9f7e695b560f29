// --profile-ops: where each training iteration's time goes, op by op. The first
// iteration is warm-up (allocations, cuBLASLt's algorithm search, caches); the profiler
// (core/op_profiler.h) then times every later iteration's kernels (--profile: the
// iterations of Megatron's --profile-step-start/--profile-step-end window, on each rank
// of --profile-ranks), and at the end the log gets one table: each op's calls and milliseconds per iteration and its share of
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
// heading: its first line (which steps, how the ops were timed); iterations: how many
// iterations the window holds (1 or more); iteration_ms: their measured time in all.
std::string format_op_profile(std::vector<OpProfileEntry> ops, const std::string& heading, int64_t iterations,
                              double iteration_ms);

// The trainer's side: profiling on for the window's training steps, off between steps
// (logging, evaluation, checkpoints are not in the table).
class OpProfileWindow {
 public:
  // --profile-ops (enabled): every step after the run's first.
  explicit OpProfileWindow(bool enabled);
  // --profile (Megatron's): the steps that start with `start` to `end - 1` iterations done
  // (iterations start + 1 to end), on this rank, which logs the table itself as `rank`'s.
  OpProfileWindow(int64_t start, int64_t end, int rank);
  ~OpProfileWindow();
  OpProfileWindow(const OpProfileWindow&) = delete;
  OpProfileWindow& operator=(const OpProfileWindow&) = delete;

  // Before a training step, `iteration` iterations done: profiling on when the step is in the window.
  void before_step(int64_t iteration);
  // After it, with its measured time: profiling off.
  void after_step(double step_ms);
  // Logs the table (nothing when the window is off).
  void log_report();

 private:
  bool enabled_;
  int64_t start_ = 0, end_ = 0;  // --profile's window of iterations done; rank_ < 0: --profile-ops
  int rank_ = -1;
  bool profiling_ = false;
  int64_t steps_ = 0, profiled_steps_ = 0;
  int64_t first_ = 0, last_ = 0;  // the profiled iterations (1-based)
  double profiled_ms_ = 0;
};

}  // namespace lattice
