// --tensorboard-dir: TensorBoard's event files, written as Megatron's training loop writes
// them (its SummaryWriter.add_scalar calls), without TensorFlow or protobuf libraries.
//
// An event file is a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
// (little-endian; masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8, crc32c the
// Castagnoli CRC), whose data is a serialized tensorflow.Event protobuf:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first record is the file_version "brain.Event:2" event. The file is
// DIR/events.out.tfevents.<seconds>.<host>.<pid>.lattice: TensorBoard reads every file whose
// name holds "tfevents", so a resumed run adds a file next to the first.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace lattice {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of n bytes.
uint32_t crc32c(const void* data, size_t n);

// TFRecord framing of one record's data (the bytes written for it).
std::string tf_record(const std::string& data);

// A serialized Event holding one scalar.
std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);

class TensorBoardWriter {
 public:
  // Creates dir (and parents) and a new event file in it; errors name --tensorboard-dir.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // Hands the records written so far to the operating system (TensorBoard sees them).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace lattice
