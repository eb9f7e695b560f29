// The tensor index of a checkpoint (the "tensors" and "files" parts of checkpoint.json):
// every tensor by name with its dtype and GLOBAL shape, and the pieces that hold it, each
// a box [offsets, offsets + lengths) of the global tensor stored in one safetensors file
// under a key (the tensor's name, or name#k for a further piece in the same file). One
// process saving whole tensors writes one piece per tensor;
// tensor-, pipeline- and data-parallel ranks write the pieces they own. Loading assembles
// any requested box from whichever pieces overlap it, so reading a checkpoint under a
// different parallel layout is slicing, not conversion (docs/checkpoint-format.md).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lattice {

struct TensorPiece {
  std::string file;              // safetensors file in the iteration directory
  std::string key;               // the piece's tensor name inside that file
  std::vector<int64_t> offsets;  // first element of the box, per dim of the global tensor
  std::vector<int64_t> lengths;  // extent per dim (= the shape of the stored tensor)
};

struct TensorEntry {
  std::string dtype;             // safetensors dtype string ("F32", ...)
  std::vector<int64_t> shape;    // global shape
  std::vector<TensorPiece> pieces;
};

struct FileEntry {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct CheckpointIndex {
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, FileEntry> files;  // every data file of the iteration directory

  nlohmann::json tensors_json() const;
  nlohmann::json files_json() const;
  // Parses and validates (`where` names the index file in errors): known dtypes, pieces
  // inside the global shape, in listed files, not overlapping, together covering the
  // tensor exactly.
  static CheckpointIndex from_json(const nlohmann::json& tensors, const nlohmann::json& files,
                                   const std::string& where);
};

// Elements of a box.
int64_t box_numel(const std::vector<int64_t>& lengths);

// A box of a tensor: offsets and lengths per dim.
struct Box {
  std::vector<int64_t> offsets, lengths;
};

// The boxes (at most 2 * rank - 1, in row-major order) whose union is the contiguous
// row-major element range [begin, end) of a tensor of `shape`: how a shard of a flat
// buffer (the distributed optimizer's unit) becomes pieces.
std::vector<Box> flat_range_to_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

// Copies the part of `piece` (row-major data of shape piece_len placed at piece_off in the
// global tensor) that lies inside the requested box [want_off, want_off + want_len) into
// `out` (row-major data of shape want_len). Elements are esize bytes. Returns the number
// of elements copied (0 when the boxes do not meet).
int64_t copy_box_intersection(const std::vector<int64_t>& piece_off,
                              const std::vector<int64_t>& piece_len, const void* piece,
                              const std::vector<int64_t>& want_off,
                              const std::vector<int64_t>& want_len, void* out, size_t esize);

}  // namespace lattice
