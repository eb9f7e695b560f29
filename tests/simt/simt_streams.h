// The SIMT emulation's streams: work queued in stream order, run only when something
// waits for it (simt_streams.cpp). Used by its CUDA runtime (simt_cudart.cpp), its kernel
// launches (simt_scheduler.cpp), its cuBLASLt (simt_cublaslt.cpp) and its NCCL
// (simt_nccl.cpp).
//
// On a GPU a stream's work runs some time after the host enqueued it, and two streams run
// independently unless an event orders them. Here a stream's work waits until the latest
// moment the CUDA semantics allow: a synchronization on the stream or on an event recorded
// in it, a device synchronization, a copy to host memory, cudaFree, an NCCL operation on it.
// Which independent work runs first is LATTICE_SIMT_STREAMS's choice:
//   reads-early (the default): a stream's own work before the other streams' work it waits
//     for later, so a reader not ordered after its writer -- a kernel reading an NCCL result
//     without waiting on its event -- reads what was there before;
//   writes-early: the work a stream waits for anywhere up to the point it must reach runs
//     first, so a write not ordered after a reader -- a kernel refilling a buffer an NCCL
//     operation has not finished sending -- lands before the reader is done (simt_nccl.cpp
//     checks its inputs then);
//   sync: every operation when it is enqueued (a failure that goes away with it is an
//     ordering bug).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace lattice::simt {

// Queues `work` at the end of the stream (nullptr: the default stream).
void enqueue(cudaStream_t stream, std::function<void()> work);
// Runs the stream's queued work, and first the work of other streams it waits for.
void drain(cudaStream_t stream);
// Runs every stream's queued work.
void drain_all();

// An operation's input check (simt_nccl.cpp): `verify` tests that the input still holds what
// the operation read when it was enqueued, and is due once the operation is known complete
// -- a synchronization on its stream, an event after it waited for -- or its stream is about
// to write over the input itself. Until then a GPU may still be reading the input.
void enqueue_check(cudaStream_t stream, const void* ptr, size_t bytes, std::function<void()> verify);
// drain() before an operation reads what its stream's work makes. The checks it passes stay
// outstanding: the operations before may still be running on a GPU.
void drain_for_operation(cudaStream_t stream);
// Runs the stream's outstanding checks of inputs that overlap [dst, dst + bytes), before
// the stream writes there.
void verify_checks_before_write(cudaStream_t stream, const void* dst, size_t bytes);
// The order of independent work (LATTICE_SIMT_STREAMS, above), and changing it.
enum class StreamOrder { reads_early, writes_early, sync };
StreamOrder stream_order();
// For tests: another order from now on (the queued work runs first).
void set_stream_order(StreamOrder order);

// The runtime's stream and event objects.
cudaStream_t create_stream();
void destroy_stream(cudaStream_t stream);  // runs its queued work first
cudaEvent_t create_event();
void destroy_event(cudaEvent_t event);
// Records the event at the stream's current end; the event completes when the stream's
// work up to here has run, and takes the time then.
void record_event(cudaEvent_t event, cudaStream_t stream);
// The stream's later work waits until the event, as last recorded, completes.
void wait_event(cudaStream_t stream, cudaEvent_t event);
// Whether the event has completed. An event not yet complete is reported not ready once
// per recording, then its work is run (what a host that polls it would eventually see).
bool query_event(cudaEvent_t event);
// Runs the work the event waits for.
void synchronize_event(cudaEvent_t event);
// Whether the event has completed (nothing is run).
bool event_completed(cudaEvent_t event);
// Milliseconds between two completed events.
float elapsed_ms(cudaEvent_t start, cudaEvent_t stop);

}  // namespace lattice::simt
