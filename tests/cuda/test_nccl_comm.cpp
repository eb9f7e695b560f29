// The NCCL Comm on one GPU: a one-rank communicator made through the factory from a
// local (host) Comm, every operation on device buffers, the results, the ordering
// after the compute stream, and the byte/call counters (dist/comm.h conventions).
// Multi-rank behaviour (uneven reduce-scatter pieces across ranks, real peers) needs
// several GPUs and is exercised by the distributed runs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "dist/comm.h"
#include "dist/nccl_comm.h"
#include "kernels/cast.h"

namespace lattice {
namespace {

using cuda_test::download;
using cuda_test::upload;

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(int64_t(i) - int64_t(n / 2));
  return v;
}

// Index and values of the first difference, for messages.
std::string first_diff(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return "sizes " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return "first difference at " + std::to_string(i) + ": got " + std::to_string(got[i]) + " want " +
             std::to_string(want[i]);
  return "";
}

#define EXPECT_SAME(got, want, what) EXPECT_EQ(first_diff(got, want), "") << what

std::unique_ptr<Comm> make_one_rank(Comm& host_group, const std::string& name) {
  std::unique_ptr<Comm> c = make_nccl_comm(host_group, name);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->world_ranks(), std::vector<int>{0});
  EXPECT_EQ(c->name(), name);
  return c;
}

TEST(NcclComm, FactoryBroadcastsTheIdThroughTheHostGroup) {
  LATTICE_REQUIRE_CUDA();
  auto local = make_local_comm("dp");
  auto comm = make_one_rank(*local, "dp");
  EXPECT_EQ(local->stats().calls[int(CommOp::broadcast)], 1u);
  EXPECT_EQ(local->stats().bytes[int(CommOp::broadcast)], 128u);  // NCCL_UNIQUE_ID_BYTES
  EXPECT_EQ(comm->stats().total_bytes(), 0u);
}

TEST(NcclComm, OneRankCollectivesOnDeviceBuffers) {
  LATTICE_REQUIRE_CUDA();
  auto local = make_local_comm("tp");
  auto comm = make_one_rank(*local, "tp");
  const size_t n = 1000;
  const std::vector<float> x = ramp(n, 0.25f);

  // all_reduce sum and max over one rank: the identity, in place.
  auto d = upload(x);
  comm->all_reduce(d.as<float>(), int64_t(n), ReduceOp::sum);
  EXPECT_SAME(download<float>(d, n), x, "all_reduce sum");
  comm->all_reduce(d.as<float>(), int64_t(n), ReduceOp::max);
  EXPECT_SAME(download<float>(d, n), x, "all_reduce max");

  std::vector<double> xd(10);
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = 1.0 / double(i + 3);
  auto dd = upload(xd);
  comm->all_reduce(dd.as<double>(), int64_t(xd.size()), ReduceOp::sum);
  EXPECT_EQ(download<double>(dd, xd.size()), xd) << "all_reduce double";

  auto req = comm->iall_reduce(d.as<float>(), int64_t(n));
  req->wait();
  EXPECT_TRUE(req->test()) << "a waited request must test complete";
  EXPECT_SAME(download<float>(d, n), x, "iall_reduce");

  // reduce_scatter: recv = the one piece of send. The send buffer is written by the
  // compute stream just before (asynchronously): the communication must wait for it.
  cuda::DeviceBuffer send(n * sizeof(float)), recv(n * sizeof(float));
  cuda::memset_device(send.data(), 0x3f, n * sizeof(float));  // every float 0x3f3f3f3f
  comm->reduce_scatter(send.as<float>(), recv.as<float>(), {int64_t(n)});
  float pattern;
  const uint32_t bits = 0x3f3f3f3fu;
  std::memcpy(&pattern, &bits, 4);
  EXPECT_SAME(download<float>(recv, n), std::vector<float>(n, pattern), "reduce_scatter after an async memset");

  // all_gather over one rank: the data stays.
  auto g = upload(x);
  comm->all_gather(g.as<float>(), {int64_t(n)});
  EXPECT_SAME(download<float>(g, n), x, "all_gather");

  // broadcast from the only rank: bytes unchanged.
  std::vector<uint8_t> bytes(256);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 7);
  auto db = upload(bytes);
  comm->broadcast(db.data(), int64_t(bytes.size()), 0);
  EXPECT_EQ(download<uint8_t>(db, bytes.size()), bytes) << "broadcast";

  comm->barrier();

  const CommStats& s = comm->stats();
  EXPECT_EQ(s.bytes[int(CommOp::all_reduce)], uint64_t(n * 4 * 2 + 10 * 8 + n * 4));
  EXPECT_EQ(s.calls[int(CommOp::all_reduce)], 4u);
  EXPECT_EQ(s.bytes[int(CommOp::reduce_scatter)], uint64_t(n * 4));
  EXPECT_EQ(s.calls[int(CommOp::reduce_scatter)], 1u);
  EXPECT_EQ(s.bytes[int(CommOp::all_gather)], uint64_t(n * 4));
  EXPECT_EQ(s.calls[int(CommOp::all_gather)], 1u);
  EXPECT_EQ(s.bytes[int(CommOp::broadcast)], 256u);
  EXPECT_EQ(s.calls[int(CommOp::broadcast)], 1u);
  EXPECT_EQ(s.bytes[int(CommOp::barrier)], 0u);
  EXPECT_EQ(s.calls[int(CommOp::barrier)], 1u);
  EXPECT_EQ(s.calls[int(CommOp::send)] + s.calls[int(CommOp::recv)], 0u);
}

