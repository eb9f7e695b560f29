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

// `out` holds the iteration directory; fills in the rest (megatron_checkpoint.h), checked whole first: the model,
// and with load_optim the optimizer's state where lattice reads it.
//
// Adam's state is read where it is named after the parameter's tensor, optimizer.state.<slot>.<tensor> (slots
// exp_avg, exp_avg_sq, and the fp32 main parameters fp32_param, or param in the distributed optimizer's fully
// reshardable layout), each of its parameter's size and sharding (or reformulated flattened: the distributed
// optimizer's fully_sharded_model_space, Megatron-Core 0.8-0.13, which torch_dcp.h reads whole); Megatron-Core before
// 0.14 prefixed a chained optimizer's (MoE: dense, then experts) with chained_<i>. Its step is common.pt's (the param groups' 'step' or the
// state's common_step), as are the scheduler's state (opt_param_scheduler) and fp16's loss scaler (grad_scaler). The
// distributed optimizer's flat buffers (optimizer.distributed.*) are read where they are saved dp_reshardable
// (megatron_distrib_optimizer.h).
MegatronSource open_megatron_torch_dist(MegatronSource out, bool load_optim);

}  // namespace lattice
