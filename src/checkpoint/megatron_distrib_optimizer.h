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
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/megatron_checkpoint.h"
#include "checkpoint/megatron_torch_optimizer.h"

namespace lattice {

class DcpCheckpoint;

// One parameter of a data-parallel buffer (one model chunk's parameters of one dtype), in named_parameters order.
struct MegatronBufferParam {
  int64_t numel;
  bool shared_embedding;  // a bucket of its own (megatron_shared_embedding)
};
// Where Megatron-Core's _ParamAndGradBuffer puts each parameter: its bucket and its first element in the bucket
// (the padded coordinates torch_dist's buckets keep), and each bucket's numel_unpadded (its last parameter's end).
struct MegatronBufferLayout {
  std::vector<int> bucket;            // by parameter
  std::vector<int64_t> start;         // by parameter, within its bucket
  std::vector<int64_t> bucket_numel;  // numel_unpadded, by bucket
  int64_t coalesced(size_t i) const;  // parameter i's first element with the buckets coalesced (distrib_optim.pt)
  int64_t total() const;              // the buckets' values together (distrib_optim.pt's numel_unpadded)
};
// The layout of one buffer: the parameters in reverse order, each at a multiple of 64 elements when `pad_params`
// (Megatron-Core 0.8 on), a bucket closed after the parameter that makes it reach bucket_size (nullopt: one
// bucket) and around a shared embedding.
MegatronBufferLayout megatron_buffer_layout(const std::vector<MegatronBufferParam>& params,
                                            std::optional<int64_t> bucket_size, bool pad_params);
// --overlap-grad-reduce's bucket size from the saved args (--ddp-bucket-size, default max(4e7, 1e6 x DP x CP)),
// which the first stage's first model chunk's buffers use; nullopt: one bucket.
std::optional<int64_t> megatron_overlap_bucket_size(const PyRef& args);
// Whether parameter `key` of a model chunk (`first`: the first stage's first chunk; `last`: the last stage's last)
// is a shared embedding, a bucket of its own: under pipeline parallelism a tied word embedding and its copy on the
// last stage (output_layer.weight), and a prediction depth's copy of the word embeddings.
bool megatron_shared_embedding(const std::string& key, bool first, bool last, int64_t P, bool tied, bool mtp);

// The distributed optimizer's state in a torch_dist checkpoint saved 'dp_reshardable' (Megatron-Core's default
// with --use-distributed-optimizer; common.pt's content_metadata or optimizer.param_state_sharding_type says so):
// each model-parallel rank's (i = p TP + t: Megatron's tp-pp group) buffers as 1-D tensors, one a bucket,
//
//   optimizer.distributed.dp_group_idx_<i>.gbuf_idx_<g>.dtype_(<param dtype>, <grad dtype>).bucket_idx_<b>.<slot>
//
// slot param (the fp32 main parameters), exp_avg, exp_avg_sq, of the bucket's numel_unpadded elements in the
// buffer's padded coordinates (a chunk a parameter, a gap's garbage its own), and the ShardedObjects
// optimizer.distributed.dp_group_idx_<i>.optimizer (the param groups with their step) and .grad_scaler (torch.save
// of [object]). torch_dist keeps no rank's state dict, so each chunk's parameters come in Megatron-Core's
// named_parameters order as its modules register them (LanguageModelEmbedding's word then position embeddings; a
// TransformerLayer's input_layernorm, self_attention's linear_proj then linear_qkv, q_layernorm, k_layernorm,
// pre_mlp_layernorm, mlp's linear_fc1 then linear_fc2, each weight before its bias, Transformer Engine's fused
// layer_norm_weight and layer_norm_bias first; the final norm; the output layer, or the last stage's copy of a tied
// word embedding), gbuf_idx g the model chunk. The rebuilt layout must give every bucket's size, and every fp32 main
// parameter must round to the model's value (an error naming it otherwise). Fills out.optimizer and out.source.fill
// (the main parameters), or says in out.optimizer_note why not: another sharding type, a mixture of experts, prediction
// depths, a chained optimizer, --ddp-num-buckets, a parameter whose place lattice does not know. `model_values` reads
// a parameter's model values (the check's).
void read_megatron_dp_reshardable(MegatronSource& out, const std::shared_ptr<DcpCheckpoint>& dcp,
                                  const TorchArchive& common, const MegatronArgs& m,
                                  std::function<void(const ParamInfo&, float*)> model_values);

// The rank's Adam state from `distrib_optim` (its distrib_optim.pt) for rank file `f` of pipeline stage `stage`;
// nullopt with `note` saying why when it holds a form lattice does not read (an older layout, --ddp-num-buckets,
// another optimizer's state). The state's tensors are views into the distrib_optim.pt archive the result holds.
std::optional<MegatronRankOptimizer> read_megatron_distrib_optimizer(const MegatronRankFile& f,
                                                                     const std::string& distrib_optim, int stage,
                                                                     std::string& note);

}  // namespace lattice
