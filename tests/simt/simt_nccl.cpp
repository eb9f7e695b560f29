// The SIMT emulation's NCCL: communicators of one rank (each collective a copy within the
// rank's memory, a send to itself a copy at the group's end). Linked instead of libnccl
// into the emulation's tests. A communicator of several ranks is refused with
// ncclInvalidUsage and a reason: the emulation runs one process.
#include <nccl.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace lattice::simt {
namespace {

struct Comm {
  std::string last_error;
};

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

// Pending sends to itself within ncclGroupStart/End, matched in order with the receives.
struct Pending {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;
};
int g_group_depth = 0;
std::vector<Pending> g_sends, g_recvs;
std::string g_last_error;

ncclResult_t refuse(Comm* c, const std::string& why) {
  g_last_error = why;
  if (c) c->last_error = why;
  return ncclInvalidUsage;
}

ncclResult_t copy(const void* send, void* recv, size_t count, ncclDataType_t t, Comm* c) {
  const size_t b = type_bytes(t);
  if (!b) return refuse(c, "data type " + std::to_string(int(t)));
  if (send != recv && count) std::memmove(recv, send, count * b);
  return ncclSuccess;
}

void match_pending() {
  for (size_t i = 0; i < g_sends.size() && i < g_recvs.size(); ++i)
    std::memmove(g_recvs[i].recv, g_sends[i].send, std::min(g_sends[i].bytes, g_recvs[i].bytes));
  g_sends.clear();
  g_recvs.clear();
}

}  // namespace
}  // namespace lattice::simt

using lattice::simt::Comm;

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
  std::memcpy(id->internal, "lattice-simt", 12);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  *comm = nullptr;
  if (nranks != 1 || rank != 0)
    return lattice::simt::refuse(nullptr, "a communicator of " + std::to_string(nranks) +
                                              " ranks: the SIMT emulation's NCCL has one rank");
  *comm = reinterpret_cast<ncclComm_t>(new Comm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete reinterpret_cast<Comm*>(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* async) {
  *async = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++lattice::simt::g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (--lattice::simt::g_group_depth == 0) lattice::simt::match_pending();
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t, ncclComm_t c,
                           cudaStream_t) {
  return lattice::simt::copy(send, recv, count, t, reinterpret_cast<Comm*>(c));
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t, int root,
                        ncclComm_t c, cudaStream_t) {
  if (root != 0) return lattice::simt::refuse(reinterpret_cast<Comm*>(c), "root " + std::to_string(root));
  return lattice::simt::copy(send, recv, count, t, reinterpret_cast<Comm*>(c));
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t,
                               ncclComm_t c, cudaStream_t) {
  return lattice::simt::copy(send, recv, count, t, reinterpret_cast<Comm*>(c));
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t) {
  return lattice::simt::copy(send, recv, count, t, reinterpret_cast<Comm*>(c));
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t) {
  if (root != 0) return lattice::simt::refuse(reinterpret_cast<Comm*>(c), "root " + std::to_string(root));
  return lattice::simt::copy(send, recv, count, t, reinterpret_cast<Comm*>(c));
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t) {
  Comm* comm = reinterpret_cast<Comm*>(c);
  if (peer != 0) return lattice::simt::refuse(comm, "send to rank " + std::to_string(peer));
  if (lattice::simt::g_group_depth == 0) return lattice::simt::refuse(comm, "a send to itself outside a group");
  lattice::simt::g_sends.push_back({send, nullptr, count * lattice::simt::type_bytes(t)});
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t) {
  Comm* comm = reinterpret_cast<Comm*>(c);
  if (peer != 0) return lattice::simt::refuse(comm, "receive from rank " + std::to_string(peer));
  if (lattice::simt::g_group_depth == 0) return lattice::simt::refuse(comm, "a receive from itself outside a group");
  lattice::simt::g_recvs.push_back({nullptr, recv, count * lattice::simt::type_bytes(t)});
  return ncclSuccess;
}

}  // extern "C"
