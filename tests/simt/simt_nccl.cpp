// The SIMT emulation's NCCL, over MPI: linked instead of libnccl into the emulation's
// binaries, so lattice's NCCL communicators (dist/nccl_comm.cpp) run under mpirun without
// a GPU. Device memory is host memory there, so each operation is MPI on the buffers.
//
// A communicator: ncclGetUniqueId records the calling world rank and a counter; in
// ncclCommInitRank every member sends its world rank to that rank, which answers with the
// members in rank order, and MPI_Comm_create_group (collective over the members only)
// makes the communicator. Operations run when issued, between ncclGroupStart and
// ncclGroupEnd at the end: first the stream's queued work runs (simt_streams.h: the
// kernels that make the data, and what the stream waits for), then the operation reads its
// data and communicates, and its results are written in the stream's order, when the
// stream's work runs on (so a kernel not ordered after the operation by an event reads what
// was there before, as it could on a GPU).
// A send does not block the host (NCCL's blocks its stream, not the host): its data is
// copied (what the stream would send at this point) and sent by a nonblocking MPI send,
// completed in the background and at the communicator's destruction; a receive returns
// when its data has arrived (a group's receives together). As NCCL runs a communicator's
// operations in order, a receive or collective first waits until this rank's earlier
// sends on that communicator have been received (so a send and a receive crossing between
// two ranks on one communicator deadlock here as they would on GPUs). Reductions gather every
// rank's data and add in rank order (bf16 in fp32, rounded once), so every rank gets the
// same bits. Without MPI (one process), communicators of one rank only.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cast_math.h"
#include "simt_streams.h"

