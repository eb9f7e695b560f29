// Brings the tensor parts of every contributing rank to the one rank that writes the
// checkpoint, one rank at a time.
//
// A contributor is a rank whose parts belong in the checkpoint: data-parallel rank 0 of each
// tensor-parallel and pipeline position. Each sends the writer a header naming its
// parts (tensor names, global shapes, boxes, where each lies in its flat buffer) and then the
// flat buffer itself; the writer receives one contributor's buffer at a time into a staging
// buffer and hands its parts on before the next arrives, so it holds at most one peer buffer.
// Nothing assumes that contributors hold the same tensors or the same layout.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "checkpoint/tensor_parts.h"

namespace lattice {

class Comm;

// `parts` point into `flat` (n floats). On contributors[0] (the writer): take(its own parts),
// then take(parts received) from contributors[1], [2], ... in order. On the other
// contributors: sends to the writer (messages tagged `tag`). On the remaining ranks: nothing.
// A null comm or an empty list: take(parts) alone. Ranks are comm's.
void gather_parts(Comm* comm, const std::vector<int>& contributors, const std::vector<TensorPart>& parts,
                  const float* flat, int64_t n, int tag,
                  const std::function<void(const std::vector<TensorPart>&)>& take);

}  // namespace lattice
