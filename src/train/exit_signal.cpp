#include "train/exit_signal.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace lattice {
namespace {

std::atomic<int> g_exit_signal{0};

sigset_t exit_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// Takes each SIGTERM / SIGINT sent to the process; the first one's number stays. The thread
// is detached: it waits until the process exits.
void watch(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    int none = 0;
    g_exit_signal.compare_exchange_strong(none, sig);
  }
}

}  // namespace

void start_exit_signal_watcher() {
  static std::once_flag once;
  std::call_once(once, [] {
    const sigset_t set = exit_signals();
    const int err = pthread_sigmask(SIG_BLOCK, &set, nullptr);
    LATTICE_CHECK(err == 0) << "--exit-signal-handler: cannot block SIGTERM/SIGINT: " << std::strerror(err);
    std::thread(watch, set).detach();
  });
}

int exit_signal_received() { return g_exit_signal.load(); }

}  // namespace lattice
