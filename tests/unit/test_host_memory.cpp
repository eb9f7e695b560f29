// A buffer larger than the machine can hold is an OutOfMemory error naming what it is for
// (core/host_memory.h, device_alloc), not a process killed by the OOM killer: the limit
// read from /proc/meminfo and the cgroup, and the owners of the large buffers adding what
// they allocate.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "model/gpt_model.h"
#include "optim/param_buffer.h"

namespace lattice {
namespace {

const std::string kMeminfo =
    "MemTotal:       32000000 kB\n"
    "MemFree:         1000000 kB\n"
    "MemAvailable:    2000000 kB\n"
    "SwapTotal:       1000000 kB\n"
    "SwapFree:         500000 kB\n";

TEST(HostMemory, MemAvailablePlusSwapFree) {
  const HostMemory m = parse_host_memory(kMeminfo, "", "");
  EXPECT_EQ(m.available, size_t(2500000) * 1024);
  EXPECT_NE(m.source.find("MemAvailable"), std::string::npos) << m.source;
}

TEST(HostMemory, CgroupLimitWhenLower) {
  // cgroup v2 (memory.max, memory.current) and v1 (memory.limit_in_bytes, usage) read the same.
  const HostMemory m = parse_host_memory(kMeminfo, "1000000000\n", "400000000\n");
  EXPECT_EQ(m.available, size_t(600000000));
  EXPECT_NE(m.source.find("cgroup"), std::string::npos) << m.source;
  // Over its limit already: nothing left.
  EXPECT_EQ(parse_host_memory(kMeminfo, "1000\n", "5000\n").available, 0u);
}

TEST(HostMemory, NoCgroupLimit) {
  const size_t meminfo_only = size_t(2500000) * 1024;
  EXPECT_EQ(parse_host_memory(kMeminfo, "max\n", "400000000\n").available, meminfo_only);  // v2 unlimited
  EXPECT_EQ(parse_host_memory(kMeminfo, "9223372036854771712\n", "959741952\n").available, meminfo_only);  // v1
  EXPECT_EQ(parse_host_memory(kMeminfo, "garbage", "1").available, meminfo_only);
}

TEST(HostMemory, NothingReadable) {
  EXPECT_EQ(parse_host_memory("", "", "").available, SIZE_MAX);
  EXPECT_EQ(parse_host_memory("MemTotal: 100 kB\n", "", "").available, SIZE_MAX);
  // A field named like the end of another is not it.
  EXPECT_EQ(parse_host_memory("XMemAvailable: 100 kB\n", "", "").available, SIZE_MAX);
}

TEST(HostMemory, ThisMachine) {
  const HostMemory m = host_memory_available();
  EXPECT_GT(m.available, size_t(0));
  EXPECT_LT(m.available, SIZE_MAX) << "no /proc/meminfo";
}

// what(): the message of an OutOfMemory thrown by f, or "" when f did not throw one.
template <typename F>
std::string out_of_memory_message(F&& f) {
  try {
    f();
  } catch (const OutOfMemory& e) {
    return e.what();
  }
  return "";
}

TEST(HostMemory, DeviceAllocBeyondTheMachine) {
  ASSERT_EQ(current_device(), Device::cpu);
  const HostMemory m = host_memory_available();
  ASSERT_LT(m.available, SIZE_MAX / 4);
  // More than is available, but what malloc itself might grant (Linux over-commits): the
  // check must refuse it before the pages are zeroed.
  // (A multiple of 2 MB: large buffers are rounded to whole huge pages.)
  const size_t huge_page = size_t(2) << 20;
  const size_t bytes = (m.available / huge_page + 128) * huge_page;
  const std::string msg = out_of_memory_message([&] { DevicePtr p = make_device_buffer(bytes); });
  EXPECT_NE(msg.find("cannot allocate " + describe_bytes(bytes) + ": out of memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("available: "), std::string::npos) << msg;
}

TEST(HostMemory, OwnersNameTheirBuffers) {
  ASSERT_EQ(current_device(), Device::cpu);
  const int64_t huge = int64_t(1) << 42;  // 16 TiB of fp32
  ParamBuffer params;
  params.add("huge", Shape{huge}, ParamInit::zeros, 0.0f);
  std::string msg = out_of_memory_message([&] { params.allocate(); });
  const std::string params_want =
      "the parameters and gradients (" + std::to_string(huge) + " fp32 elements each): cannot allocate";
  EXPECT_EQ(msg.rfind(params_want, 0), 0u) << msg;

  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 1000;
  c.max_position_embeddings = 64;
  c.finalize();
  const int64_t B = int64_t(1) << 28;
  msg = out_of_memory_message([&] { GPTModel model(c, B, 64); });
  const std::string activations_want =
      "the activations (micro-batch " + std::to_string(B) + " x 64 tokens, 1 in flight): cannot allocate";
  EXPECT_EQ(msg.rfind(activations_want, 0), 0u) << msg;
}

}  // namespace
}  // namespace lattice
