// A lattice checkpoint written as Megatron-LM's own (--ckpt-format torch) for `lattice convert --to-megatron`:
//
//   DIR/latest_checkpointed_iteration.txt        "release"
//   DIR/release/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt
//
// one torch.save file (checkpoint/torch_archive.h) per rank of the layout asked for, holding {'args':
// argparse.Namespace (the model's flags by Megatron's names, the layout, the tokenizer), 'checkpoint_version':
// 3.0, 'iteration': 0, 'model': the rank's Megatron-Core state dict (fp32), 'num_floating_point_operations_so_far':
// 0}, the inverse of checkpoint/megatron_checkpoint.h (each rank's part as Megatron splits it; a stage's layers
// and an expert-parallel rank's experts numbered from 0; the last stage of a tied model holding the word
// embeddings as output_layer.weight). Megatron loads a "release" checkpoint's weights without an optimizer state
// (as its own converters write them). With Transformer Engine's layer spec the norms are fused into linear_qkv
// and linear_fc1 and each Transformer Engine module has an _extra_state (a pickled None, as without fp8);
// Megatron-Core's own linear layers (the local spec's, the output layer) save theirs as None.
//
// The model must be one the saved args describe exactly: the args are read back as convert --from-megatron reads
// them and the model made from them compared with the checkpoint's, field by field (a feature Megatron's args do
// not carry, such as LongRoPE, is refused naming it). Nothing is written unless the whole layout is valid; each
// file is written through a temporary one, the tracker last.
#pragma once
#include <string>

#include "checkpoint/model_checkpoint.h"

namespace lattice {

struct MegatronExportOptions {
  int tp = 1, pp = 1, ep = 1;     // --target-tensor/pipeline/expert-parallel-size
  bool transformer_engine = true; // --transformer-impl transformer_engine (else local)
};

// Whether Megatron-LM has the tokenizer type (--tokenizer-type); the args name another as NullTokenizer.
bool is_megatron_tokenizer(const std::string& type);

// Writes lm (opened with open_model_checkpoint) under `dir`; returns the release directory.
std::string save_megatron_checkpoint(const std::string& dir, const LoadedModel& lm, const MegatronExportOptions& o);

}  // namespace lattice
