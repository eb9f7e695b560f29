// NCCL implementation of Comm (dist/nccl_comm.h). Compiled by g++ into lattice_lib;
// the body needs the CUDA backend.
#include "dist/nccl_comm.h"

#include "core/error.h"

#if LATTICE_WITH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <deque>
#include <map>
#include <utility>
#include <sstream>
#include <thread>

#include "core/cuda_runtime.h"
#include "core/timer.h"
#include "dist/mpi_comm.h"
#endif

namespace lattice {

#if LATTICE_WITH_CUDA

namespace {

double g_nccl_timeout_seconds = 600.0;
bool g_force_grouped = false;  // tests: the per-rank grouped form even for equal counts

#define LATTICE_NCCL_CUDART(call)                                                                 \
  do {                                                                                            \
    const cudaError_t err_ = (call);                                                              \
    LATTICE_CHECK(err_ == cudaSuccess) << #call << ": " << cudaGetErrorString(err_);              \
  } while (0)

cudaStream_t compute() { return static_cast<cudaStream_t>(cuda::compute_stream()); }

// A completion event, made when the operation is enqueued (or, for a send to itself,
// when the matching receive is).
struct Slot {
  cudaEvent_t event = nullptr;
  ~Slot() {
    if (event) (void)cudaEventDestroy(event);
  }
};

struct PendingSelfSend {
  const float* data;
  int64_t n;
  std::shared_ptr<Slot> slot;
};

class NcclComm;

// A stream for communication, at the highest priority so that it is not starved by compute.
cudaStream_t communication_stream() {
  int least = 0, greatest = 0;
  LATTICE_NCCL_CUDART(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  LATTICE_NCCL_CUDART(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  return s;
}

// A one-way point-to-point channel between two ranks of a group: a NCCL communicator of
// the two (the sender is its rank 0, the receiver rank 1) with a stream of its own. NCCL
// runs a communicator's operations in order and a send blocks until the peer's receive
// runs: on one communicator per group, a pipeline stage's send of activations to the next
// stage would hold back its own receive of that stage's gradients, queued behind it, while
// the next stage, sending those gradients, waits for it in turn (1F1B deadlocks so). On a
// channel per direction a send waits only for its own receive, as an MPI send does.
struct Channel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

class NcclRequest : public CommRequest {
 public:
  NcclRequest(NcclComm* comm, std::shared_ptr<Slot> slot, CommOp op, std::string label)
      : comm_(comm), slot_(std::move(slot)), op_(op), label_(std::move(label)) {}
  ~NcclRequest() override {
    // Keep the compute stream ordered after the operation, without blocking the host.
    if (!done_ && slot_->event) (void)cudaStreamWaitEvent(compute(), slot_->event, 0);
  }
  bool test() override;
  void wait() override;

 private:
  NcclComm* comm_;
  std::shared_ptr<Slot> slot_;
  CommOp op_;
  std::string label_;
  bool done_ = false;
};

class NcclComm : public Comm {
 public:
  NcclComm(const std::string& name, ncclComm_t comm, int rank, int size, std::vector<int> world_ranks)
      : Comm(name), comm_(comm), rank_(rank), size_(size), ranks_(std::move(world_ranks)) {
    stream_ = communication_stream();
    LATTICE_NCCL_CUDART(cudaMalloc(&scratch_, sizeof(float)));
    LATTICE_NCCL_CUDART(cudaMemsetAsync(scratch_, 0, sizeof(float), stream_));
  }
  ~NcclComm() override {
    for (auto* m : {&to_, &from_})
      for (auto& [peer, ch] : *m) {
        if (!aborted_) {
          (void)cudaStreamSynchronize(ch.stream);
          (void)ncclCommDestroy(ch.comm);
        }
        (void)cudaStreamDestroy(ch.stream);
      }
    if (!aborted_) {
      (void)cudaStreamSynchronize(stream_);
      (void)ncclCommDestroy(comm_);
    }
    (void)cudaFree(scratch_);
    if (staging_) (void)cudaFreeAsync(staging_, compute());
    (void)cudaStreamDestroy(stream_);
  }

  // The channel for sends to `peer` (outgoing) or receives from it.
  void add_channel(int peer, bool outgoing, ncclComm_t comm) {
    Channel ch;
    ch.comm = comm;
    ch.stream = communication_stream();
    (outgoing ? to_ : from_)[peer] = ch;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }

  // The blocking operations also take host buffers (a loss, a norm, amaxes, a found-inf
  // flag, a checkpoint piece): staged through device memory, so the callers above the
  // kernels need not know which Comm they hold.
  void all_reduce(float* data, int64_t n, ReduceOp op) override {
    stats_.add(CommOp::all_reduce, uint64_t(n) * 4);
    Staged st(this, data, size_t(n) * 4);
    issue_all_reduce(st.ptr(), n, ncclFloat, op)->wait();
  }
  void all_reduce(double* data, int64_t n, ReduceOp op) override {
    stats_.add(CommOp::all_reduce, uint64_t(n) * 8);
    Staged st(this, data, size_t(n) * 8);
    issue_all_reduce(st.ptr(), n, ncclDouble, op)->wait();
  }
  std::unique_ptr<CommRequest> iall_reduce(float* data, int64_t n) override {
    require_device(data, "iall_reduce");
    stats_.add(CommOp::all_reduce, uint64_t(n) * 4);
    return issue_all_reduce(data, n, ncclFloat, ReduceOp::sum);
  }
  std::unique_ptr<CommRequest> iall_reduce_bf16(uint16_t* data, int64_t n) override {
    require_device(data, "iall_reduce_bf16");
    stats_.add(CommOp::all_reduce, uint64_t(n) * 2);
    return issue(CommOp::all_reduce, [&] {
      if (n > 0) check(ncclAllReduce(data, data, size_t(n), ncclBfloat16, ncclSum, comm_, stream_), "ncclAllReduce");
    });
  }
  std::unique_ptr<CommRequest> ireduce_scatter_bf16(const uint16_t* send, uint16_t* recv,
                                                    const std::vector<int64_t>& counts) override {
    require_device(send, "ireduce_scatter_bf16");
    const int64_t total = check_counts(counts, "reduce_scatter");
    stats_.add(CommOp::reduce_scatter, uint64_t(total) * 2);
    return issue(CommOp::reduce_scatter, [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      int64_t displ = 0;
      for (int r = 0; r < size_; ++r) {
        if (counts[size_t(r)] > 0)
          check(ncclReduce(send + displ, recv, size_t(counts[size_t(r)]), ncclBfloat16, ncclSum, r, comm_, stream_),
                "ncclReduce");
        displ += counts[size_t(r)];
      }
      check(ncclGroupEnd(), "ncclGroupEnd (reduce_scatter bf16)");
    });
  }

  std::unique_ptr<CommRequest> ireduce_scatter(const float* send, float* recv,
                                               const std::vector<int64_t>& counts) override {
    require_device(send, "ireduce_scatter");
    const int64_t total = check_counts(counts, "reduce_scatter");
    stats_.add(CommOp::reduce_scatter, uint64_t(total) * 4);
    return issue(CommOp::reduce_scatter, [&] {
      if (all_equal(counts) && !g_force_grouped) {
        if (counts[0] > 0)
          check(ncclReduceScatter(send, recv, size_t(counts[0]), ncclFloat, ncclSum, comm_, stream_),
                "ncclReduceScatter");
        return;
      }
      check(ncclGroupStart(), "ncclGroupStart");
      int64_t displ = 0;
      for (int r = 0; r < size_; ++r) {
        // recv is only written on the root (r == rank); the others pass it unused.
        if (counts[size_t(r)] > 0)
          check(ncclReduce(send + displ, recv, size_t(counts[size_t(r)]), ncclFloat, ncclSum, r, comm_, stream_),
                "ncclReduce");
        displ += counts[size_t(r)];
      }
      check(ncclGroupEnd(), "ncclGroupEnd (reduce_scatter)");
    });
  }

  std::unique_ptr<CommRequest> iall_gather(float* data, const std::vector<int64_t>& counts) override {
    require_device(data, "iall_gather");
    const int64_t total = check_counts(counts, "all_gather");
    stats_.add(CommOp::all_gather, uint64_t(total) * 4);
    return issue(CommOp::all_gather, [&] {
      if (all_equal(counts) && !g_force_grouped) {
        const size_t c = size_t(counts[0]);
        // In place: this rank's piece already sits at data + rank * c.
        if (c > 0) check(ncclAllGather(data + size_t(rank_) * c, data, c, ncclFloat, comm_, stream_), "ncclAllGather");
        return;
      }
      check(ncclGroupStart(), "ncclGroupStart");
      int64_t displ = 0;
      for (int r = 0; r < size_; ++r) {
        if (counts[size_t(r)] > 0)
          check(ncclBroadcast(data + displ, data + displ, size_t(counts[size_t(r)]), ncclFloat, r, comm_, stream_),
                "ncclBroadcast");
        displ += counts[size_t(r)];
      }
      check(ncclGroupEnd(), "ncclGroupEnd (all_gather)");
    });
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    LATTICE_CHECK(root >= 0 && root < size_) << "broadcast from rank " << root << " in the " << size_
                                             << "-rank group " << name_;
    stats_.add(CommOp::broadcast, uint64_t(bytes));
    Staged st(this, data, size_t(bytes));
    issue(CommOp::broadcast, [&] {
      if (bytes > 0) check(ncclBroadcast(st.ptr(), st.ptr(), size_t(bytes), ncclUint8, root, comm_, stream_), "ncclBroadcast");
    })->wait();
  }

  void send(const float* data, int64_t n, int dst, int tag) override {
    LATTICE_CHECK(dst != rank_) << "send to itself (rank " << rank_ << ") in the " << name_
                                << " group: a blocking send to itself cannot complete (use isend, then irecv)";
    isend(data, n, dst, tag)->wait();
  }
  void recv(float* data, int64_t n, int src, int tag) override { irecv(data, n, src, tag)->wait(); }

  std::unique_ptr<CommRequest> isend(const float* data, int64_t n, int dst, int tag) override {
    require_device(data, "isend");
    check_peer(dst, tag, "isend to");
    stats_.add(CommOp::send, uint64_t(n) * 4);
    if (dst == rank_) {  // held until the matching irecv from itself
      auto slot = std::make_shared<Slot>();
      self_sends_.push_back({data, n, slot});
      return std::make_unique<NcclRequest>(this, std::move(slot), CommOp::send, label());
    }
    auto ch = to_.find(dst);
    if (ch != to_.end())
      return issue(CommOp::send, [&] {
        if (n > 0) check(ncclSend(data, size_t(n), ncclFloat, 1, ch->second.comm, ch->second.stream), "ncclSend");
      }, ch->second.stream);
    return issue(CommOp::send, [&] {  // no channel: on the group's communicator (see nccl_comm.h)
      if (n > 0) check(ncclSend(data, size_t(n), ncclFloat, dst, comm_, stream_), "ncclSend");
    });
  }

  std::unique_ptr<CommRequest> irecv(float* data, int64_t n, int src, int tag) override {
    require_device(data, "irecv");
    check_peer(src, tag, "irecv from");
    if (src == rank_) {
      LATTICE_CHECK(!self_sends_.empty()) << "irecv from itself (rank " << rank_ << ") in the "
                                          << group_text(label()) << " with no isend to itself posted before it";
      LATTICE_CHECK(self_sends_.front().n == n) << "irecv of " << n << " floats from itself in the "
                                                << group_text(label()) << " matches an isend of "
                                                << self_sends_.front().n << " floats";
      PendingSelfSend s = self_sends_.front();
      self_sends_.pop_front();
      stats_.add(CommOp::recv, uint64_t(n) * 4);
      auto req = issue(CommOp::recv, [&] {
        if (n == 0) return;
        check(ncclGroupStart(), "ncclGroupStart");
        check(ncclSend(s.data, size_t(n), ncclFloat, rank_, comm_, stream_), "ncclSend");
        check(ncclRecv(data, size_t(n), ncclFloat, rank_, comm_, stream_), "ncclRecv");
        check(ncclGroupEnd(), "ncclGroupEnd (send/recv to itself)");
      });
      // The held send completes with this group.
      LATTICE_NCCL_CUDART(cudaEventCreateWithFlags(&s.slot->event, cudaEventDisableTiming));
      LATTICE_NCCL_CUDART(cudaEventRecord(s.slot->event, stream_));
      return req;
    }
    stats_.add(CommOp::recv, uint64_t(n) * 4);
    auto ch = from_.find(src);
    if (ch != from_.end())
      return issue(CommOp::recv, [&] {
        if (n > 0) check(ncclRecv(data, size_t(n), ncclFloat, 0, ch->second.comm, ch->second.stream), "ncclRecv");
      }, ch->second.stream);
    return issue(CommOp::recv, [&] {
      if (n > 0) check(ncclRecv(data, size_t(n), ncclFloat, src, comm_, stream_), "ncclRecv");
    });
  }

  void all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                  const std::vector<int64_t>& recv_counts) override {
    require_device(send, "all_to_all");
    const int64_t sent = check_counts(send_counts, "all_to_all");
    check_counts(recv_counts, "all_to_all");
    stats_.add(CommOp::all_to_all, uint64_t(sent - send_counts[size_t(rank_)]) * 4);
    issue(CommOp::all_to_all, [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      int64_t sd = 0, rd = 0;
      for (int r = 0; r < size_; ++r) {
        if (send_counts[size_t(r)] > 0)
          check(ncclSend(send + sd, size_t(send_counts[size_t(r)]), ncclFloat, r, comm_, stream_), "ncclSend");
        if (recv_counts[size_t(r)] > 0)
          check(ncclRecv(recv + rd, size_t(recv_counts[size_t(r)]), ncclFloat, r, comm_, stream_), "ncclRecv");
        sd += send_counts[size_t(r)];
        rd += recv_counts[size_t(r)];
      }
      check(ncclGroupEnd(), "ncclGroupEnd (all_to_all)");
    })->wait();
  }

  void barrier() override {
    stats_.add(CommOp::barrier, 0);
    issue(CommOp::barrier, [&] {
      check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
    })->wait();
  }

  // ---- used by NcclRequest ----

  // Throws (or aborts the job) when NCCL reported an asynchronous error on the group's
  // communicator or on one of its point-to-point channels.
  void check_async(CommOp op, const std::string& label) {
    check_async_on(comm_, op, label);
    for (auto* m : {&to_, &from_})
      for (auto& [peer, ch] : *m) check_async_on(ch.comm, op, label);
  }
  void check_async_on(ncclComm_t comm, CommOp op, const std::string& label) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &async);
    if (rc == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) return;
    const ncclResult_t bad = rc != ncclSuccess ? rc : async;
    std::ostringstream os;
    os << "rank " << world_rank() << ": NCCL error in " << comm_op_name(op) << " on the " << group_text(label)
       << ": " << ncclGetErrorString(bad) << " (" << ncclGetLastError(comm) << ")";
    fail_and_abort(os.str());
  }

