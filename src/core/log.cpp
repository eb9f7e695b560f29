#include "core/log.h"

namespace lattice {

namespace {
bool g_log_info = true;
}

void set_log_info_enabled(bool enabled) { g_log_info = enabled; }

void log_info(const std::string& msg) {
  if (!g_log_info) return;
  std::fputs(msg.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void log_warn(const std::string& msg) {
  std::fprintf(stderr, "warning: %s\n", msg.c_str());
}

}  // namespace lattice
