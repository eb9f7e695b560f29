// Adam's state in a Megatron-LM --ckpt-format torch rank file (model_optim_rng.pt's 'optimizer'), for
// `lattice convert --from-megatron`. It is numbered, not named: torch's Optimizer.state_dict numbers the
// parameters of its param groups consecutively, and Megatron-Core's _get_param_groups fills each group with the
// model's parameters in named_parameters order (model chunks in turn), a parameter going to the group of its
// weight-decay multiplier (wd_mult 0 for biases and 1-D parameters, else 1) and, with --decoupled-lr, of the
// embedding's and output layer's learning rate. named_parameters' order is the model state dict's own order
// (parameters before children, as state_dict walks them), so each parameter's number is found from the rank
// file itself: the state dict's entries in order (less Transformer Engine's _extra_state and the router's
// expert_bias buffer), each into the one saved group that matches it, and each group's count checked against its
// saved 'params'. Every state's shape is checked against its parameter's.
//
// The forms read: Float16OptimizerWithFloat16Params ({'optimizer': Adam's state dict, 'grad_scaler',
// 'fp32_from_fp16_params': the fp32 main parameters, group by group}), FP32Optimizer (Adam's state dict itself),
// and ChainedOptimizer's list of them (a mixture of experts: the dense parameters' optimizer, then the routed
// experts'). The step is the param groups' 'step' (Transformer Engine's and Apex's FusedAdam) or the states' 'step'
// (torch.optim.Adam). The distributed optimizer keeps its state in distrib_optim.pt (megatron_distrib_optimizer.h).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/torch_archive.h"
#include "checkpoint/torch_pickle.h"
#include "optim/loss_scaler.h"

namespace lattice {

// One --ckpt-format torch rank file: its archive and its state dicts' tensors (chunk v's under 'model', or
// 'model<v>'), by Megatron-Core's names and in the state dict's order.
struct MegatronRankFile {
  std::unique_ptr<TorchArchive> archive;
  std::vector<std::map<std::string, PyRef>> chunks;
  std::vector<std::vector<std::string>> order;  // each chunk's keys in its state dict's order
  std::set<std::string> used;                   // keys a parameter reads
};

// One parameter's Adam state in a rank file.
struct MegatronParamState {
  PyRef exp_avg, exp_avg_sq;
  PyRef main;  // the fp32 main parameter (Float16OptimizerWithFloat16Params'), or null
};

struct MegatronRankOptimizer {
  std::vector<std::map<std::string, MegatronParamState>> chunks;  // by chunk, then state-dict key
  std::vector<double> steps;                                      // every step saved (they must agree)
  std::optional<LossScalerState> grad_scaler;                     // fp16's dynamic loss scaler
  std::shared_ptr<TorchArchive> archive;  // the file the state's tensors are in (null: the rank file;
                                          // the distributed optimizer's distrib_optim.pt)
};

// The rank file's Adam state; nullopt with `note` saying why when it holds none lattice reads (no 'optimizer', the
// distributed optimizer's, another optimizer's). A state that does not fit the model (a count, a shape, a missing
// state) is an error naming the file and the parameter.
std::optional<MegatronRankOptimizer> read_megatron_rank_optimizer(const MegatronRankFile& f, std::string& note);

// Ends the errors of a state that does not fit: how to convert without it.
inline const std::string kNoLoadOptimHint = "; give --no-load-optim to convert the weights alone";

// Why a checkpoint's optimizer state is not brought over when its args name another optimizer than Adam
// (args.optimizer), else "".
std::string megatron_non_adam_note(const PyRef& args);

// fp16's dynamic loss scaler as Megatron saves it ({'scale': tensor [1], 'growth_tracker', 'hysteresis_tracker'});
// nullopt for a constant scaler's ({}). `name` says where it is, in errors.
std::optional<LossScalerState> megatron_grad_scaler(const PyValue& g, const TorchArchive& archive,
                                                     const std::string& name);

}  // namespace lattice
