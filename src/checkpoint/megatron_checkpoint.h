// Megatron-LM's own checkpoints read for `lattice convert --from-megatron`; --ckpt-format torch here
// (torch_dist: megatron_torch_dist.h):
//
//   DIR/latest_checkpointed_iteration.txt        the iteration (or "release")
//   DIR/iter_NNNNNNN/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt
//
// one torch.save file (checkpoint/torch_archive.h) per tensor-parallel rank TT, under pipeline parallelism
// stage PPP, and under expert parallelism expert-parallel rank EEE, holding {'args': argparse.Namespace, 'checkpoint_version': 3.0, 'iteration': N, 'model' (or
// 'model0', 'model1', ... per virtual stage): the Megatron-Core GPTModel's state dict, ...}. The model's flags
// are the saved args (translated to lattice's, which are Megatron's, and checked as `lattice train` checks
// them); each stage's layers are numbered from 0 in its file and placed by the pipeline layout those args
// give; each tensor-parallel rank's part goes where Megatron's split puts it (column-parallel rows, row-parallel
// columns, SwiGLU's gate and up blocks, the padded vocabulary's rows); expert-parallel rank e's routed experts
// are numbered from 0 in its files (global e E/EP + i). Both layer specs are read: the local one
// (input_layernorm, pre_mlp_layernorm, SequentialMLP's local_experts.<i>) and Transformer Engine's (the norms
// fused into linear_qkv and linear_fc1 as layer_norm_weight / layer_norm_bias, grouped experts'
// linear_fc1.weight<i>); Transformer Engine's _extra_state entries are skipped. The legacy (pre-Megatron-Core)
// GPT model's names are read too (language_model.encoder.layers.<l>.self_attention.query_key_value, ...).
//
// --ckpt-format torch_dist (Megatron's default) is read too: DIR/iter_NNNNNNN/common.pt holds the args, and
// .metadata with the __R_K.distcp files a torch.distributed.checkpoint of the sharded state (checkpoint/
// torch_dcp.h), whose layer tensors are decoder.layers.<rest> [num_layers, ...], every layer's in one (Megatron-
// Core's sharded_state_dict prepends the layer axis), each rank's part a chunk: whatever layout saved it, each
// tensor is read whole.
//
// Everything is checked before any value is read: every rank file present, every tensor of the model found
// with its shape, no tensor left over (what only the values show, a record's CRC-32 or the torch format's main
// parameters against the model's, as each is read). Errors name the file and the tensor. Adam's state is read too where lattice
// reads it: torch_dist's, named after the parameters (megatron_torch_dist.h), and the torch format's, numbered
// (megatron_torch_optimizer.h), and the distributed optimizer's, distrib_optim.pt beside each rank file and
// torch_dist's dp_reshardable buckets (megatron_distrib_optimizer.h).
// Not read either: --ckpt-format torch files of experts split otherwise than the dense layers
// (--expert-tensor-parallel-size other than --tensor-model-parallel-size; torch_dist's are read), experts stored as
// the legacy GroupedMLP, latent experts, multi-latent attention and hybrid models. Multi-token prediction's depths
// (mtp.layers.<k>.*, on the last stage) are read.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "checkpoint/hf_common.h"
#include "checkpoint/torch_pickle.h"
#include "data/tokenizer.h"
#include "optim/param_buffer.h"
#include "optim/loss_scaler.h"
#include "train/arguments.h"

