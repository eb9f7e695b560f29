// The MPI communicator: every collective against its definition, with the byte counters.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "dist/mpi_comm.h"
#include "dist/parallel_state.h"

namespace lattice {
namespace {

// The groups the processes form follow the rank order: PP 2 x DP 2 on 4 ranks, a copy's two stages
// ranks 0 and 2 in Megatron's default order, ranks 0 and 1 with --use-tp-pp-dp-mapping.
TEST(DistComm, RankOrderDecidesTheGroups) {
  if (mpi_world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto ps = ParallelState::create(1, 2, 60);
  const int r = ps->world_rank();
  EXPECT_EQ(ps->pp_rank(), r / 2);
  EXPECT_EQ(ps->dp_rank(), r % 2);
  ps.reset();
  ps = ParallelState::create(1, 2, 60, 1, 1, 1, 0, true);
  EXPECT_EQ(ps->pp_rank(), r % 2);
  EXPECT_EQ(ps->dp_rank(), r / 2);
  EXPECT_EQ(ps->embedding()->size(), 2);
}

TEST(DistComm, AllReduceSumAndMax) {
  auto ps = ParallelState::create(1, 1, 60);
  Comm& w = ps->world();
  const int n = w.size(), r = w.rank();
  std::vector<float> x = {float(r), float(r * 2 + 1), -float(r)};
  w.all_reduce(x.data(), 3, ReduceOp::sum);
  EXPECT_EQ(x[0], float(n * (n - 1) / 2));
  EXPECT_EQ(x[1], float(n * (n - 1) + n));
  double m = double(r);
  w.all_reduce(&m, 1, ReduceOp::max);
  EXPECT_EQ(m, double(n - 1));
  EXPECT_EQ(w.stats().bytes[int(CommOp::all_reduce)], 3u * 4 + 8);
  EXPECT_EQ(w.stats().calls[int(CommOp::all_reduce)], 2u);
}

TEST(DistComm, ReduceScatterUnevenAndAllGather) {
  auto ps = ParallelState::create(1, 1, 60);
  Comm& w = ps->world();
  const int n = w.size(), r = w.rank();
  const int64_t total = 7 * n + 3;  // uneven pieces
  std::vector<int64_t> counts = even_split(total, n);
  std::vector<float> send(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) send[size_t(i)] = float(i * (r + 1));
  std::vector<float> recv(static_cast<size_t>(counts[size_t(r)]));
  w.reduce_scatter(send.data(), recv.data(), counts);
  int64_t begin = 0;
  for (int k = 0; k < r; ++k) begin += counts[size_t(k)];
  const float ranks_sum = float(n * (n + 1) / 2);
  for (int64_t i = 0; i < counts[size_t(r)]; ++i) EXPECT_EQ(recv[size_t(i)], float(begin + i) * ranks_sum);
  EXPECT_EQ(w.stats().bytes[int(CommOp::reduce_scatter)], uint64_t(total) * 4);

  std::vector<float> all(static_cast<size_t>(total), -1.0f);
  for (int64_t i = 0; i < counts[size_t(r)]; ++i) all[size_t(begin + i)] = float(1000 * r + i);
  w.all_gather(all.data(), counts);
  int64_t pos = 0;
  for (int k = 0; k < n; ++k)
    for (int64_t i = 0; i < counts[size_t(k)]; ++i) EXPECT_EQ(all[size_t(pos++)], float(1000 * k + i));
  EXPECT_EQ(w.stats().bytes[int(CommOp::all_gather)], uint64_t(total) * 4);
}

// Rank r sends (r + 1) * (q + 1) - 1 elements to rank q (rank 0 sends none to itself), each
// element naming its sender, its destination and its index; every rank checks what arrived.
TEST(DistComm, AllToAllUnevenCounts) {
  auto ps = ParallelState::create(1, 1, 60);
  Comm& w = ps->world();
  const int n = w.size(), r = w.rank();
  auto count = [](int from, int to) { return int64_t(from + 1) * (to + 1) - 1; };
  auto value = [](int from, int to, int64_t i) { return float(from * 1000 + to * 100 + i); };
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<float> send;
  for (int q = 0; q < n; ++q) {
    send_counts.push_back(count(r, q));
    recv_counts.push_back(count(q, r));
    for (int64_t i = 0; i < count(r, q); ++i) send.push_back(value(r, q, i));
  }
  std::vector<float> recv(size_t(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t(0))), -1.0f);
  w.all_to_all(send.data(), send_counts, recv.data(), recv_counts);
  size_t at = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < count(q, r); ++i, ++at) ASSERT_EQ(recv[at], value(q, r, i)) << "from rank " << q << ", element " << i;
  EXPECT_EQ(w.stats().calls[int(CommOp::all_to_all)], 1u);
  // The bytes sent to the other ranks.
  EXPECT_EQ(w.stats().bytes[int(CommOp::all_to_all)], uint64_t(send.size() - size_t(count(r, r))) * 4);
  // One rank: a copy.
  auto local = make_local_comm("ep");
  std::vector<float> out(3);
  const std::vector<float> in = {1, 2, 3};
  local->all_to_all(in.data(), {3}, out.data(), {3});
  EXPECT_EQ(out, in);
}

TEST(DistComm, BroadcastAndSendRecv) {
  auto ps = ParallelState::create(1, 1, 60);
  Comm& w = ps->world();
  const int n = w.size(), r = w.rank();
  int value = r == 0 ? 1234 : -1;
  w.broadcast(&value, sizeof value, 0);
  EXPECT_EQ(value, 1234);
  if (n < 2) return;
  std::vector<float> buf(5);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> out = {float(r), 1, 2, 3, 4};
  auto s = w.isend(out.data(), 5, next, 7);
  w.recv(buf.data(), 5, prev, 7);
  s->wait();
  EXPECT_EQ(buf[0], float(prev));
  w.barrier();
}

}  // namespace
}  // namespace lattice
