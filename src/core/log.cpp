#include "core/log.h"

namespace lattice {

void log_info(const std::string& msg) {
  std::fputs(msg.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void log_warn(const std::string& msg) {
  std::fprintf(stderr, "warning: %s\n", msg.c_str());
}

}  // namespace lattice