namespace lattice::simt {
namespace {

constexpr int kTagInit = 0x7a00;  // world tags of the communicators' set-up (+ creator's counter % 256)
constexpr char kMagic[] = "lattice-simt-nccl";

struct Comm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::string last_error;
};

struct IdContents {
  char magic[sizeof kMagic];
  int creator;   // world rank
  int counter;   // the creator's communicators so far
};
static_assert(sizeof(IdContents) <= sizeof(ncclUniqueId::internal));

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

std::string g_last_error;

ncclResult_t refuse(Comm* c, const std::string& why) {
  g_last_error = why;
  if (c) c->last_error = why;
  return ncclInvalidUsage;
}

bool mpi_running() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// out[i] = op over the ranks' parts[r][i], in rank order.
template <typename T>
void reduce_typed(void* out, const std::vector<const char*>& parts, size_t count, ncclRedOp_t op) {
  for (size_t i = 0; i < count; ++i) {
    T acc;
    std::memcpy(&acc, parts[0] + i * sizeof(T), sizeof(T));
    for (size_t r = 1; r < parts.size(); ++r) {
      T v;
      std::memcpy(&v, parts[r] + i * sizeof(T), sizeof(T));
      acc = op == ncclSum ? T(acc + v) : op == ncclMax ? std::max(acc, v) : std::min(acc, v);
    }
    std::memcpy(static_cast<char*>(out) + i * sizeof(T), &acc, sizeof(T));
  }
}

void reduce_bf16(void* out, const std::vector<const char*>& parts, size_t count, ncclRedOp_t op) {
  for (size_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (size_t r = 0; r < parts.size(); ++r) {
      uint16_t b;
      std::memcpy(&b, parts[r] + i * 2, 2);
      const float v = math::bf16_to_fp32(b);
      acc = r == 0 ? v : op == ncclSum ? acc + v : op == ncclMax ? std::max(acc, v) : std::min(acc, v);
    }
    const uint16_t b = math::fp32_to_bf16(acc);
    std::memcpy(static_cast<char*>(out) + i * 2, &b, 2);
  }
}

ncclResult_t reduce_parts(void* out, const std::vector<const char*>& parts, size_t count, ncclDataType_t t,
                          ncclRedOp_t op, Comm* c) {
  if (op != ncclSum && op != ncclMax && op != ncclMin) return refuse(c, "reduction op " + std::to_string(int(op)));
  switch (t) {
    case ncclFloat32: reduce_typed<float>(out, parts, count, op); return ncclSuccess;
    case ncclFloat64: reduce_typed<double>(out, parts, count, op); return ncclSuccess;
    case ncclInt32: reduce_typed<int32_t>(out, parts, count, op); return ncclSuccess;
    case ncclUint8: reduce_typed<uint8_t>(out, parts, count, op); return ncclSuccess;
    case ncclBfloat16: reduce_bf16(out, parts, count, op); return ncclSuccess;
    default: return refuse(c, "reduction of data type " + std::to_string(int(t)));
  }
}

// Every rank's `bytes` bytes from `send`, rank after rank.
std::vector<char> gather_all(const void* send, size_t bytes, Comm* c) {
  std::vector<char> all(bytes * size_t(c->size));
  if (c->size == 1) {
    if (bytes) std::memcpy(all.data(), send, bytes);
  } else {
    MPI_Allgather(send, int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, c->mpi);
  }
  return all;
}

std::vector<const char*> parts_of(const std::vector<char>& all, size_t stride, size_t offset, int n) {
  std::vector<const char*> p;
  for (int r = 0; r < n; ++r) p.push_back(all.data() + size_t(r) * stride + offset);
  return p;
}

// ---- the operations (run now, or at the group's end) ----

struct Op {
  enum Kind { all_reduce, reduce, reduce_scatter, all_gather, broadcast, send, recv } kind;
  const void* sendbuf;
  void* recvbuf;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int peer;  // root or peer
  Comm* comm;
  cudaStream_t stream;
};

// Writes `data` to `dst` when the stream's work reaches this point: where the GPU's
// operation would write it.
void deliver(cudaStream_t stream, void* dst, std::vector<char> data) {
  if (data.empty()) return;
  auto d = std::make_shared<std::vector<char>>(std::move(data));
  enqueue(stream, [stream, dst, d] {
    verify_checks_before_write(stream, dst, d->size());
    std::memcpy(dst, d->data(), d->size());
  });
}

ncclResult_t run_collective(const Op& o) {
  Comm* c = o.comm;
  const size_t tb = type_bytes(o.type);
  if (!tb) return refuse(c, "data type " + std::to_string(int(o.type)));
  const size_t bytes = o.count * tb;
  switch (o.kind) {
    case Op::all_reduce: {
      const auto all = gather_all(o.sendbuf, bytes, c);
      std::vector<char> result(bytes);
      const ncclResult_t rc = reduce_parts(result.data(), parts_of(all, bytes, 0, c->size), o.count, o.type, o.op, c);
      if (rc == ncclSuccess) deliver(o.stream, o.recvbuf, std::move(result));
      return rc;
    }
    case Op::reduce: {
      if (o.peer < 0 || o.peer >= c->size) return refuse(c, "reduce to rank " + std::to_string(o.peer));
      std::vector<char> all(c->rank == o.peer ? bytes * size_t(c->size) : 0);
      if (c->size == 1) std::memcpy(all.data(), o.sendbuf, bytes);
      else MPI_Gather(o.sendbuf, int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, o.peer, c->mpi);
      if (c->rank != o.peer) return ncclSuccess;
      std::vector<char> result(bytes);
      const ncclResult_t rc = reduce_parts(result.data(), parts_of(all, bytes, 0, c->size), o.count, o.type, o.op, c);
      if (rc == ncclSuccess) deliver(o.stream, o.recvbuf, std::move(result));
      return rc;
    }
    case Op::reduce_scatter: {  // count per rank
      const auto all = gather_all(o.sendbuf, bytes * size_t(c->size), c);
      std::vector<char> result(bytes);
      const ncclResult_t rc = reduce_parts(
          result.data(), parts_of(all, bytes * size_t(c->size), bytes * size_t(c->rank), c->size), o.count, o.type,
          o.op, c);
      if (rc == ncclSuccess) deliver(o.stream, o.recvbuf, std::move(result));
      return rc;
    }
    case Op::all_gather: {  // count per rank; send may be recv's own piece (in place)
      const std::vector<char> mine(static_cast<const char*>(o.sendbuf), static_cast<const char*>(o.sendbuf) + bytes);
      deliver(o.stream, o.recvbuf, gather_all(mine.data(), bytes, c));
      return ncclSuccess;
    }
    case Op::broadcast: {
      if (o.peer < 0 || o.peer >= c->size) return refuse(c, "broadcast from rank " + std::to_string(o.peer));
      std::vector<char> data(bytes);
      if (c->rank == o.peer && bytes) std::memcpy(data.data(), o.sendbuf, bytes);
      if (c->size > 1) MPI_Bcast(data.data(), int(bytes), MPI_BYTE, o.peer, c->mpi);
      deliver(o.stream, o.recvbuf, std::move(data));
      return ncclSuccess;
    }
    default: return refuse(c, "not a collective");
  }
}

// The bytes the operation reads on this rank (none for a receive, or a broadcast's
// non-root ranks).
size_t input_bytes(const Op& o) {
  const size_t bytes = o.count * type_bytes(o.type);
  switch (o.kind) {
    case Op::recv: return 0;
    case Op::broadcast: return o.comm->rank == o.peer ? bytes : 0;
    case Op::reduce_scatter: return bytes * size_t(o.comm->size);
    default: return bytes;
  }
}

// The emulation reads an operation's input when it is enqueued; a GPU reads it while the
// stream runs the operation, which may be long after (a send waits for its receiver). A
// write to the input before the operation has completed -- one not ordered after the
// operation's event, say a kernel on the compute stream refilling a buffer still being sent
// -- would change what a GPU sends. So the input must still hold what was read when the
// operation is known complete (simt_streams.h: enqueue_check), or the process ends.
void guard_input(const Op& o) {
  const size_t bytes = input_bytes(o);
  if (bytes == 0) return;
  const auto* p = static_cast<const char*>(o.sendbuf);
  auto read = std::make_shared<std::vector<char>>(p, p + bytes);
  static const char* const kNames[] = {"all-reduce", "reduce", "reduce-scatter", "all-gather", "broadcast", "send"};
  const char* name = kNames[o.kind];
  enqueue_check(o.stream, p, bytes, [p, read, name] {
    if (std::memcmp(p, read->data(), read->size()) == 0) return;
    size_t at = 0;
    while (p[at] == (*read)[at]) ++at;
    std::fprintf(stderr,
                 "SIMT emulation: the input of an NCCL %s (%zu bytes at %p) was written at byte %zu "
                 "before the operation completed on its stream: a write not ordered after the operation's event\n",
                 name, read->size(), static_cast<const void*>(p), at);
    std::abort();
  });
}

int g_group_depth = 0;
std::vector<Op> g_queue;

// LATTICE_SIMT_NCCL_TRACE=1: every operation and group completion on stderr.
bool tracing() {
  static const bool on = std::getenv("LATTICE_SIMT_NCCL_TRACE") != nullptr;
  return on;
}

// Sends in flight: their data copied at the send, freed when MPI completes them.
struct InFlight {
  MPI_Request request;
  std::vector<char> data;
  MPI_Comm comm;
};
std::list<InFlight> g_in_flight;

void progress_sends() {
  for (auto it = g_in_flight.begin(); it != g_in_flight.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? g_in_flight.erase(it) : std::next(it);
  }
}

void finish_sends(MPI_Comm comm) {
  for (auto it = g_in_flight.begin(); it != g_in_flight.end();) {
    if (it->comm != comm) {
      ++it;
      continue;
    }
    MPI_Wait(&it->request, MPI_STATUS_IGNORE);
    it = g_in_flight.erase(it);
  }
}

ncclResult_t run_group() {
  std::vector<Op> ops;
  ops.swap(g_queue);
  // The data the operations read is what their streams' work so far makes.
  for (const Op& o : ops) drain_for_operation(o.stream);
  for (const Op& o : ops) guard_input(o);
  // A communicator runs its operations in order: what receives or reduces here starts
  // after this rank's earlier sends on the same communicator have been received.
  for (const Op& o : ops)
    if (o.kind != Op::send && o.comm->size > 1) finish_sends(o.comm->mpi);
  std::vector<MPI_Request> reqs;
  std::vector<std::pair<const Op*, std::vector<char>>> received;  // reserved: MPI writes into them
  received.reserve(ops.size());
  std::vector<const Op*> self_sends, self_recvs;
  ncclResult_t rc = ncclSuccess;
  for (const Op& o : ops) {
    Comm* c = o.comm;
    const size_t bytes = o.count * type_bytes(o.type);
    if (o.kind == Op::send || o.kind == Op::recv) {
      if (o.peer < 0 || o.peer >= c->size) return refuse(c, "peer rank " + std::to_string(o.peer));
      if (c->size == 1 || o.peer == c->rank) {
        (o.kind == Op::send ? self_sends : self_recvs).push_back(&o);
        continue;
      }
      if (o.kind == Op::send) {
        InFlight& f = g_in_flight.emplace_back();
        f.data.assign(static_cast<const char*>(o.sendbuf), static_cast<const char*>(o.sendbuf) + bytes);
        f.comm = c->mpi;
        MPI_Isend(f.data.data(), int(bytes), MPI_BYTE, o.peer, 0, c->mpi, &f.request);
      } else {
        reqs.emplace_back();
        auto& [op, data] = received.emplace_back(&o, std::vector<char>(bytes));
        MPI_Irecv(data.data(), int(bytes), MPI_BYTE, o.peer, 0, c->mpi, &reqs.back());
      }
    } else if (rc == ncclSuccess) {
      rc = run_collective(o);
    }
  }
  // Sends to itself match its receives in order.
  if (self_sends.size() != self_recvs.size()) rc = refuse(nullptr, "sends to itself and receives from itself differ");
  for (size_t i = 0; i < self_sends.size() && i < self_recvs.size(); ++i) {
    const auto* from = static_cast<const char*>(self_sends[i]->sendbuf);
    const size_t bytes = std::min(self_sends[i]->count * type_bytes(self_sends[i]->type),
                                  self_recvs[i]->count * type_bytes(self_recvs[i]->type));
    deliver(self_recvs[i]->stream, self_recvs[i]->recvbuf, std::vector<char>(from, from + bytes));
  }
  if (!reqs.empty()) MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  for (auto& [op, data] : received) deliver(op->stream, op->recvbuf, std::move(data));
  if (!g_in_flight.empty()) progress_sends();
  if (tracing()) std::fprintf(stderr, "[simt nccl] ... done (%zu ops)\n", ops.size());
  return rc;
}

ncclResult_t submit(const Op& o) {
  if (tracing()) {
    int me = 0;
    if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &me);
    std::fprintf(stderr, "[simt nccl] world %d comm %p (rank %d of %d): op %d count %zu peer %d%s\n", me,
                 static_cast<void*>(o.comm), o.comm->rank, o.comm->size, int(o.kind), o.count, o.peer,
                 g_group_depth > 0 ? " (grouped)" : "");
  }
  if (!type_bytes(o.type)) return refuse(o.comm, "data type " + std::to_string(int(o.type)));
  g_queue.push_back(o);
  return g_group_depth > 0 ? ncclSuccess : run_group();
}

