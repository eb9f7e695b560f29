#include "core/log.h"

namespace lattice {

namespace {
bool g_log_info = true;
}

void set_log_info_enabled(bool enabled) { g_log_info = enabled; }

void log_on_this_rank(const std::string& msg) {
  std::fputs((msg + "\n").c_str(), stdout);  // one write: under mpirun the lines stay together
  std::fflush(stdout);
}

void log_info(const std::string& msg) {
  if (g_log_info) log_on_this_rank(msg);
}

void log_warn(const std::string& msg) {
  std::fprintf(stderr, "warning: %s\n", msg.c_str());
}

}  // namespace lattice
