#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace lattice {

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}

// Protocol buffer wire format: a field's key (number << 3 | wire type) and its value.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_key(std::string& out, int field, int wire_type) { put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type)); }
void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 1);  // 64-bit
  put_le(out, bits, 8);
}
void put_float(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 5);  // 32-bit
  put_le(out, bits, 4);
}
void put_int64(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);  // varint (negative values as their two's complement, 10 bytes)
  put_varint(out, uint64_t(v));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);  // length-delimited
  put_varint(out, bytes.size());
  out += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

std::string tf_record(const std::string& data) {
  std::string out, len;
  put_le(len, data.size(), 8);
  out += len;
  put_le(out, masked_crc32c(len.data(), len.size()), 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v, summary, event;
  put_bytes(v, 1, tag);
  put_float(v, 2, value);
  put_bytes(summary, 1, v);
  put_double(event, 1, wall_time);
  put_int64(event, 2, step);
  put_bytes(event, 5, summary);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    LATTICE_FAIL() << "--tensorboard-dir " << dir << ": cannot create the directory"
                   << (ec ? ": " + ec.message() : std::string(": a file of that name exists"));
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  const double t = now_seconds();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(int64_t(t)) + "." + host + "." +
                                         std::to_string(getpid()) + ".lattice"))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) LATTICE_FAIL() << "--tensorboard-dir " << dir << ": cannot create " << path_ << ": " << std::strerror(errno);
  std::string first;
  put_double(first, 1, t);
  put_bytes(first, 3, "brain.Event:2");
  write_record(first);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(scalar_event(tag, float(value), step, now_seconds()));
}

void TensorBoardWriter::write_record(const std::string& data) {
  const std::string rec = tf_record(data);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size())
    LATTICE_FAIL() << "--tensorboard-dir: writing " << path_ << " failed: " << std::strerror(errno);
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0)
    LATTICE_FAIL() << "--tensorboard-dir: writing " << path_ << " failed: " << std::strerror(errno);
}

}  // namespace lattice
