// Adam's state of Megatron-Core's distributed optimizer (--use-distributed-optimizer) in a --ckpt-format torch
// checkpoint, for `lattice convert --from-megatron`. Each rank directory holds it beside model_optim_rng.pt (whose
// 'optimizer' keeps the param groups, their step and fp16's loss scaler) in distrib_optim.pt, as
// get_parameter_state_dp_zero gathers it to the first data-parallel rank:
//
//   {'buckets_coalesced': True,
//    gbuf_idx: {(param_dtype, grad_dtype): {'param', 'exp_avg', 'exp_avg_sq': fp32 [numel_unpadded],
//                                           'numel_unpadded': int}}}
//
// (a mixture of experts' ChainedOptimizer saves a list: the dense optimizer's, None on a rank that is not the
// first of the dense data-parallel group, then the routed experts'). 'param' is the fp32 main parameter. Nothing
// in the file says which parameter is where: the layout is Megatron-Core's data-parallel buffer's
// (_ParamAndGradBuffer), rebuilt here from the rank's state dict and the saved args:
//
// - a buffer per model chunk and parameter dtype (gbuf_idx counting chunk by chunk; the routed experts, which are
//   not all-reduced over the whole data-parallel group, in the experts' optimizer's buffers);
// - in a buffer the parameters in reverse named_parameters order (the state dict's order, less _extra_state and
//   the router's buffers), each starting at a multiple of 64 elements (Megatron-Core 0.8 on; without that padding
//   before it);
// - buckets: with --overlap-grad-reduce, a bucket closes after the parameter that makes it reach --ddp-bucket-size
//   (default max(4e7, 1e6 x DP x CP)) on the first stage's first model chunk (elsewhere one bucket); under pipeline
//   parallelism a tied word embedding and its copy on the last stage (and a prediction depth's copy) are buckets of
//   their own;
// - coalesced: each bucket's values end at its last parameter (its end padding dropped), the next bucket's follow.
//
// The rebuilt layout is checked against each buffer's numel_unpadded and its dtype, and, as the values are read,
// every fp32 main parameter against the model's copy of it (megatron_checkpoint.cpp): a layout read wrong is an
// error naming the file, never silent garbage.
#pragma once
#include <optional>
#include <string>

#include "checkpoint/megatron_torch_optimizer.h"

namespace lattice {

// The rank's Adam state from `distrib_optim` (its distrib_optim.pt) for rank file `f` of pipeline stage `stage`;
// nullopt with `note` saying why when it holds a form lattice does not read (an older layout, --ddp-num-buckets,
// another optimizer's state). The state's tensors are views into the distrib_optim.pt archive the result holds.
std::optional<MegatronRankOptimizer> read_megatron_distrib_optimizer(const MegatronRankFile& f,
                                                                     const std::string& distrib_optim, int stage,
                                                                     std::string& note);

}  // namespace lattice