int g_created = 0;  // communicators this rank created the id of

}  // namespace
}  // namespace lattice::simt

using lattice::simt::Comm;
using lattice::simt::Op;

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidUsage: return "invalid usage (SIMT emulation)";
    case ncclInvalidArgument: return "invalid argument (SIMT emulation)";
    default: return "error (SIMT emulation)";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return comm ? reinterpret_cast<Comm*>(comm)->last_error.c_str() : lattice::simt::g_last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  lattice::simt::IdContents c{};
  std::memcpy(c.magic, lattice::simt::kMagic, sizeof c.magic);
  c.creator = 0;
  if (lattice::simt::mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &c.creator);
  c.counter = lattice::simt::g_created++;
  std::memcpy(id->internal, &c, sizeof c);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  using namespace lattice::simt;
  *comm = nullptr;
  IdContents c;
  std::memcpy(&c, id.internal, sizeof c);
  if (std::memcmp(c.magic, kMagic, sizeof kMagic) != 0) return refuse(nullptr, "not an id of ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return refuse(nullptr, "rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  auto* k = new Comm;
  k->rank = rank;
  k->size = nranks;
  if (nranks > 1) {
    if (!mpi_running()) {
      delete k;
      return refuse(nullptr, "a communicator of several ranks needs MPI");
    }
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const int tag = kTagInit + c.counter % 256;
    std::vector<int> members(static_cast<size_t>(nranks), -1);  // world rank of each group rank
    if (rank == 0) {
      members[0] = me;
      for (int i = 1; i < nranks; ++i) {
        int msg[2];
        MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        members[size_t(msg[0])] = msg[1];
      }
      for (int i = 1; i < nranks; ++i)
        MPI_Send(members.data(), nranks, MPI_INT, members[size_t(i)], tag, MPI_COMM_WORLD);
    } else {
      const int msg[2] = {rank, me};
      MPI_Send(msg, 2, MPI_INT, c.creator, tag, MPI_COMM_WORLD);
      MPI_Recv(members.data(), nranks, MPI_INT, c.creator, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Group world, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, nranks, members.data(), &group);
    MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &k->mpi);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
  }
  *comm = reinterpret_cast<ncclComm_t>(k);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto* k = reinterpret_cast<Comm*>(comm);
  if (k && k->mpi != MPI_COMM_NULL && lattice::simt::mpi_running()) {
    lattice::simt::finish_sends(k->mpi);
    MPI_Comm_free(&k->mpi);
  }
  delete k;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete reinterpret_cast<Comm*>(comm);  // its MPI communicator is left to MPI_Abort / exit
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* async) {
  *async = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++lattice::simt::g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (lattice::simt::g_group_depth == 0) return lattice::simt::refuse(nullptr, "ncclGroupEnd without ncclGroupStart");
  return --lattice::simt::g_group_depth == 0 ? lattice::simt::run_group() : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t c, cudaStream_t stream) {
  return lattice::simt::submit({Op::all_reduce, send, recv, count, t, op, 0, reinterpret_cast<Comm*>(c),
                                 stream});
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t c, cudaStream_t stream) {
  return lattice::simt::submit({Op::reduce, send, recv, count, t, op, root, reinterpret_cast<Comm*>(c),
                                 stream});
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t stream) {
  return lattice::simt::submit({Op::reduce_scatter, send, recv, count, t, op, 0, reinterpret_cast<Comm*>(c),
                                 stream});
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t stream) {
  return lattice::simt::submit({Op::all_gather, send, recv, count, t, ncclSum, 0, reinterpret_cast<Comm*>(c),
                                 stream});
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t stream) {
  return lattice::simt::submit({Op::broadcast, send, recv, count, t, ncclSum, root, reinterpret_cast<Comm*>(c),
                                 stream});
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream) {
  return lattice::simt::submit({Op::send, send, nullptr, count, t, ncclSum, peer, reinterpret_cast<Comm*>(c),
                                 stream});
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream) {
  return lattice::simt::submit({Op::recv, nullptr, recv, count, t, ncclSum, peer, reinterpret_cast<Comm*>(c),
                                 stream});
}

}  // extern "C"
