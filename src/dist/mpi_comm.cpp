#include "dist/mpi_comm.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/cast.h"

namespace lattice {
namespace {

double g_timeout_seconds = 600.0;

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    LATTICE_FAIL() << what << " failed: " << std::string(msg, size_t(len));
  }
}

// Waits for an MPI request with the job's timeout; on timeout the job is aborted with
// a message that names this rank, the group and the operation.
void wait_request(MPI_Request& req, const std::string& group, CommOp op, CommStats& stats) {
  // Open MPI progresses a non-blocking operation only inside its calls, so the wait
  // polls without sleeping (a sleep between polls throttles large transfers); yield lets
  // a peer rank sharing the core run.
  Timer t;
  int done = 0;
  while (true) {
    check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) break;
    std::this_thread::yield();
    if (t.seconds() > g_timeout_seconds) {
      std::ostringstream os;
      os << "rank " << mpi_world_rank() << ": timed out after " << t.seconds() << " s waiting in "
         << comm_op_name(op) << " on the " << group << (group.find(" group (") == std::string::npos ? " group" : "")
         << " (--distributed-timeout-minutes); a peer rank died or stopped answering";
      abort_job(os.str());
    }
  }
  stats.seconds[int(op)] += t.seconds();
}

class MpiRequest : public CommRequest {
 public:
  MpiRequest(MPI_Request req, std::string group, CommOp op, CommStats& stats,
             std::vector<int> keep_counts = {}, std::vector<int> keep_displs = {})
      : req_(req), group_(std::move(group)), op_(op), stats_(stats), counts_(std::move(keep_counts)),
        displs_(std::move(keep_displs)) {}
  ~MpiRequest() override {
    if (!done_) wait();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    done_ = flag != 0;
    return done_;
  }
  void wait() override {
    if (done_) return;
    wait_request(req_, group_, op_, stats_);
    done_ = true;
  }

 private:
  MPI_Request req_;
  std::string group_;
  CommOp op_;
  CommStats& stats_;
  std::vector<int> counts_, displs_;  // MPI reads these until completion
  bool done_ = false;
};

std::vector<int> to_int_counts(const std::vector<int64_t>& counts) {
  std::vector<int> c;
  for (int64_t x : counts) {
    LATTICE_CHECK(x >= 0 && x < (int64_t(1) << 31)) << "message of " << x << " elements too large for MPI";
    c.push_back(int(x));
  }
  return c;
}

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

// MPI has no bf16 type: bf16 elements travel as MPI_UINT16_T and are summed by this
// operation, each pair in fp32 rounded back to bf16. Declared non-commutative, so MPI
// combines in rank order and every rank gets the same bits.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = fp32_to_bf16(bf16_to_fp32(a[i]) + bf16_to_fp32(b[i]));
}

MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op o;
    check_mpi(MPI_Op_create(bf16_sum, 0, &o), "MPI_Op_create");
    return o;
  }();
  return op;
}

class MpiComm : public Comm {
 public:
  MpiComm(const std::string& name, MPI_Comm comm, std::vector<int> world_ranks)
      : Comm(name), comm_(comm), ranks_(std::move(world_ranks)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }

