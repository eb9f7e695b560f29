// The trainer's mixed-precision objects from the flags: the linear layers' GEMM policy
// (--bf16, --fp16, --fp8-format; none for fp32) and fp16's loss scaler (--loss-scale
// constant, else dynamic from --initial-loss-scale, --min-loss-scale,
// --loss-scale-window, --hysteresis).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"
#include "optim/param_buffer.h"
#include "train/arguments.h"

namespace lattice {

class Comm;

// tp, dp: the tensor- and data-parallel groups (fp8 reduces each step's amaxes over them). Null without mixed precision.
std::unique_ptr<MixedPrecisionPolicy> make_precision_policy(const TrainArgs& args, Comm* tp, Comm* dp,
                                                            const Fp8Params& fp8_params = {});

// By parameter index, the weights whose GEMMs stay out of fp8 (Fp8Params::unquantized): the output
// layer's (Megatron's output layer is no fp8 layer; with tied embeddings the word embedding, which
// no other GEMM reads), and with --first-last-layers-bf16 those of the first
// --num-layers-at-start-in-bf16 and last --num-layers-at-end-in-bf16 decoder layers (global numbers).
std::vector<bool> fp8_unquantized_weights(const std::vector<ParamInfo>& params, const TrainArgs& args);

// The core attention's math on a GPU: bf16 with --bf16 or --fp8-format, fp16 with
// --fp16, else fp32.
AttentionMath attention_math(const TrainArgs& args);

// Null unless --fp16.
std::unique_ptr<LossScaler> make_loss_scaler(const TrainArgs& args);

// One line for the log: "> precision: fp32", "> precision: bf16; GEMMs: oneDNN bf16 matmul (AMX-BF16); ...".
std::string describe_precision(const TrainArgs& args, const LossScaler* scaler);

// Test hook: LATTICE_TEST_INJECT_INF_ITERS="3,4" (0-based iterations) makes those steps'
// gradients overflow (StepConfig::inject_inf_iterations). Empty when unset.
std::vector<int64_t> test_inject_inf_iterations();

}  // namespace lattice
