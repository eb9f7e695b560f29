// A rank's parts of the global tensors, for checkpoints under any parallel layout.
//
// Saving: every parameter-shaped buffer (the parameters, each optimizer-state tensor) is a
// flat buffer in the ParamBuffer layout. Under tensor parallelism each rank holds the box
// [global_offsets, global_offsets + shape) of every global tensor; param_parts names those
// boxes (TensorPart: name, global shape, box, data), and the writer stores them as pieces.
// Loading: read_param_part reads this rank's box of a global tensor, whatever layout saved it.
//
// The vocabulary tensors ("embedding.word_embeddings.weight", "output_layer.weight") have
// padded_vocab_size rows, and the padding depends on the tensor-parallel size
// (ceil(V / (divisible_by * T)) * divisible_by * T): their dim 0 may differ between the
// checkpoint and the model. Rows >= V never affect a result; the rows both have are read and
// the rest of the box is zeroed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "optim/param_buffer.h"

namespace lattice {

// One box of a global tensor held by one rank.
struct TensorPart {
  std::string name;                    // checkpoint tensor name
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;        // the box's first element, per dim of the global tensor
  std::vector<int64_t> lengths;        // its extent per dim
  const float* data = nullptr;         // row-major [lengths]
};

// The parts that tensor-parallel rank `tp_rank`, holding `infos`, contributes from `flat`
// (a buffer in the infos' layout), named prefix + parameter name. Rank r's part of a split
// tensor sits at offset r * (local extent) along the split dim (parts are equal, so every
// rank's boxes follow from any rank's infos; a blocked tensor, ParamInfo::tp_blocks, gives
// one part per block: param_boxes); a tp_duplicated tensor (a full copy on every
// rank) is contributed by tp rank 0 only, and the last pipeline stage's copy of a tied word
// embedding (shared_embedding_copy) not at all: the first stage saves it. flat may be null (the parts then
// name their boxes only; data null).
std::vector<TensorPart> param_parts(const std::vector<ParamInfo>& infos, const float* flat, int tp_rank,
                                    const std::string& prefix = "");

// Stages parts as pieces (F32) of `file`.
// borrow: CheckpointWriter::add_piece's (the parts' data must then outlive the save).
void add_parts(CheckpointWriter& w, const std::string& file, const std::vector<TensorPart>& parts,
               bool borrow = false);

// Copies part.data (row-major [lengths]) into its box of `whole` (row-major [global_shape]).
void place_part(const TensorPart& part, float* whole);

// Whether dim 0 of the parameter is the padded vocabulary.
bool is_vocab_padded(const std::string& param_name);

// Reads this rank's box of the global tensor `name` (the parameter `info`, or an optimizer
// state of it) into dst [info.shape]. The checkpoint's global shape must be info.global_shape,
// except dim 0 of a vocabulary tensor: rows of the box beyond the checkpoint's rows are zeroed.
// A mismatch is a one-line error naming the tensor.
void read_param_part(const CheckpointReader& r, const std::string& name, const ParamInfo& info, float* dst);

}  // namespace lattice
