// CRC-32 (zlib's crc32, the ISO-HDLC / gzip polynomial) of byte ranges and whole files:
// every file of a checkpoint carries one, and loading verifies it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace lattice {

// CRC-32 of n bytes; `crc` continues a running checksum (0 starts one).
uint32_t crc32_bytes(const void* data, size_t n, uint32_t crc = 0);

struct FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Streams the file; throws lattice::Error naming it when it cannot be read.
FileChecksum checksum_file(const std::string& path);

// Fixed-width lower-case hex ("1a2b3c4d": 8 digits, no prefix), and its inverse
// (false for anything else).
std::string crc32_hex(uint32_t crc);
bool parse_crc32_hex(const std::string& s, uint32_t* out);

}  // namespace lattice