  [[noreturn]] void timed_out(CommOp op, const std::string& label, double seconds) {
    std::ostringstream os;
    os << "rank " << world_rank() << ": timed out after " << seconds << " s waiting in " << comm_op_name(op)
       << " on the " << group_text(label)
       << " (--distributed-timeout-minutes); a peer rank died or stopped answering";
    fail_and_abort(os.str());
  }

  void add_seconds(CommOp op, double s) { stats_.seconds[int(op)] += s; }

 private:
  static bool on_device(const void* p) {
    if (!p) return true;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  void require_device(const void* p, const char* op) const {
    LATTICE_CHECK(on_device(p)) << "NCCL " << op << " on the " << name_
                                << " group got a host buffer (the non-blocking operations take device memory)";
  }
  // A host buffer's bytes in device scratch for one blocking operation, copied back after.
  class Staged {
   public:
    Staged(NcclComm* c, void* data, size_t bytes) : host_(on_device(data) ? nullptr : data), bytes_(bytes), ptr_(data) {
      if (!host_ || !bytes) return;
      if (c->staging_bytes_ < bytes) {
        // Stream-ordered (the previous use is complete): cudaFree would synchronise the whole
        // device, waiting on other communicators' kernels, which can wait on peers that wait
        // on this rank (NCCL's documented cudaFree hang).
        if (c->staging_) LATTICE_NCCL_CUDART(cudaFreeAsync(c->staging_, compute()));
        c->staging_ = nullptr;
        c->staging_bytes_ = 0;
        LATTICE_NCCL_CUDART(cudaMallocAsync(&c->staging_, bytes, compute()));
        c->staging_bytes_ = bytes;
      }
      ptr_ = c->staging_;
      LATTICE_NCCL_CUDART(cudaMemcpyAsync(ptr_, host_, bytes, cudaMemcpyHostToDevice, compute()));
    }
    ~Staged() noexcept(false) {
      if (!host_ || !bytes_) return;
      LATTICE_NCCL_CUDART(cudaMemcpyAsync(host_, ptr_, bytes_, cudaMemcpyDeviceToHost, compute()));
      LATTICE_NCCL_CUDART(cudaStreamSynchronize(compute()));
    }
    void* ptr() const { return ptr_; }

   private:
    void* host_;
    size_t bytes_;
    void* ptr_;
  };

  int world_rank() const { return ranks_.empty() ? rank_ : ranks_[size_t(rank_)]; }
  static std::string group_text(const std::string& label) {
    return label.find(" group (") == std::string::npos ? label + " group" : label;
  }

  // The communicator cannot be used after a timeout or an asynchronous error: abort it
  // (this frees the GPU kernels waiting on dead peers), then end the job (under mpirun)
  // or throw (one process).
  [[noreturn]] void fail_and_abort(const std::string& message) {
    if (!aborted_) {
      aborted_ = true;
      (void)ncclCommAbort(comm_);
      for (auto* m : {&to_, &from_})
        for (auto& [peer, ch] : *m) (void)ncclCommAbort(ch.comm);
    }
    if (launched_by_mpirun()) abort_job(message);
    LATTICE_FAIL() << message;
  }

  void check(ncclResult_t rc, const char* what) {
    if (rc == ncclSuccess) return;
    LATTICE_FAIL() << "NCCL " << what << " on the " << group_text(label()) << ": " << ncclGetErrorString(rc) << " ("
                   << ncclGetLastError(comm_) << ")";
  }

  int64_t check_counts(const std::vector<int64_t>& counts, const char* op) const {
    LATTICE_CHECK(int(counts.size()) == size_) << op << " on the " << name_ << " group needs one count per rank ("
                                               << size_ << "), got " << counts.size();
    int64_t total = 0;
    for (int64_t c : counts) {
      LATTICE_CHECK(c >= 0) << op << " on the " << name_ << " group: negative count " << c;
      total += c;
    }
    return total;
  }

  void check_peer(int peer, int tag, const char* what) const {
    LATTICE_CHECK(peer >= 0 && peer < size_ && tag >= 0)
        << what << " rank " << peer << " (tag " << tag << ") in the " << size_ << "-rank group " << name_;
  }

  static bool all_equal(const std::vector<int64_t>& c) {
    for (int64_t x : c)
      if (x != c[0]) return false;
    return true;
  }

  // Orders the communication stream after the compute stream's queued work, enqueues
  // the NCCL calls, records the completion event.
  template <typename F>
  std::unique_ptr<CommRequest> issue(CommOp op, F&& enqueue, cudaStream_t on = nullptr) {
    if (!on) on = stream_;
    LATTICE_CHECK(!aborted_) << "the " << name_ << " NCCL communicator was aborted after an earlier error";
    cudaEvent_t ready = nullptr;
    LATTICE_NCCL_CUDART(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    const cudaError_t rec = cudaEventRecord(ready, compute());
    const cudaError_t wt = rec == cudaSuccess ? cudaStreamWaitEvent(on, ready, 0) : rec;
    (void)cudaEventDestroy(ready);  // released once the wait is done
    LATTICE_NCCL_CUDART(wt);
    enqueue();
    auto slot = std::make_shared<Slot>();
    LATTICE_NCCL_CUDART(cudaEventCreateWithFlags(&slot->event, cudaEventDisableTiming));
    LATTICE_NCCL_CUDART(cudaEventRecord(slot->event, on));
    return std::make_unique<NcclRequest>(this, std::move(slot), op, label());
  }

  std::unique_ptr<CommRequest> issue_all_reduce(void* data, int64_t n, ncclDataType_t type, ReduceOp op) {
    return issue(CommOp::all_reduce, [&] {
      if (n > 0)
        check(ncclAllReduce(data, data, size_t(n), type, op == ReduceOp::sum ? ncclSum : ncclMax, comm_, stream_),
              "ncclAllReduce");
    });
  }

  ncclComm_t comm_;
  int rank_, size_;
  std::vector<int> ranks_;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;  // the barrier's one element
  void* staging_ = nullptr;   // host buffers of blocking operations
  size_t staging_bytes_ = 0;
  bool aborted_ = false;
  std::deque<PendingSelfSend> self_sends_;
  std::map<int, Channel> to_, from_;  // point-to-point channels by peer (group rank)
};

bool NcclRequest::test() {
  if (done_) return true;
  if (!slot_->event) return false;  // a send to itself whose receive is not posted yet
  const cudaError_t q = cudaEventQuery(slot_->event);
  if (q == cudaErrorNotReady) {
    comm_->check_async(op_, label_);
    return false;
  }
  LATTICE_NCCL_CUDART(q);
  done_ = true;
  return true;
}

void NcclRequest::wait() {
  if (done_) return;
  LATTICE_CHECK(slot_->event) << "wait on an isend to itself in the " << label_
                              << " before the matching irecv was posted: it could never complete";
  LATTICE_NCCL_CUDART(cudaStreamWaitEvent(compute(), slot_->event, 0));
  Timer t;
  while (true) {
    const cudaError_t q = cudaEventQuery(slot_->event);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) LATTICE_NCCL_CUDART(q);
    comm_->check_async(op_, label_);
    if (t.seconds() > g_nccl_timeout_seconds) comm_->timed_out(op_, label_, t.seconds());
    std::this_thread::yield();
  }
  comm_->add_seconds(op_, t.seconds());
  done_ = true;
}

}  // namespace

namespace {

ncclComm_t init_comm(const std::string& name, int size, const ncclUniqueId& id, int rank) {
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRank(&comm, size, id, rank);
  LATTICE_CHECK(rc == ncclSuccess) << "NCCL communicator " << name << " (rank " << rank << " of " << size
                                   << "): ncclCommInitRank: " << ncclGetErrorString(rc);
  return comm;
}

ncclUniqueId new_id(const std::string& name) {
  ncclUniqueId id{};
  const ncclResult_t rc = ncclGetUniqueId(&id);
  LATTICE_CHECK(rc == ncclSuccess) << "NCCL communicator " << name << ": ncclGetUniqueId: " << ncclGetErrorString(rc);
  return id;
}

// The channels of a group's ring neighbours (a -> a+1 and a -> a-1, modulo the size): every
// member walks the same list of ordered pairs and joins those it is in, so each pair's
// two ranks create it together, and the lowest pair not yet created always has both its
// ranks at it (no cycle of waits). The sender makes the id and sends it to the receiver
// through the group's host communicator.
void add_neighbour_channels(Comm& group, NcclComm& comm, const std::string& name) {
  const int P = group.size(), me = group.rank();
  std::vector<std::pair<int, int>> pairs;
  for (int a = 0; a < P; ++a)
    for (int b : {(a + 1) % P, (a + P - 1) % P})
      if (a != b && std::find(pairs.begin(), pairs.end(), std::make_pair(a, b)) == pairs.end()) pairs.push_back({a, b});
  std::sort(pairs.begin(), pairs.end(), [](const std::pair<int, int>& x, const std::pair<int, int>& y) {
    return std::make_tuple(std::min(x.first, x.second), std::max(x.first, x.second), x.first) <
           std::make_tuple(std::min(y.first, y.second), std::max(y.first, y.second), y.first);
  });
  constexpr int kFloats = int((sizeof(ncclUniqueId) + sizeof(float) - 1) / sizeof(float));
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto [a, b] = pairs[i];
    if (me != a && me != b) continue;
    const std::string what = name + " channel " + std::to_string(a) + "->" + std::to_string(b);
    float buf[kFloats] = {};
    ncclUniqueId id{};
    if (me == a) {
      id = new_id(what);
      std::memcpy(buf, &id, sizeof id);
      group.send(buf, kFloats, b, int(i));
    } else {
      group.recv(buf, kFloats, a, int(i));
      std::memcpy(&id, buf, sizeof id);
    }
    comm.add_channel(me == a ? b : a, me == a, init_comm(what, 2, id, me == a ? 0 : 1));
  }
}

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm& group, const std::string& name, bool point_to_point) {
  (void)cuda::compute_stream();  // selects the device (fails with the reason when there is none)
  ncclUniqueId id{};
  if (group.rank() == 0) id = new_id(name);
  group.broadcast(&id, int64_t(sizeof(id)), 0);
  ncclComm_t comm = init_comm(name, group.size(), id, group.rank());
  auto nccl = std::make_unique<NcclComm>(name, comm, group.rank(), group.size(), group.world_ranks());
  if (point_to_point && group.size() > 1) add_neighbour_channels(group, *nccl, name);
  return nccl;
}

void set_nccl_timeout_seconds(double seconds) { g_nccl_timeout_seconds = seconds; }
void nccl_force_grouped_collectives(bool force) { g_force_grouped = force; }

#else  // built without the CUDA backend

std::unique_ptr<Comm> make_nccl_comm(Comm&, const std::string& name, bool) {
  LATTICE_FAIL() << "NCCL communicator " << name << ": lattice was built without the CUDA backend";
}

void set_nccl_timeout_seconds(double) {}
void nccl_force_grouped_collectives(bool) {}

#endif

}  // namespace lattice