// The blocking operations on HOST buffers (a loss, a norm, amaxes, the found-inf flag):
// staged through device memory and copied back. A small call, then larger ones (the
// staging buffer grows, stream-ordered), then a small one again; every value must come
// back unchanged (one rank) and the counters count the host buffers as device ones.
TEST(NcclComm, BlockingOperationsOnHostBuffers) {
  LATTICE_REQUIRE_CUDA();
  auto local = make_local_comm("dp");
  auto comm = make_one_rank(*local, "dp");
  uint64_t bytes = 0;
  for (size_t n : {size_t(1), size_t(1000), size_t(300000), size_t(3)}) {
    std::vector<float> x = ramp(n, 0.5f);
    const std::vector<float> want = x;
    comm->all_reduce(x.data(), int64_t(n), ReduceOp::sum);
    EXPECT_SAME(x, want, "host all_reduce sum of " + std::to_string(n));
    comm->all_reduce(x.data(), int64_t(n), ReduceOp::max);
    EXPECT_SAME(x, want, "host all_reduce max of " + std::to_string(n));
    std::vector<double> d(n);
    for (size_t i = 0; i < n; ++i) d[i] = 1.0 / double(i + 7);
    const std::vector<double> dwant = d;
    comm->all_reduce(d.data(), int64_t(n), ReduceOp::sum);
    EXPECT_EQ(d, dwant) << "host all_reduce double of " << n;
    bytes += n * 4 * 2 + n * 8;
  }
  std::vector<uint8_t> b(777);
  for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(i * 13 + 1);
  const std::vector<uint8_t> bwant = b;
  comm->broadcast(b.data(), int64_t(b.size()), 0);
  EXPECT_EQ(b, bwant) << "host broadcast";
  // The compute stream is usable afterwards, and device buffers still take the direct path.
  auto dev = upload(ramp(64, 2.0f));
  comm->all_reduce(dev.as<float>(), 64, ReduceOp::sum);
  EXPECT_SAME(download<float>(dev, 64), ramp(64, 2.0f), "device all_reduce after host ones");
  EXPECT_EQ(comm->stats().bytes[int(CommOp::all_reduce)], bytes + 64 * 4);
  EXPECT_EQ(comm->stats().bytes[int(CommOp::broadcast)], 777u);
}

// --grad-reduce-in-bf16: the bf16 all-reduce and reduce-scatter (one rank: identities on
// the bit patterns), counted at 2 bytes an element.
TEST(NcclComm, Bf16Reductions) {
  LATTICE_REQUIRE_CUDA();
  auto local = make_local_comm("dp");
  auto comm = make_one_rank(*local, "dp");
  const size_t n = 1001;
  const std::vector<float> x = ramp(n, 0.125f);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(x[i]);
  auto d = upload(h);
  comm->iall_reduce_bf16(d.as<uint16_t>(), int64_t(n))->wait();
  EXPECT_EQ(download<uint16_t>(d, n), h) << "iall_reduce_bf16";
  cuda::DeviceBuffer recv(n * sizeof(uint16_t));
  comm->ireduce_scatter_bf16(d.as<uint16_t>(), recv.as<uint16_t>(), {int64_t(n)})->wait();
  EXPECT_EQ(download<uint16_t>(recv, n), h) << "ireduce_scatter_bf16";
  EXPECT_EQ(comm->stats().bytes[int(CommOp::all_reduce)], uint64_t(n * 2));
  EXPECT_EQ(comm->stats().bytes[int(CommOp::reduce_scatter)], uint64_t(n * 2));
}