  void all_reduce(float* data, int64_t n, ReduceOp op) override {
    stats_.add(CommOp::all_reduce, uint64_t(n) * 4);
    MPI_Request r;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, int(n), MPI_FLOAT, op == ReduceOp::sum ? MPI_SUM : MPI_MAX,
                             comm_, &r),
              "MPI_Iallreduce");
    wait_request(r, label(), CommOp::all_reduce, stats_);
  }
  void all_reduce(double* data, int64_t n, ReduceOp op) override {
    stats_.add(CommOp::all_reduce, uint64_t(n) * 8);
    MPI_Request r;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, int(n), MPI_DOUBLE, op == ReduceOp::sum ? MPI_SUM : MPI_MAX,
                             comm_, &r),
              "MPI_Iallreduce");
    wait_request(r, label(), CommOp::all_reduce, stats_);
  }
  std::unique_ptr<CommRequest> iall_reduce(float* data, int64_t n) override {
    stats_.add(CommOp::all_reduce, uint64_t(n) * 4);
    MPI_Request r;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, int(n), MPI_FLOAT, MPI_SUM, comm_, &r), "MPI_Iallreduce");
    return std::make_unique<MpiRequest>(r, label(), CommOp::all_reduce, stats_);
  }
  std::unique_ptr<CommRequest> ireduce_scatter(const float* send, float* recv,
                                               const std::vector<int64_t>& counts) override {
    LATTICE_CHECK(int(counts.size()) == size_) << "reduce_scatter needs one count per rank";
    std::vector<int> c = to_int_counts(counts);
    int64_t total = 0;
    for (int64_t x : counts) total += x;
    stats_.add(CommOp::reduce_scatter, uint64_t(total) * 4);
    MPI_Request r;
    check_mpi(MPI_Ireduce_scatter(send, recv, c.data(), MPI_FLOAT, MPI_SUM, comm_, &r), "MPI_Ireduce_scatter");
    return std::make_unique<MpiRequest>(r, label(), CommOp::reduce_scatter, stats_, std::move(c));
  }
  std::unique_ptr<CommRequest> iall_reduce_bf16(uint16_t* data, int64_t n) override {
    LATTICE_CHECK(n < (int64_t(1) << 31)) << "message of " << n << " elements too large for MPI";
    stats_.add(CommOp::all_reduce, uint64_t(n) * 2);
    MPI_Request r;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, int(n), MPI_UINT16_T, bf16_sum_op(), comm_, &r), "MPI_Iallreduce");
    return std::make_unique<MpiRequest>(r, label(), CommOp::all_reduce, stats_);
  }
  std::unique_ptr<CommRequest> ireduce_scatter_bf16(const uint16_t* send, uint16_t* recv,
                                                    const std::vector<int64_t>& counts) override {
    LATTICE_CHECK(int(counts.size()) == size_) << "reduce_scatter needs one count per rank";
    std::vector<int> c = to_int_counts(counts);
    int64_t total = 0;
    for (int64_t x : counts) total += x;
    stats_.add(CommOp::reduce_scatter, uint64_t(total) * 2);
    MPI_Request r;
    check_mpi(MPI_Ireduce_scatter(send, recv, c.data(), MPI_UINT16_T, bf16_sum_op(), comm_, &r),
              "MPI_Ireduce_scatter");
    return std::make_unique<MpiRequest>(r, label(), CommOp::reduce_scatter, stats_, std::move(c));
  }
  std::unique_ptr<CommRequest> iall_gather(float* data, const std::vector<int64_t>& counts) override {
    LATTICE_CHECK(int(counts.size()) == size_) << "all_gather needs one count per rank";
    std::vector<int> c = to_int_counts(counts);
    std::vector<int> d = displacements(c);
    int64_t total = 0;
    for (int64_t x : counts) total += x;
    stats_.add(CommOp::all_gather, uint64_t(total) * 4);
    MPI_Request r;
    check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, c.data(), d.data(), MPI_FLOAT, comm_, &r),
              "MPI_Iallgatherv");
    return std::make_unique<MpiRequest>(r, label(), CommOp::all_gather, stats_, std::move(c), std::move(d));
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    stats_.add(CommOp::broadcast, uint64_t(bytes));
    MPI_Request r;
    check_mpi(MPI_Ibcast(data, int(bytes), MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
    wait_request(r, label(), CommOp::broadcast, stats_);
  }
  void send(const float* data, int64_t n, int dst, int tag) override { isend(data, n, dst, tag)->wait(); }
  void recv(float* data, int64_t n, int src, int tag) override { irecv(data, n, src, tag)->wait(); }
  std::unique_ptr<CommRequest> isend(const float* data, int64_t n, int dst, int tag) override {
    stats_.add(CommOp::send, uint64_t(n) * 4);
    MPI_Request r;
    check_mpi(MPI_Isend(data, int(n), MPI_FLOAT, dst, tag, comm_, &r), "MPI_Isend");
    return std::make_unique<MpiRequest>(r, label(), CommOp::send, stats_);
  }
  std::unique_ptr<CommRequest> irecv(float* data, int64_t n, int src, int tag) override {
    stats_.add(CommOp::recv, uint64_t(n) * 4);
    MPI_Request r;
    check_mpi(MPI_Irecv(data, int(n), MPI_FLOAT, src, tag, comm_, &r), "MPI_Irecv");
    return std::make_unique<MpiRequest>(r, label(), CommOp::recv, stats_);
  }
  void all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                  const std::vector<int64_t>& recv_counts) override {
    LATTICE_CHECK(int(send_counts.size()) == size_ && int(recv_counts.size()) == size_)
        << "all_to_all needs one send and one receive count per rank";
    std::vector<int> sc = to_int_counts(send_counts), rc = to_int_counts(recv_counts);
    std::vector<int> sd = displacements(sc), rd = displacements(rc);
    LATTICE_CHECK(int64_t(sd.back()) + sc.back() < (int64_t(1) << 31) && int64_t(rd.back()) + rc.back() < (int64_t(1) << 31))
        << "all_to_all of more than 2^31 elements too large for MPI";
    stats_.add(CommOp::all_to_all, uint64_t(int64_t(sd.back()) + sc.back() - sc[size_t(rank_)]) * 4);
    MPI_Request r;
    check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT, comm_, &r),
              "MPI_Ialltoallv");
    wait_request(r, label(), CommOp::all_to_all, stats_);
  }
  void barrier() override {
    stats_.add(CommOp::barrier, 0);
    MPI_Request r;
    check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    wait_request(r, label(), CommOp::barrier, stats_);
  }

 private:
  MPI_Comm comm_;
  std::vector<int> ranks_;
  int rank_ = 0, size_ = 1;
};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

int mpi_init_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  }
  return mpi_world_size();
}

int mpi_world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int mpi_world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

int mpi_local_size() {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int s = 1;
  MPI_Comm_size(local, &s);
  MPI_Comm_free(&local);
  return s;
}

void set_comm_timeout_seconds(double seconds) { g_timeout_seconds = seconds; }

std::unique_ptr<Comm> make_mpi_comm(const std::string& name, const std::vector<std::vector<int>>& groups) {
  const int me = mpi_world_rank();
  int color = -1;
  std::vector<int> mine;
  for (size_t g = 0; g < groups.size(); ++g)
    for (int r : groups[g])
      if (r == me) {
        color = int(g);
        mine = groups[g];
      }
  if (color < 0) {  // a rank outside every group still takes part in the split
    MPI_Comm none;
    check_mpi(MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, 0, &none), "MPI_Comm_split");
    return nullptr;
  }
  int key = 0;
  for (size_t i = 0; i < mine.size(); ++i)
    if (mine[i] == me) key = int(i);
  MPI_Comm comm;
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm), "MPI_Comm_split");
  return std::make_unique<MpiComm>(name, comm, mine);
}

void abort_job(const std::string& message) {
  std::fprintf(stderr, "lattice: error: %s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace lattice
