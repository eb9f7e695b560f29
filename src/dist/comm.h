// Comm: the one interface every collective and point-to-point transfer goes through
// (MPI today for CPU tensors, NCCL later for CUDA tensors). Each communicator counts
// the bytes, calls and seconds of every operation kind, so tests and --log-comm can
// check the communication volume of a step.
//
// Byte convention: all_reduce and broadcast count the buffer, reduce_scatter its full
// input (size x count), all_gather its full output, send/recv the message, all_to_all what
// this rank sends to the others.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lattice {

enum class CommOp : int { all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier, all_to_all };
constexpr int kNumCommOps = 8;
const char* comm_op_name(CommOp op);

enum class ReduceOp { sum, max };

struct CommStats {
  std::array<uint64_t, kNumCommOps> bytes{}, calls{};
  std::array<double, kNumCommOps> seconds{};  // time spent inside blocking calls and waits
  void add(CommOp op, uint64_t b) {
    bytes[int(op)] += b;
    calls[int(op)] += 1;
  }
  uint64_t total_bytes() const;
  void reset() { *this = CommStats{}; }
};

// A non-blocking operation in flight.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual bool test() = 0;  // true when complete (drives progress)
  virtual void wait() = 0;  // blocks, with the communicator's timeout
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // World ranks of the members, in group-rank order.
  virtual const std::vector<int>& world_ranks() const = 0;
  const std::string& name() const { return name_; }

  virtual void all_reduce(float* data, int64_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* data, int64_t n, ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest> iall_reduce(float* data, int64_t n) = 0;  // sum
  // recv[counts[rank]] = sum over ranks of send[displ_r .. displ_r + counts[r]) for r = rank;
  // send holds sum(counts) elements. Counts may differ by rank.
  virtual std::unique_ptr<CommRequest> ireduce_scatter(const float* send, float* recv,
                                                       const std::vector<int64_t>& counts) = 0;
  // data holds sum(counts) elements; each rank's piece (at its displacement) is sent to all.
  virtual std::unique_ptr<CommRequest> iall_gather(float* data, const std::vector<int64_t>& counts) = 0;
  // bf16 forms of the two gradient reductions (--grad-reduce-in-bf16): elements are bf16
  // bit patterns (kernels/cast.h); each pairwise sum is computed in fp32 and rounded to
  // bf16, in the same order on every rank, so all ranks get the same bits. Half the bytes
  // of the fp32 forms. A communicator without them fails, naming itself.
  virtual std::unique_ptr<CommRequest> iall_reduce_bf16(uint16_t* data, int64_t n);
  virtual std::unique_ptr<CommRequest> ireduce_scatter_bf16(const uint16_t* send, uint16_t* recv,
                                                            const std::vector<int64_t>& counts);
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void send(const float* data, int64_t n, int dst, int tag) = 0;
  virtual void recv(float* data, int64_t n, int src, int tag) = 0;
  virtual std::unique_ptr<CommRequest> isend(const float* data, int64_t n, int dst, int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(float* data, int64_t n, int src, int tag) = 0;
  virtual void barrier() = 0;
  // All-to-all with per-peer counts (MPI_Alltoallv; the mixture of experts' token dispatch):
  // send holds sum(send_counts) elements, send_counts[r] of them (in rank order) for rank r;
  // recv gets sum(recv_counts), recv_counts[r] of them from rank r, in rank order. Each rank's
  // recv_counts[r] must equal rank r's send_counts[rank]. Blocking. A communicator
  // without it fails, naming itself.
  virtual void all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                          const std::vector<int64_t>& recv_counts);

  // Blocking forms of the non-blocking collectives.
  void reduce_scatter(const float* send, float* recv, const std::vector<int64_t>& counts) {
    ireduce_scatter(send, recv, counts)->wait();
  }
  void all_gather(float* data, const std::vector<int64_t>& counts) { iall_gather(data, counts)->wait(); }

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

  // What the caller is doing, for the timeout message of the operations it starts next
  // (e.g. "stage 1, micro-batch 3: forward activations from stage 0"); empty: nothing.
  void set_wait_context(std::string context) { context_ = std::move(context); }
  const std::string& wait_context() const { return context_; }

 protected:
  explicit Comm(std::string name) : name_(std::move(name)) {}
  // The group's name with the wait context, for messages.
  std::string label() const { return context_.empty() ? name_ : name_ + " group (" + context_ + ")"; }
  std::string name_;
  std::string context_;
  CommStats stats_;
};

// Splits n elements into `parts` contiguous pieces whose sizes differ by at most one
// (the first n % parts pieces are one larger).
std::vector<int64_t> even_split(int64_t n, int parts);

// A communicator of one process: collectives are identities.
std::unique_ptr<Comm> make_local_comm(const std::string& name, int world_rank = 0);

}  // namespace lattice
