// Megatron-Core's torch_dist checkpoints (--ckpt-format torch_dist, Megatron's default) for `lattice convert
// --from-megatron`:
//
//   DIR/iter_NNNNNNN/metadata.json      the backends ("sharded_backend": "torch_dist")
//   DIR/iter_NNNNNNN/common.pt          torch.save of the state that is not sharded: args, iteration, ...
//   DIR/iter_NNNNNNN/.metadata          a torch.distributed.checkpoint (checkpoint/torch_dcp.h) of the sharded
//   DIR/iter_NNNNNNN/__R_K.distcp       state, each rank's part of a tensor a chunk
//
// The model's tensors are named as its state dict names them but for the layers: decoder.layers.<rest>
// [num_layers, ...] holds every layer's <rest> (Megatron-Core's sharded_state_dict prepends the global layer
// number; non_homogeneous_layers name each layer's own), a routed expert's decoder.layers.mlp.experts.experts.<rest>
// [num_layers, num_experts, ...]. Whatever layout saved it, each tensor is read whole from its chunks.
#pragma once
#include "checkpoint/megatron_checkpoint.h"

namespace lattice {

// `out` holds the iteration directory; fills in the rest (megatron_checkpoint.h), checked whole first.
MegatronSource open_megatron_torch_dist(MegatronSource out);

}  // namespace lattice
