#include "checkpoint/checksum.h"

#include <libdeflate.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "core/error.h"

namespace lattice {

uint32_t crc32_bytes(const void* data, size_t n, uint32_t crc) {
  return libdeflate_crc32(crc, data, n);  // zlib's crc32, computed with carry-less multiplies where the CPU has them
}

FileChecksum checksum_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) LATTICE_FAIL() << path << ": cannot open: " << std::strerror(errno);
  FileChecksum out;
  std::unique_ptr<unsigned char[]> buf(new unsigned char[1 << 20]);
  for (;;) {
    const size_t n = std::fread(buf.get(), 1, 1 << 20, f.get());
    if (n > 0) {
      out.crc32 = crc32_bytes(buf.get(), n, out.crc32);
      out.bytes += n;
    }
    if (n < (1 << 20)) {
      if (std::ferror(f.get())) LATTICE_FAIL() << path << ": read failed: " << std::strerror(errno);
      break;
    }
  }
  return out;
}

std::string crc32_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

bool parse_crc32_hex(const std::string& s, uint32_t* out) {
  if (s.size() != 8) return false;
  uint32_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = (v << 4) | uint32_t(d);
  }
  *out = v;
  return true;
}

}  // namespace lattice
