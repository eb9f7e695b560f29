// NCCL implementation of Comm, for DEVICE pointers (the CUDA backend's tensor-, data-
// and pipeline-parallel traffic). One NCCL communicator per process group.
//
// Streams: every operation runs on the communicator's own CUDA stream, ordered after
// the work already queued on the compute stream (an event), so communication overlaps
// the compute that follows it (the data-parallel gradient buckets). A request's test()
// queries its completion event; wait() makes the compute stream wait on the event and
// blocks the host until it completes, polling ncclCommGetAsyncError, with the timeout of
// set_nccl_timeout_seconds: on timeout the communicator is aborted and the job ends
// with a message naming this rank, the group and its wait context (as the MPI Comm).
// The blocking operations are the non-blocking ones followed by wait(). Destroying an
// unfinished request orders the compute stream after it without blocking the host.
//
// Counting: as every Comm (dist/comm.h): all_reduce and broadcast count the buffer,
// reduce_scatter its full input, all_gather its full output, send/recv the message,
// barrier zero bytes (its one-element all-reduce is not counted as an all_reduce).
//
// Mapping onto NCCL:
// - ireduce_scatter: ncclReduceScatter when all counts are equal; otherwise one
//   ncclReduce per rank (root r gets piece r) inside ncclGroupStart/End. Grouped reduces
//   need no padded copies of the input or output (padding would copy the whole send
//   buffer into a padded layout each call); NCCL runs the group as one launch.
// - iall_gather: ncclAllGather (in place) when all counts are equal; otherwise one
//   in-place ncclBroadcast per rank (root r sends piece r) inside a group.
// - send/recv: ncclSend/ncclRecv. NCCL has no tags: the messages from one rank to another
//   match in the order they are issued (tags are only checked to be non-negative; the
//   pipeline schedule sends and receives in the same order on both sides). NCCL runs a
//   communicator's operations in order and a send blocks until its receive runs, so on the
//   group's one communicator a send pending to a peer holds back this rank's receives from
//   that peer: two pipeline stages exchanging activations and gradients deadlock (1F1B
//   does). A group made with point_to_point (the pipeline group) has a channel per
//   direction between ring neighbours (a NCCL communicator of the two ranks, with its own
//   stream), so a send waits only for its own receive, as an MPI send does; other pairs
//   use the group's communicator. A send to itself is held until the matching irecv from
//   itself, then both run as one NCCL group (a blocking send to itself fails: nothing
//   could receive it).
// - barrier: an all-reduce of one float.
#pragma once
#include <memory>
#include <string>

#include "dist/comm.h"

namespace lattice {

// A NCCL communicator over the same processes as `group` (an MPI or local Comm, host
// memory): group rank 0 makes the ncclUniqueId and `group`'s broadcast sends it to the
// others (counted in `group`'s stats, hence not const). Every member must call this.
// The device is the one cuda::select_device chose (device 0 when none was selected).
// Fails with "built without the CUDA backend" in a CPU-only build.
// point_to_point: also the channels between ring neighbours (above), for send/recv.
std::unique_ptr<Comm> make_nccl_comm(Comm& group, const std::string& name, bool point_to_point = false);

// Seconds a wait on a NCCL operation may last (--distributed-timeout-minutes); the
// same default as the MPI Comm (600 s).
void set_nccl_timeout_seconds(double seconds);

// Tests: reduce_scatter and all_gather use the grouped per-rank form even when the
// counts are equal (so a one-GPU test runs that path too).
void nccl_force_grouped_collectives(bool force);

}  // namespace lattice
