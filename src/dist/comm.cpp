#include "dist/comm.h"

#include "core/device.h"

#include <cstring>

#include "core/error.h"

namespace lattice {

const char* comm_op_name(CommOp op) {
  static const char* names[kNumCommOps] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                           "send",       "recv",           "barrier",    "all_to_all"};
  return names[int(op)];
}

uint64_t CommStats::total_bytes() const {
  uint64_t t = 0;
  for (uint64_t b : bytes) t += b;
  return t;
}

std::vector<int64_t> even_split(int64_t n, int parts) {
  std::vector<int64_t> counts(static_cast<size_t>(parts), n / parts);
  for (int64_t i = 0; i < n % parts; ++i) counts[size_t(i)] += 1;
  return counts;
}

namespace {

class DoneRequest : public CommRequest {
 public:
  bool test() override { return true; }
  void wait() override {}
};

class LocalComm : public Comm {
 public:
  LocalComm(const std::string& name, int world_rank) : Comm(name), ranks_{world_rank} {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  void all_reduce(float*, int64_t n, ReduceOp) override { stats_.add(CommOp::all_reduce, uint64_t(n) * 4); }
  void all_reduce(double*, int64_t n, ReduceOp) override { stats_.add(CommOp::all_reduce, uint64_t(n) * 8); }
  std::unique_ptr<CommRequest> iall_reduce(float*, int64_t n) override {
    stats_.add(CommOp::all_reduce, uint64_t(n) * 4);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> ireduce_scatter(const float* send, float* recv,
                                               const std::vector<int64_t>& counts) override {
    LATTICE_CHECK(counts.size() == 1) << "reduce_scatter counts for 1 rank";
    copy_on_device(recv, send, size_t(counts[0]) * sizeof(float));
    stats_.add(CommOp::reduce_scatter, uint64_t(counts[0]) * 4);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> iall_reduce_bf16(uint16_t*, int64_t n) override {
    stats_.add(CommOp::all_reduce, uint64_t(n) * 2);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> ireduce_scatter_bf16(const uint16_t* send, uint16_t* recv,
                                                    const std::vector<int64_t>& counts) override {
    LATTICE_CHECK(counts.size() == 1) << "reduce_scatter counts for 1 rank";
    copy_on_device(recv, send, size_t(counts[0]) * sizeof(uint16_t));
    stats_.add(CommOp::reduce_scatter, uint64_t(counts[0]) * 2);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> iall_gather(float*, const std::vector<int64_t>& counts) override {
    LATTICE_CHECK(counts.size() == 1) << "all_gather counts for 1 rank";
    stats_.add(CommOp::all_gather, uint64_t(counts[0]) * 4);
    return std::make_unique<DoneRequest>();
  }
  void broadcast(void*, int64_t bytes, int) override { stats_.add(CommOp::broadcast, uint64_t(bytes)); }
  void send(const float*, int64_t, int dst, int) override {
    LATTICE_FAIL() << "send to rank " << dst << " in a one-process group " << name_;
  }
  void recv(float*, int64_t, int src, int) override {
    LATTICE_FAIL() << "recv from rank " << src << " in a one-process group " << name_;
  }
  std::unique_ptr<CommRequest> isend(const float*, int64_t, int dst, int) override {
    LATTICE_FAIL() << "isend to rank " << dst << " in a one-process group " << name_;
  }
  std::unique_ptr<CommRequest> irecv(float*, int64_t, int src, int) override {
    LATTICE_FAIL() << "irecv from rank " << src << " in a one-process group " << name_;
  }
  void barrier() override { stats_.add(CommOp::barrier, 0); }
  void all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                  const std::vector<int64_t>& recv_counts) override {
    LATTICE_CHECK(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0])
        << "all_to_all counts for 1 rank";
    if (send_counts[0] > 0) copy_on_device(recv, send, size_t(send_counts[0]) * sizeof(float));
    stats_.add(CommOp::all_to_all, 0);
  }

 private:
  std::vector<int> ranks_;
};

}  // namespace

std::unique_ptr<CommRequest> Comm::iall_reduce_bf16(uint16_t*, int64_t) {
  LATTICE_FAIL() << "the " << name_ << " communicator has no bf16 all-reduce";
}

std::unique_ptr<CommRequest> Comm::ireduce_scatter_bf16(const uint16_t*, uint16_t*, const std::vector<int64_t>&) {
  LATTICE_FAIL() << "the " << name_ << " communicator has no bf16 reduce-scatter";
}

void Comm::all_to_all(const float*, const std::vector<int64_t>&, float*, const std::vector<int64_t>&) {
  LATTICE_FAIL() << "the " << name_ << " communicator has no all-to-all";
}

std::unique_ptr<Comm> make_local_comm(const std::string& name, int world_rank) {
  return std::make_unique<LocalComm>(name, world_rank);
}

}  // namespace lattice
