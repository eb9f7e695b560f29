#include "core/crash_report.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace lattice {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
char g_program[64] = "lattice";

// Only async-signal-safe calls below: write, backtrace_symbols_fd, sigaction, raise, and
// dladdr (not on POSIX's list, but what backtrace_symbols_fd itself does for every frame).
void write_str(const char* s) {
  const size_t n = std::strlen(s);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(STDERR_FILENO, s + done, n - done);
    if (w <= 0) return;
    done += size_t(w);
  }
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGFPE: return "SIGFPE (arithmetic exception)";
    case SIGILL: return "SIGILL (illegal instruction: a binary built for another CPU?)";
    case SIGABRT: return "SIGABRT (abort)";
    default: return "signal";
  }
}

extern "C" void on_fatal_signal(int sig) {
  write_str(g_program);
  write_str(": fatal ");
  write_str(signal_name(sig));
  write_str("; stack of the thread that received it:\n");
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  // A frame in no loaded file is code generated at run time (oneDNN's JIT GEMM kernels):
  // it has no unwind information, so the stack ends there, before lattice's own frames.
  for (int i = 0; i < n; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) == 0) {
      write_str("(the stack ends in code generated at run time, such as oneDNN's JIT kernels:"
                " its callers cannot be shown)\n");
      break;
    }
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);  // delivered when this handler returns: the default action, exit status 128 + sig
}

}  // namespace

void install_crash_report(const char* program) {
  std::strncpy(g_program, program, sizeof g_program - 1);
  // backtrace loads libgcc's unwinder on its first call, which may allocate: not in a
  // signal handler.
  void* warm[2];
  backtrace(warm, 2);
  static char alt_stack[1 << 16];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) sigaction(sig, &sa, nullptr);
}

}  // namespace lattice
