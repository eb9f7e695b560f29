// A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) prints one line naming it and
// the stack of the thread that received it to stderr, then the signal is raised again
// with its default action: the exit status (128 + signal) and any core dump stay as they
// were. Under mpirun, Open MPI installs its own handlers for these signals at MPI_Init.
#pragma once

namespace lattice {

// Installs the handlers (on an alternate stack, so a stack overflow is reported too).
// `program` names the process in the report ("lattice train").
void install_crash_report(const char* program);

}  // namespace lattice
