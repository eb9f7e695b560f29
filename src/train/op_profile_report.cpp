#include "train/op_profile_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/device.h"
#include "core/log.h"

namespace lattice {

std::string format_op_profile(std::vector<OpProfileEntry> ops, const std::string& heading, int64_t iterations,
                              double iteration_ms) {
  std::stable_sort(ops.begin(), ops.end(), [](const OpProfileEntry& a, const OpProfileEntry& b) { return a.ms > b.ms; });
  size_t width = 24;
  double op_ms = 0;
  for (const OpProfileEntry& e : ops) {
    width = std::max(width, e.name.size());
    op_ms += e.ms;
  }
  const double n = double(iterations);
  std::ostringstream os;
  char buf[512];
  os << heading << "\n";
  std::snprintf(buf, sizeof buf, "  %-*s %12s %12s %13s\n", int(width), "op", "calls/iter", "ms/iter", "% of op time");
  os << buf;
  for (const OpProfileEntry& e : ops) {
    std::snprintf(buf, sizeof buf, "  %-*s %12.1f %12.3f %12.1f%%\n", int(width), e.name.c_str(), double(e.calls) / n,
                  e.ms / n, op_ms > 0 ? 100.0 * e.ms / op_ms : 0.0);
    os << buf;
  }
  const double op_per_iter = op_ms / n, measured_per_iter = iteration_ms / n;
  std::snprintf(buf, sizeof buf,
                "> op time per iteration %.3f ms of %.3f ms measured (%.1f%%); outside the ops (communication, host "
                "work, launch gaps): %.3f ms",
                op_per_iter, measured_per_iter, measured_per_iter > 0 ? 100.0 * op_per_iter / measured_per_iter : 0.0,
                measured_per_iter - op_per_iter);
  os << buf;
  return os.str();
}

OpProfileWindow::OpProfileWindow(bool enabled) : enabled_(enabled) {
  if (enabled_) op_profiler_reset();
}

OpProfileWindow::OpProfileWindow(int64_t start, int64_t end, int rank)
    : enabled_(true), start_(start), end_(end), rank_(rank) {
  op_profiler_reset();
}

OpProfileWindow::~OpProfileWindow() {
  if (enabled_) op_profiler_stop();
}

void OpProfileWindow::before_step(int64_t iteration) {
  if (!enabled_ || (rank_ < 0 ? steps_ == 0 : iteration < start_ || iteration >= end_)) return;
  if (profiled_steps_ == 0) first_ = iteration + 1;
  last_ = iteration + 1;
  op_profiler_start();
  profiling_ = true;
}

void OpProfileWindow::after_step(double step_ms) {
  if (!enabled_) return;
  ++steps_;
  if (!profiling_) return;
  op_profiler_stop();
  profiling_ = false;
  ++profiled_steps_;
  profiled_ms_ += step_ms;
}

void OpProfileWindow::log_report() {
  if (!enabled_) return;
  const std::string clock = kernels_on_gpu()
                                ? "GPU time of each kernel call (CUDA events on the compute stream)"
                                : "wall time of each kernel call on the host";
  const int64_t n = profiled_steps_;
  std::ostringstream os;
  if (rank_ < 0) {
    os << "> op profile (--profile-ops)";
    if (n == 0)
      os << ": no iteration profiled (the first one is warm-up: train 2 or more)";
    else
      os << " over " << n << " iteration" << (n == 1 ? "" : "s") << " after the first, " << clock << ":";
    log_info(n == 0 ? os.str() : format_op_profile(op_profiler_entries(), os.str(), n, profiled_ms_));
    return;
  }
  // --profile: each profiling rank logs its own table.
  os << "> op profile (--profile) of rank " << rank_;
  if (n == 0)
    os << ": no iteration profiled (--profile-step-start " << start_ << " and --profile-step-end " << end_
       << " select iterations " << start_ + 1 << " to " << end_ << ", which this run did not train)";
  else if (n == 1)
    os << " over iteration " << first_ << ", " << clock << ":";
  else
    os << " over iterations " << first_ << " to " << last_ << ", " << clock << ":";
  log_on_this_rank(n == 0 ? os.str() : format_op_profile(op_profiler_entries(), os.str(), n, profiled_ms_));
}

}  // namespace lattice
