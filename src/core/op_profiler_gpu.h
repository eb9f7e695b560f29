// The GPU side of the op profiler (core/op_profiler.h): a pool of CUDA event pairs
// recorded on the compute stream around kernel launches, reused once their times are
// read. Internal to the profiler; no CUDA header leaks out of here. Built without the
// CUDA backend, no pair can be recorded (gpu_record_start returns -1).
#pragma once

namespace lattice::op_profiler_detail {

// Pairs in the pool: the profiler reads them all (waiting for the GPU) when every one
// is in use.
constexpr int kGpuEventPairs = 8192;

// Creates the pool's events up front (so creating them does not land in a timed call).
void gpu_prepare_events() noexcept;
// Records the start event of the next free pair on the compute stream and returns the
// pair; -1 when every pair is in use (read them, then gpu_release_pairs) or CUDA failed.
int gpu_record_start() noexcept;
// Records the pair's stop event on the compute stream; false when CUDA failed.
bool gpu_record_stop(int pair) noexcept;
// Waits for the pair's stop event; the milliseconds between its two events, or a
// negative value when CUDA failed.
float gpu_elapsed_ms(int pair) noexcept;
// Every pair free again (after their times were read).
void gpu_release_pairs() noexcept;
// Destroys the pool's events (the next start creates them again, on the device then current).
void gpu_destroy_events() noexcept;

}  // namespace lattice::op_profiler_detail
