// The SIMT emulation's streams (simt_streams.h): work runs in stream order when something
// waits for it, so a reader not ordered after its writer reads what was there before, as
// it can on a GPU. Device memory is host memory here, which is how these tests look at it
// between the operations (outside the emulation that would be a bug of its own).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "simt_device.h"
#include "simt_streams.h"

namespace lattice::simt {
namespace {

// A device buffer of n floats, freed at the end of the test.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)), cudaSuccess);
  }
  ~DeviceFloats() { (void)cudaFree(p); }
  float* p = nullptr;
  size_t n;
};

struct Stream {
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { (void)cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

struct Event {
  Event() { EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess); }
  ~Event() { (void)cudaEventDestroy(e); }
  cudaEvent_t e = nullptr;
};

// Each test chooses the order of independent work it is about (LATTICE_SIMT_STREAMS may
// say another for the rest of the suite).
class SimtStreams : public ::testing::Test {
 protected:
  void TearDown() override { set_stream_order(initial_); }
  static void use(StreamOrder order) { set_stream_order(order); }

 private:
  StreamOrder initial_ = stream_order();
};
using SimtStreamsDeathTest = SimtStreams;

void fill(const DeviceFloats& d, float v, cudaStream_t s) {
  const std::vector<float> host(d.n, v);
  ASSERT_EQ(cudaMemcpyAsync(d.p, host.data(), d.n * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
}

TEST_F(SimtStreams, WorkRunsWhenTheStreamIsWaitedFor) {
  use(StreamOrder::reads_early);
  Stream s;
  DeviceFloats d(4);
  ASSERT_EQ(cudaMemsetAsync(d.p, 0, 4 * sizeof(float), s.s), cudaSuccess);
  fill(d, 2.0f, s.s);
  EXPECT_NE(d.p[0], 2.0f) << "queued, not yet run";
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(d.p[0], 2.0f);
  EXPECT_EQ(d.p[3], 2.0f);
}

TEST_F(SimtStreams, ACopyFromTheHostReadsItsSourceWhenEnqueued) {
  Stream s;
  DeviceFloats d(1);
  float host = 5.0f;
  ASSERT_EQ(cudaMemcpyAsync(d.p, &host, sizeof host, cudaMemcpyHostToDevice, s.s), cudaSuccess);
  host = 7.0f;  // pageable memory: CUDA has staged it before returning
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_EQ(d.p[0], 5.0f);
}

TEST_F(SimtStreams, ACopyToTheHostCompletesBeforeItReturns) {
  Stream s;
  DeviceFloats d(3);
  fill(d, 3.5f, s.s);
  std::vector<float> back(3, 0.0f);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), d.p, 3 * sizeof(float), cudaMemcpyDeviceToHost, s.s), cudaSuccess);
  EXPECT_EQ(back, std::vector<float>(3, 3.5f));
}

