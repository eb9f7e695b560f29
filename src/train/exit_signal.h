// --exit-signal-handler: SIGTERM and SIGINT ask the trainer to save a checkpoint and exit
// after the iteration in progress (Megatron's DistributedSignalHandler).
//
// No signal handler ever runs on a compute thread. A handler's frame is pushed on the stack of
// whichever thread the kernel picks, 128 bytes below its stack pointer; oneDNN's JIT GEMM
// kernels (Debian's libdnnl 2.6) keep data further below it, so a signal landing mid-GEMM
// corrupts the GEMM's result and the heap ("corrupted size vs. prev_size" in its free).
// Instead the signals are blocked in the trainer's threads and one watcher thread takes
// them with sigwait.
#pragma once

namespace lattice {

// Blocks SIGTERM and SIGINT in the calling thread, and so in every thread started after it
// (OpenMP's, MPI's, CUDA's: they inherit the mask), and starts the thread that waits for
// them. Call before any other thread exists. Once per process; later calls do nothing.
void start_exit_signal_watcher();

// 0 until SIGTERM or SIGINT has arrived, then the first one's number.
int exit_signal_received();

}  // namespace lattice
