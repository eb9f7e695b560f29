// Checkpoints of PyTorch's torch.distributed.checkpoint (DCP) as its FileSystemWriter lays them out, which
// Megatron-Core's torch_dist format is:
//
//   DIR/.metadata        pickle of Metadata: state_dict_metadata {fqn: TensorStorageMetadata(properties, size,
//                        chunks [ChunkStorageMetadata(offsets, sizes)]) or BytesStorageMetadata()} and
//                        storage_data {MetadataIndex(fqn, offset): _StorageInfo(relative_path, offset, length)}
//   DIR/__R_K.distcp     each chunk torch.save'd at its offset (checkpoint/torch_archive.h)
//
// A tensor is the union of its chunks, boxes of its global size; reading one reads only the chunks it needs.
// Errors name the directory (or file) and the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace lattice {

class DcpCheckpoint {
 public:
  struct Chunk {
    std::vector<int64_t> offsets, sizes;  // the box in the global tensor
    std::string file;                      // relative to the directory
    int64_t offset = 0, length = 0;        // its torch.save bytes in the file
  };
  struct Tensor {
    std::vector<int64_t> size;  // global
    std::vector<Chunk> chunks;
    // Megatron-Core's flattened tensors (a ShardedTensor with a flattened_range: the distributed optimizer's
    // fully_sharded_model_space state, 0.8-0.13) are saved reformulated: global [G_0, ..., G_k-1] with each dim split
    // in F_d fragments of l_d = G_d / F_d (the tensor-parallel parts; F_d = G_d, l_d = 1 on the stacked layer and
    // expert axes) as [F_0, ..., F_k-1, l_0 ... l_k-1], a fragment's values flattened row-major in the last dim, each
    // data-parallel rank's range of them a chunk. .metadata's mcore_data names G
    // (nd_reformulated_orig_global_shape); `size` is then G, `stored` the saved shape (the chunks' coordinates).
    std::vector<int64_t> stored;  // empty: saved as it is
  };

  // Reads DIR/.metadata (no tensor yet).
  explicit DcpCheckpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  // The tensors, by fully qualified name (bytes items are not among them).
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  // The bytes items' names (objects saved whole: Transformer Engine's extra state, Megatron's ShardedObjects).
  const std::set<std::string>& bytes_items() const { return bytes_items_; }
  // A bytes item's bytes (Megatron's ShardedObject: a torch.save of [object]).
  std::vector<uint8_t> read_bytes_item(const std::string& name) const;
  // How many values of the slice at `lead` (its first lead.size() dims fixed; {}: the whole tensor) its chunks
  // hold (chunks do not overlap: DCP saves each element once), from the metadata alone.
  int64_t covered(const std::string& fqn, const std::vector<int64_t>& lead) const;
  // That slice of tensor fqn as fp32 into out; every element must lie in some chunk.
  void read_float(const std::string& fqn, const std::vector<int64_t>& lead, float* out) const;
  // Elements [begin, begin + count) of the 1-D tensor fqn as fp32 into out (reading the chunks they lie in); every
  // one must lie in some chunk.
  void read_float_range(const std::string& fqn, int64_t begin, int64_t count, float* out) const;

 private:
  std::string dir_;
  std::map<std::string, Tensor> tensors_;
  std::set<std::string> bytes_items_;
  std::map<std::string, Chunk> bytes_item_storage_;  // where each bytes item's bytes are (its file, offset, length)
  // Chunk c of tensor fqn: its values as fp32 into out [its box's numel] (the chunk's tensor checked against the box).
  void read_chunk(const std::string& fqn, const Chunk& c, float* out) const;
};

}  // namespace lattice