namespace lattice {

// A Megatron run's Adam state, where its checkpoint holds one lattice reads: torch_dist's, named after each
// parameter (optimizer.state.exp_avg.<tensor>, optimizer.state.exp_avg_sq.<tensor>: the non-distributed optimizer,
// and the distributed one saved with --dist-ckpt-optim-fully-reshardable), the torch format's non-distributed
// optimizer's, numbered, and its distributed optimizer's distrib_optim.pt.
struct MegatronOptimizerState {
  std::string form;  // which of Megatron's forms it was read from ("the distributed optimizer's distrib_optim.pt", ...)
  int64_t step = 0;  // updates taken (the param groups' 'step', or the state's common_step)
  std::function<void(const ParamInfo&, float*)> exp_avg, exp_avg_sq;  // each parameter's, whole (dst [numel])
  nlohmann::json opt_param_scheduler;            // Megatron's saved fields (lattice's are the same)
  std::optional<LossScalerState> grad_scaler;    // fp16's dynamic loss scaler
};

struct MegatronSource {
  HfSource source;           // the model's configuration (padded vocabulary as saved) and each parameter's values
  int64_t iteration = 0;     // the iteration the checkpoint was saved at
  std::string iteration_dir; // DIR/iter_NNNNNNN (or DIR/release)
  int tp = 1, pp = 1, vp = 1, ep = 1;  // the layout that saved it (ep: expert-parallel ranks)
  bool torch_dist = false;   // --ckpt-format torch_dist (else torch)
  bool transformer_engine = false;  // the norms as Transformer Engine's layer spec names them
  bool legacy = false;       // the legacy (pre-Megatron-Core) model's names (language_model.encoder.layers.<l>...)
  TokenizerSpec tokenizer;   // the saved args' (--tokenizer-type, --vocab-file, --merge-file, --tokenizer-model,
                             // NullTokenizer's --vocab-size)
  int64_t seq_length = 0;    // the saved --seq-length
  int64_t consumed_train_samples = 0;  // the saved args'
  uint64_t seed = 0;                   // the saved --seed
  double flops_so_far = 0;             // num_floating_point_operations_so_far
  // The optimizer state (open_megatron_checkpoint's load_optim); absent: none saved, or one lattice does not read,
  // optimizer_note says which. With it, source.fill reads the optimizer's fp32 main parameters where it keeps
  // them (a bf16 or fp16 run's), not their rounded model copies.
  std::optional<MegatronOptimizerState> optimizer;
  std::string optimizer_note;
};

// Opens DIR (a --save directory, or one of its iter_* directories) and checks it whole; see above. With load_optim,
// the optimizer state too where lattice reads it (checked whole as well).
MegatronSource open_megatron_checkpoint(const std::string& dir, bool load_optim = true);

// The saved args (an argparse.Namespace) as lattice's train flags (the model's and the layout's, checked as
// `lattice train` checks them) and the model's configuration (the vocabulary: padded_vocab_size rows); a
// feature lattice cannot read from these checkpoints is refused naming `what` and the arg.
struct MegatronArgs {
  TrainArgs args;
  TransformerConfig config;
};
MegatronArgs megatron_args(const PyValue& ns, const std::string& what);

class TorchArchive;
// What a checkpoint saves beside the model (a rank file's, or torch_dist's common.pt): the args as the model's
// configuration and train flags, and the iteration, layout, tokenizer and sequence length into `out`.
MegatronArgs read_megatron_saved_state(const TorchArchive& archive, MegatronSource& out);

// The one Adam step of a checkpoint's saved steps (its param groups', its states'; a group without parameters may
// have none); an error naming `where` when they disagree or there are none.
int64_t megatron_adam_step(const std::vector<double>& steps, const std::string& where);
// The archive's opt_param_scheduler (Megatron's fields, lattice's too) as JSON, checked as lattice loads it.
nlohmann::json megatron_scheduler_state(const TorchArchive& archive);

// The fp32 main parameter `main` [n] read for model tensor `key` (in `where`) must round to the model's values
// `model` [n] stored as `dtype` (torch's name: bfloat16, float16, float32), as Megatron copies them after each step: a
// check that an optimizer state was read for the right parameter; else an error saying `why` it may not be.
void check_main_rounds_to_model(const float* main, const float* model, size_t n, const std::string& dtype,
                                const std::string& where, const std::string& key, const std::string& why);

// mp_rank_TT, then _PPP with pipeline parallelism, then _EEE with expert parallelism: the directory of a rank's
// model_optim_rng.pt, as Megatron's get_checkpoint_name names it.
std::string megatron_rank_dir(int t, int p, int e, bool pipeline, bool expert);
// A transformer layer's parameter name as (the layer's prefix, the layer-relative rest): decoder.layers.<l>. or a
// prediction depth's mtp.layers.<k>.transformer_layer.; ("", "") for another name.
std::pair<std::string, std::string> split_layer_name(const std::string& name);
// Transformer Engine's layer spec fuses a layer's norms into the linear layer after them: the name it gives the
// layer-relative parameter `rest` (input_layernorm.weight -> self_attention.linear_qkv.layer_norm_weight,
// pre_mlp_layernorm.bias -> mlp.linear_fc1.layer_norm_bias, ...), or "" for another.
std::string te_fused_norm_name(const std::string& rest);

}  // namespace lattice
