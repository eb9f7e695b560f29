#include "checkpoint/checksum.h"

#include <gtest/gtest.h>

#include <string>

#include "ckpt_test_util.h"

namespace lattice {
namespace {

using ckpt_test::TempDirTest;

TEST(CkptChecksum, Crc32KnownVectors) {
  // The CRC-32 check value of the ISO-HDLC polynomial, and the empty string.
  const std::string s = "123456789";
  EXPECT_EQ(crc32_bytes(s.data(), s.size()), 0xcbf43926u);
  EXPECT_EQ(crc32_bytes(nullptr, 0), 0u);
  // Running checksums compose.
  EXPECT_EQ(crc32_bytes(s.data() + 4, 5, crc32_bytes(s.data(), 4)), 0xcbf43926u);
}

TEST(CkptChecksum, HexRoundTripAndRejects) {
  uint32_t v = 0;
  EXPECT_EQ(crc32_hex(0xcbf43926u), "cbf43926");
  EXPECT_EQ(crc32_hex(0x1u), "00000001");
  ASSERT_TRUE(parse_crc32_hex("cbf43926", &v));
  EXPECT_EQ(v, 0xcbf43926u);
  for (const char* bad : {"", "cbf4392", "cbf439260", "CBF43926", "cbf4392g", "-bf43926"})
    EXPECT_FALSE(parse_crc32_hex(bad, &v)) << bad;
}

class CkptChecksumFile : public TempDirTest {};

TEST_F(CkptChecksumFile, FileMatchesBytesAndSeesOneFlippedBit) {
  std::string data(3 << 20, '\0');  // spans several read chunks
  for (size_t i = 0; i < data.size(); ++i) data[i] = char(i * 131 + (i >> 9));
  ckpt_test::write_bytes(path("f"), data);
  FileChecksum cs = checksum_file(path("f"));
  EXPECT_EQ(cs.bytes, data.size());
  EXPECT_EQ(cs.crc32, crc32_bytes(data.data(), data.size()));
  data[2'000'000] ^= 0x10;
  ckpt_test::write_bytes(path("f"), data);
  EXPECT_NE(checksum_file(path("f")).crc32, cs.crc32);
  std::string msg = ckpt_test::error_of([&] { checksum_file(path("missing")); });
  EXPECT_NE(msg.find(path("missing")), std::string::npos) << msg;
}

}  // namespace
}  // namespace lattice
