// Files written by PyTorch's torch.save (the zip format, PyTorch 1.6 on): a zip archive (libzip reads
// it) holding PREFIX/data.pkl, the pickled object (checkpoint/torch_pickle.h), and PREFIX/data/KEY, each
// storage's raw little-endian bytes. Tensors unpickle as torch._utils._rebuild_tensor_v2 (v3) calls on a
// persistent id ('storage', torch.<Type>Storage, KEY, location, numel); here they become TorchTensor
// values whose data is read only when asked (read_float), so opening a checkpoint of any size reads its
// pickle alone.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/torch_pickle.h"

struct zip_source;  // libzip's
struct zip_error;

namespace lattice {

struct TorchTensor {
  std::string dtype;          // torch's name: float32, bfloat16, float16, float64, int64, uint8, ...
  int element_size = 0;       // bytes
  std::string storage;        // the storage's record key
  int64_t storage_numel = 0;  // elements of the storage
  int64_t offset = 0;         // the tensor's first element in the storage
  std::vector<int64_t> shape, stride;
  int64_t numel() const;
  bool contiguous() const;    // row-major without gaps
};

// Writes a torch.save file: storages added first (each its record's raw bytes), then a pickle that names them
// (pickle_tensor), all written at once by write().
class TorchSaveWriter {
 public:
  // A storage of `bytes` (little-endian elements); returns its record key ("0", "1", ...).
  std::string add_storage(std::vector<uint8_t> bytes);
  // A storage of `size` bytes that produce() makes only when write() reaches its record (and drops after it), so
  // a file larger than memory is written one storage in memory at a time. produce must return `size` bytes.
  std::string add_storage(uint64_t size, std::function<std::vector<uint8_t>()> produce);
  // Pushes onto w a tensor of torch.<storage_type> (FloatStorage, BFloat16Storage, ByteStorage, ...) over the
  // whole storage `key` of `numel` elements, contiguous with `shape`: _rebuild_tensor_v2 as torch.save writes it.
  static void pickle_tensor(PickleWriter& w, const std::string& key, const std::string& storage_type, int64_t numel,
                            const std::vector<int64_t>& shape);
  // Writes `path` (a zip archive, stored: PREFIX/data.pkl, PREFIX/data/KEY, PREFIX/version, PREFIX/byteorder)
  // through a temporary file, fsynced, renamed into place (the caller fsyncs the directory); errors name the file.
  void write(const std::string& path, const std::string& prefix, const std::string& pickle) const;

 private:
  struct Storage {
    std::vector<uint8_t> bytes;  // or, when produce is set, made by it
    uint64_t size = 0;
    std::function<std::vector<uint8_t>()> produce;
  };
  std::vector<Storage> storages_;
};

class TorchArchive {
 public:
  // Opens `path` and unpickles its object; an unreadable archive or pickle is an error naming the file.
  explicit TorchArchive(const std::string& path);
  // The same from bytes in memory (a torch.save inside another file: checkpoint/torch_dcp.h); `what` names them.
  TorchArchive(const std::string& what, std::vector<uint8_t> bytes);
  // The same from bytes [start, start + length) of file `path`, read where they lie (no copy in memory).
  TorchArchive(const std::string& what, const std::string& path, uint64_t start, uint64_t length);
  ~TorchArchive();
  TorchArchive(const TorchArchive&) = delete;
  TorchArchive& operator=(const TorchArchive&) = delete;

  const std::string& path() const { return path_; }
  const PyRef& root() const { return root_; }
  // The tensor a value holds, or null.
  static const TorchTensor* tensor(const PyRef& v);
  // t's values as fp32 (float16 and bfloat16 widen exactly, float64 rounds) into out [t.numel()]; a tensor that is
  // not floating point, not contiguous or not within its storage is an error naming the file and `name`.
  void read_float(const TorchTensor& t, const std::string& name, float* out) const;
  // A saved number: a Python int or float, or a one-element floating-point tensor; nullopt for null; another value is
  // an error naming the file and `name`.
  std::optional<double> number(const PyRef& v, const std::string& name) const;

 private:
  void read_pickle();
  // Opens the archive libzip reads from the source `make` gives (an error naming path_ if it is not one), then its
  // pickle.
  void open_source(const std::function<::zip_source*(::zip_error*)>& make);

  std::string path_, prefix_;
  std::vector<uint8_t> bytes_;  // the archive, when read from memory
  struct Zip;
  std::unique_ptr<Zip> zip_;
  PyRef root_;
};

}  // namespace lattice
