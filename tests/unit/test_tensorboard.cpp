// The TensorBoard event format's pieces (train/tensorboard.h): CRC-32C against RFC 3720's
// test vectors and the record framing. The whole file is read back by an independent reader
// in tests/e2e/test_tensorboard.sh.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "train/tensorboard.h"

namespace lattice {
namespace {

TEST(TensorBoard, Crc32cMatchesRfc3720Vectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  std::vector<unsigned char> b(32, 0x00);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x8a9136aau);  // RFC 3720 B.4: 32 bytes of zeros
  b.assign(32, 0xff);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x62a8ab43u);  // 32 bytes of ones
  for (int i = 0; i < 32; ++i) b[size_t(i)] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x46dd794eu);  // 32 incrementing bytes
  for (int i = 0; i < 32; ++i) b[size_t(i)] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x113fdb5cu);  // 32 decrementing bytes
}

TEST(TensorBoard, RecordFramesTheDataWithItsLengthAndMaskedCrcs) {
  const std::string data = scalar_event("lm loss", 2.5f, 7, 1.0);
  const std::string rec = tf_record(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  uint64_t len = 0;
  std::memcpy(&len, rec.data(), 8);
  EXPECT_EQ(len, data.size());
  EXPECT_EQ(rec.substr(12, data.size()), data);
  auto masked = [](uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; };
  uint32_t crc_len = 0, crc_data = 0;
  std::memcpy(&crc_len, rec.data() + 8, 4);
  std::memcpy(&crc_data, rec.data() + 12 + data.size(), 4);
  EXPECT_EQ(crc_len, masked(crc32c(rec.data(), 8)));
  EXPECT_EQ(crc_data, masked(crc32c(data.data(), data.size())));
  // The tag and the float's bytes are in the message as they are.
  EXPECT_NE(data.find("lm loss"), std::string::npos);
  const float v = 2.5f;
  EXPECT_NE(data.find(std::string(reinterpret_cast<const char*>(&v), 4)), std::string::npos);
}

}  // namespace
}  // namespace lattice
