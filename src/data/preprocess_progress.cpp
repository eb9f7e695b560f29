// PreprocessProgress: the progress line of `lattice preprocess`.
#include "data/preprocess_progress.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace lattice {

PreprocessProgress::PreprocessProgress(int64_t total_file_bytes, bool enabled)
    : total_(total_file_bytes), enabled_(enabled), tty_(::isatty(STDERR_FILENO) == 1),
      start_(Clock::now()), last_(start_) {}

PreprocessProgress::~PreprocessProgress() { finish(); }

std::string PreprocessProgress::group_thousands(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return (v < 0 ? "-" : "") + out;
}

void PreprocessProgress::update(int64_t documents, int64_t bytes, int64_t read_bytes, int64_t read_file_bytes) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  if (since_last < (tty_ ? 0.2 : 30.0)) return;
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double mb = double(bytes) / 1e6, rate = elapsed > 0 ? mb / elapsed : 0;
  const double expected = read_file_bytes > 0 ? double(total_) * double(read_bytes) / double(read_file_bytes) : 0;
  const double frac = expected > 0 ? std::min(1.0, double(bytes) / expected) : 0;
  char eta[32] = "--:--";
  if (frac > 0.001 && frac <= 1) {
    const int64_t s = int64_t(elapsed / frac - elapsed + 0.5);
    std::snprintf(eta, sizeof eta, "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60),
                  (long long)(s % 60));
  }
  char bar[21];
  const int filled = int(frac * 20 + 0.5);
  for (int i = 0; i < 20; ++i) bar[i] = i < filled ? '#' : '.';
  bar[20] = '\0';
  std::fprintf(stderr, "%spreprocess [%s] %3.0f%%  %s documents  %.1f MB  %.2f MB/s  ETA %s%s", tty_ ? "\r\033[K" : "",
               bar, frac * 100, group_thousands(documents).c_str(), mb, rate, eta, tty_ ? "" : "\n");
  std::fflush(stderr);
  drawn_ = tty_;
}

void PreprocessProgress::finish() {
  if (drawn_) std::fputs("\r\033[K", stderr);
  drawn_ = false;
}

double peak_rss_mb() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace lattice