// The per-rank grouped form (ncclReduce / ncclBroadcast per rank, used for unequal counts).
TEST(NcclComm, GroupedPerRankForms) {
  LATTICE_REQUIRE_CUDA();
  auto local = make_local_comm("dp");
  auto comm = make_one_rank(*local, "dp");
  const size_t n = 333;
  const std::vector<float> x = ramp(n, -1.5f);
  nccl_force_grouped_collectives(true);
  auto send = upload(x), g = upload(x);
  cuda::DeviceBuffer recv(n * sizeof(float));
  auto r1 = comm->ireduce_scatter(send.as<float>(), recv.as<float>(), {int64_t(n)});
  auto r2 = comm->iall_gather(g.as<float>(), {int64_t(n)});
  r1->wait();
  r2->wait();
  nccl_force_grouped_collectives(false);
  EXPECT_SAME(download<float>(recv, n), x, "grouped reduce_scatter");
  EXPECT_SAME(download<float>(g, n), x, "grouped all_gather");
  EXPECT_EQ(comm->stats().bytes[int(CommOp::reduce_scatter)], uint64_t(n * 4));
  EXPECT_EQ(comm->stats().bytes[int(CommOp::all_gather)], uint64_t(n * 4));
}

// Point to point with itself: the isend is held until the irecv, then both run as one
// NCCL group (ncclSend + ncclRecv).
TEST(NcclComm, SendToItselfThroughIrecv) {
  LATTICE_REQUIRE_CUDA();
  auto local = make_local_comm("pp");
  auto comm = make_one_rank(*local, "pp");
  const size_t n = 100;
  const std::vector<float> x = ramp(n, 3.0f);
  auto src = upload(x);
  cuda::DeviceBuffer dst(n * sizeof(float));
  auto s = comm->isend(src.as<float>(), int64_t(n), 0, 7);
  EXPECT_FALSE(s->test()) << "an isend to itself cannot complete before its irecv";
  auto r = comm->irecv(dst.as<float>(), int64_t(n), 0, 7);
  r->wait();
  s->wait();
  EXPECT_SAME(download<float>(dst, n), x, "isend/irecv to itself");
}

// The all-to-all (the MoE dispatch) with one rank: one ncclSend/ncclRecv pair to itself in a group;
// nothing counted as sent to another rank. Several ranks: the SIMT emulation's expert-parallel run.
TEST(NcclComm, AllToAllWithItself) {
  LATTICE_REQUIRE_CUDA();
  auto local = make_local_comm("ep");
  auto comm = make_one_rank(*local, "ep");
  const size_t n = 77;
  const std::vector<float> x = ramp(n, 0.5f);
  auto src = upload(x);
  cuda::DeviceBuffer dst(n * sizeof(float));
  comm->all_to_all(src.as<float>(), {int64_t(n)}, dst.as<float>(), {int64_t(n)});
  EXPECT_SAME(download<float>(dst, n), x, "all_to_all with itself");
  EXPECT_EQ(comm->stats().calls[int(CommOp::all_to_all)], 1u);
  EXPECT_EQ(comm->stats().bytes[int(CommOp::all_to_all)], 0u);
  EXPECT_THROW(comm->all_to_all(src.as<float>(), {1, 2}, dst.as<float>(), {int64_t(n)}), Error);
}

TEST(NcclComm, PointToPointErrorsNameTheGroup) {
  LATTICE_REQUIRE_CUDA();
  auto local = make_local_comm("pp");
  auto comm = make_one_rank(*local, "pp");
  cuda::DeviceBuffer b(64 * sizeof(float));
  auto expect_error = [](auto&& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one containing '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error([&] { comm->send(b.as<float>(), 4, 0, 0); }, "send to itself (rank 0) in the pp group");
  comm->set_wait_context("stage 0, micro-batch 2");
  expect_error([&] { comm->recv(b.as<float>(), 4, 0, 0); }, "pp group (stage 0, micro-batch 2)");
  expect_error([&] { comm->isend(b.as<float>(), 4, 1, 0); }, "isend to rank 1");
  expect_error([&] { comm->reduce_scatter(b.as<float>(), b.as<float>(), {4, 4}); }, "one count per rank");
  auto s = comm->isend(b.as<float>(), 4, 0, 0);
  expect_error([&] { s->wait(); }, "before the matching irecv was posted");
  expect_error([&] { comm->irecv(b.as<float>(), 5, 0, 0); }, "matches an isend of 4 floats");
  auto r = comm->irecv(b.as<float>(), 4, 0, 0);  // the held send still matches
  r->wait();
  s->wait();
  // Failed calls count nothing; the two 4-float transfers count once each.
  EXPECT_EQ(comm->stats().bytes[int(CommOp::send)], 16u);
  EXPECT_EQ(comm->stats().calls[int(CommOp::send)], 1u);
  EXPECT_EQ(comm->stats().bytes[int(CommOp::recv)], 16u);
  EXPECT_EQ(comm->stats().calls[int(CommOp::recv)], 1u);
}

}  // namespace
}  // namespace lattice