// A second stream reading what the first one writes: without an event between them it
// reads the old contents; with one, the new.
TEST_F(SimtStreams, AnotherStreamSeesTheWriteOnlyAfterWaitingOnItsEvent) {
  use(StreamOrder::reads_early);
  Stream producer, consumer;
  DeviceFloats x(2), unordered(2), ordered(2);
  fill(x, 1.0f, producer.s);
  ASSERT_EQ(cudaStreamSynchronize(producer.s), cudaSuccess);

  fill(x, 9.0f, producer.s);
  ASSERT_EQ(cudaMemcpyAsync(unordered.p, x.p, 2 * sizeof(float), cudaMemcpyDeviceToDevice, consumer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer.s), cudaSuccess);
  EXPECT_EQ(unordered.p[0], 1.0f) << "a read not ordered after the write runs before it";

  Event written;
  ASSERT_EQ(cudaEventRecord(written.e, producer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer.s, written.e, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(ordered.p, x.p, 2 * sizeof(float), cudaMemcpyDeviceToDevice, consumer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer.s), cudaSuccess);
  EXPECT_EQ(ordered.p[0], 9.0f);
  EXPECT_EQ(ordered.p[1], 9.0f);
}

// cudaStreamWaitEvent waits for the recording at the time of the call, not a later one.
TEST_F(SimtStreams, AWaitIsOnTheRecordingAtTheTimeOfTheCall) {
  use(StreamOrder::reads_early);
  Stream a, b;
  DeviceFloats x(1), y(1), seen(1);
  Event e;
  fill(x, 1.0f, a.s);
  ASSERT_EQ(cudaEventRecord(e.e, a.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b.s, e.e, 0), cudaSuccess);
  fill(y, 2.0f, a.s);
  ASSERT_EQ(cudaEventRecord(e.e, a.s), cudaSuccess);  // a later recording: b does not wait for it
  ASSERT_EQ(cudaMemcpyAsync(seen.p, x.p, sizeof(float), cudaMemcpyDeviceToDevice, b.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
  EXPECT_EQ(seen.p[0], 1.0f);
  EXPECT_NE(y.p[0], 2.0f) << "a's work after the first recording has not run";
  ASSERT_EQ(cudaEventSynchronize(e.e), cudaSuccess);
  EXPECT_EQ(y.p[0], 2.0f);
}

// A host that polls an event sees it not ready first, then complete with its work done.
TEST_F(SimtStreams, APolledEventIsNotReadyOnceThenComplete) {
  use(StreamOrder::reads_early);
  Stream s;
  DeviceFloats d(1);
  Event e;
  EXPECT_EQ(cudaEventQuery(e.e), cudaSuccess) << "never recorded";
  fill(d, 4.0f, s.s);
  ASSERT_EQ(cudaEventRecord(e.e, s.s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e.e), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(e.e), cudaSuccess);
  EXPECT_EQ(d.p[0], 4.0f);
}

// An event destroyed while its recording is still queued (as NCCL's ordering events are)
// leaves the stream's work to run as before.
TEST_F(SimtStreams, AnEventMayBeDestroyedBeforeItsWorkRuns) {
  Stream a, b;
  DeviceFloats x(1), y(1);
  fill(x, 6.0f, a.s);
  {
    Event e;
    ASSERT_EQ(cudaEventRecord(e.e, a.s), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(b.s, e.e, 0), cudaSuccess);
  }
  ASSERT_EQ(cudaMemcpyAsync(y.p, x.p, sizeof(float), cudaMemcpyDeviceToDevice, b.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
  EXPECT_EQ(y.p[0], 6.0f);
}

TEST_F(SimtStreams, AFailingKernelIsReportedAtTheNextSynchronization) {
  use(StreamOrder::reads_early);
  Stream s;
  launch(nullptr, dim3(1), dim3(2), 0, s.s, [] {
    if (thread_idx.x == 1) trap();
  });
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the configuration is valid: the launch is queued";
  EXPECT_EQ(cudaStreamSynchronize(s.s), cudaErrorLaunchFailure);
  const std::string what = cudaGetErrorString(cudaGetLastError());
  EXPECT_NE(what.find("__trap() in thread 1"), std::string::npos) << what;
  EXPECT_NE(what.find("block (0,0,0)"), std::string::npos) << what;
  EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess) << "the error was read";
}

TEST_F(SimtStreams, ABadConfigurationFailsAtTheLaunch) {
  Stream s;
  bool ran = false;
  launch(nullptr, dim3(1), dim3(2048), 0, s.s, [&ran] { ran = true; });
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  EXPECT_FALSE(ran);
}

// An NCCL result is written in its stream's order: a kernel on another stream reads it
// only when ordered after the operation's event (what lattice's NcclRequest does).
TEST_F(SimtStreams, AnNcclResultIsVisibleAfterItsEvent) {
  use(StreamOrder::reads_early);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  Stream compute, comms;
  DeviceFloats in(2), out(2), early(2), late(2);
  fill(in, 3.0f, compute.s);
  fill(out, 0.0f, compute.s);
  Event ready, done;
  ASSERT_EQ(cudaEventRecord(ready.e, compute.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(comms.s, ready.e, 0), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(in.p, out.p, 2, ncclFloat32, ncclSum, comm, comms.s), ncclSuccess);
  ASSERT_EQ(cudaEventRecord(done.e, comms.s), cudaSuccess);

  ASSERT_EQ(cudaMemcpyAsync(early.p, out.p, 2 * sizeof(float), cudaMemcpyDeviceToDevice, compute.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(compute.s, done.e, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(late.p, out.p, 2 * sizeof(float), cudaMemcpyDeviceToDevice, compute.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute.s), cudaSuccess);
  EXPECT_EQ(early.p[0], 0.0f) << "read before the operation's result";
  EXPECT_EQ(late.p[0], 3.0f);
  EXPECT_EQ(late.p[1], 3.0f);
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// A write to an NCCL operation's input that is not ordered after the operation would change
// what a GPU sends: the emulation ends the process when the operation's stream gets there.
TEST_F(SimtStreamsDeathTest, AWriteToAnNcclInputBeforeItsEventEndsTheProcess) {
  use(StreamOrder::reads_early);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto overwrite = [](bool ordered) {
    ncclUniqueId id;
    (void)ncclGetUniqueId(&id);
    ncclComm_t comm = nullptr;
    (void)ncclCommInitRank(&comm, 1, id, 0);
    Stream compute, comms;
    DeviceFloats in(4), out(4);
    fill(in, 1.0f, compute.s);
    Event ready, done;
    (void)cudaEventRecord(ready.e, compute.s);
    (void)cudaStreamWaitEvent(comms.s, ready.e, 0);
    (void)ncclAllReduce(in.p, out.p, 4, ncclFloat32, ncclSum, comm, comms.s);
    (void)cudaEventRecord(done.e, comms.s);
    if (ordered) (void)cudaStreamWaitEvent(compute.s, done.e, 0);
    fill(in, 2.0f, compute.s);  // the next micro-batch's data, say
    (void)cudaDeviceSynchronize();
    (void)ncclCommDestroy(comm);
    return out.p[0];
  };
  EXPECT_EQ(overwrite(true), 1.0f);
  // Byte 2 is the first that differs between 1.0f and 2.0f (little-endian).
  EXPECT_DEATH(overwrite(false), "input of an NCCL all-reduce \\(16 bytes at .*\\) was written at byte 2");
}

// In writes-early order the work a stream waits for runs before the stream's own earlier
// work: a reader queued before its wait sees the writer's value (in reads-early, the old).
TEST_F(SimtStreams, WritesEarlyRunsWhatAStreamWaitsForFirst) {
  for (StreamOrder order : {StreamOrder::reads_early, StreamOrder::writes_early}) {
    use(order);
    Stream writer, reader;
    DeviceFloats x(1), seen(1);
    fill(x, 1.0f, writer.s);
    ASSERT_EQ(cudaStreamSynchronize(writer.s), cudaSuccess);
    fill(x, 8.0f, writer.s);
    Event written;
    ASSERT_EQ(cudaEventRecord(written.e, writer.s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(seen.p, x.p, sizeof(float), cudaMemcpyDeviceToDevice, reader.s), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(reader.s, written.e, 0), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(reader.s), cudaSuccess);
    EXPECT_EQ(seen.p[0], order == StreamOrder::writes_early ? 8.0f : 1.0f);
  }
}

// A pipeline stage's pattern: a send of a buffer, the buffer refilled for the next
// micro-batch, then the next send (which waits for the compute stream). Refilled without
// waiting for the first send's event, the buffer may change while a GPU still sends it
// (its receiver may be late): the first send's check is due when its completion is known (at
// the device synchronization), not when the next send reads its own input, and ends the
// process in either order. Refilled after waiting for the event, all is well.
TEST_F(SimtStreamsDeathTest, ABufferRefilledBeforeItsSendCompletedEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto refill_while_sending = [](StreamOrder order, bool wait_for_the_send) {
    set_stream_order(order);
    ncclUniqueId id;
    (void)ncclGetUniqueId(&id);
    ncclComm_t comm = nullptr;
    (void)ncclCommInitRank(&comm, 1, id, 0);
    Stream compute, channel;
    DeviceFloats out(4), got(4), next(4);
    Event sent;
    auto send_out = [&](float* into) {
      Event ready;
      (void)cudaEventRecord(ready.e, compute.s);
      (void)cudaStreamWaitEvent(channel.s, ready.e, 0);
      (void)ncclGroupStart();
      (void)ncclSend(out.p, 4, ncclFloat32, 0, comm, channel.s);
      (void)ncclRecv(into, 4, ncclFloat32, 0, comm, channel.s);
      (void)ncclGroupEnd();
      (void)cudaEventRecord(sent.e, channel.s);
    };
    fill(out, 1.0f, compute.s);
    send_out(got.p);
    if (wait_for_the_send) (void)cudaStreamWaitEvent(compute.s, sent.e, 0);
    fill(out, 2.0f, compute.s);
    send_out(next.p);
    (void)cudaDeviceSynchronize();
    (void)ncclCommDestroy(comm);
    return got.p[0] + next.p[0];
  };
  for (StreamOrder order : {StreamOrder::reads_early, StreamOrder::writes_early}) {
    EXPECT_EQ(refill_while_sending(order, true), 3.0f);
    EXPECT_DEATH(refill_while_sending(order, false), "input of an NCCL send \\(16 bytes");
  }
}

}  // namespace
}  // namespace lattice::simt
