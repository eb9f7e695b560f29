// The saved args of a Megatron-LM checkpoint (an argparse.Namespace) as lattice's train flags.
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint/megatron_checkpoint.h"
#include "core/error.h"
#include "train/arguments.h"

namespace lattice {

namespace {

std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A Python list or tuple of integers as Megatron's list flags take it ("[1,0,1]").
std::string list_text(const PyValue& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.items.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v.items[i]->integer);
  }
  return s + "]";
}

// The saved args (argparse.Namespace) as lattice's train flags: the model's shape and the layout that
// saved it. Features lattice cannot read from this format are refused by name.
std::vector<std::string> model_flags(const PyValue& ns, const std::string& what) {
  auto get = [&](const char* key) -> PyRef {
    PyRef v = ns.get(key);
    return v && !v->is(PyValue::Kind::none) ? v : nullptr;
  };
  auto on = [&](const char* key) {
    PyRef v = get(key);
    return v && ((v->is(PyValue::Kind::boolean) && v->boolean) || (v->is(PyValue::Kind::integer) && v->integer != 0));
  };
  const std::pair<const char*, const char*> refused[] = {
      {"moe_latent_size", "latent mixture-of-experts"},
      {"multi_latent_attention", "multi-latent attention"},
      {"hybrid_override_pattern", "a hybrid (Mamba) model"},
      {"experimental_attention_variant", "linear attention layers"},
      {"apply_residual_connection_post_layernorm", "--apply-residual-connection-post-layernorm"},
      {"heterogeneous_layers_config_path", "heterogeneous layers"},
      {"pipeline_model_parallel_layout", "--pipeline-model-parallel-layout"}};
  for (const auto& [key, feature] : refused) {
    PyRef v = get(key);
    const bool set = v && !(v->is(PyValue::Kind::boolean) && !v->boolean) &&
                     !(v->is(PyValue::Kind::integer) && v->integer == 0) &&
                     !(v->is(PyValue::Kind::string) && v->text.empty());
    if (set) LATTICE_FAIL() << what << ": the checkpoint's model has " << feature << " (args." << key << " = "
                            << v->describe() << "), which lattice does not read from Megatron checkpoints yet";
  }
  std::vector<std::string> flags;
  auto value = [&](const char* key, const char* flag) {
    PyRef v = get(key);
    if (!v) return;
    if (v->is(PyValue::Kind::integer)) flags.insert(flags.end(), {flag, std::to_string(v->integer)});
    else if (v->is(PyValue::Kind::floating)) flags.insert(flags.end(), {flag, number_text(v->floating)});
    else if (v->is(PyValue::Kind::string)) flags.insert(flags.end(), {flag, v->text});
    else LATTICE_FAIL() << what << ": args." << key << " is " << v->describe() << ", not a number or a string";
  };
  auto list = [&](const char* key, const char* flag) {  // an integer (a frequency) or a per-layer list
    PyRef v = get(key);
    if (!v) return;
    if (v->is(PyValue::Kind::list) || v->is(PyValue::Kind::tuple)) flags.insert(flags.end(), {flag, list_text(*v)});
    else value(key, flag);
  };
  auto flag = [&](const char* key, const char* name) {
    if (on(key)) flags.push_back(name);
  };
  value("num_layers", "--num-layers");
  value("hidden_size", "--hidden-size");
  value("ffn_hidden_size", "--ffn-hidden-size");
  value("num_attention_heads", "--num-attention-heads");
  value("kv_channels", "--kv-channels");
  if (on("group_query_attention")) {
    flags.push_back("--group-query-attention");
    value("num_query_groups", "--num-query-groups");
  }
  value("max_position_embeddings", "--max-position-embeddings");
  value("seq_length", "--seq-length");
  value("position_embedding_type", "--position-embedding-type");
  // Megatron-LM before --position-embedding-type: --use-rotary-position-embeddings.
  if (!get("position_embedding_type") && on("use_rotary_position_embeddings"))
    flags.insert(flags.end(), {"--position-embedding-type", "rope"});
  value("rotary_percent", "--rotary-percent");
  value("rotary_base", "--rotary-base");
  flag("rotary_interleaved", "--rotary-interleaved");
  value("rotary_seq_len_interpolation_factor", "--rotary-seq-len-interpolation-factor");
  if (on("use_rope_scaling")) {
    flags.push_back("--use-rope-scaling");
    value("rope_scaling_factor", "--rope-scaling-factor");
  }
  list("no_rope_freq", "--no-rope-freq");
  value("normalization", "--normalization");
  value("norm_epsilon", "--norm-epsilon");
  if (!get("norm_epsilon")) value("layernorm_epsilon", "--norm-epsilon");  // its name before --norm-epsilon
  flag("apply_layernorm_1p", "--apply-layernorm-1p");
  flag("swiglu", "--swiglu");
  flag("squared_relu", "--squared-relu");
  flag("openai_gelu", "--openai-gelu");
  flag("quick_geglu", "--quick-geglu");
  flag("untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights");
  if (PyRef bias = get("add_bias_linear"); bias && bias->is(PyValue::Kind::boolean) && !bias->boolean)
    flags.push_back("--disable-bias-linear");
  flag("add_qkv_bias", "--add-qkv-bias");
  flag("qk_layernorm", "--qk-layernorm");
  flag("attention_output_gate", "--attention-output-gate");
  if (PyRef st = get("softmax_type"); st && st->is(PyValue::Kind::string)) value("softmax_type", "--softmax-type");
  if (PyRef w = get("window_size"); w && (w->is(PyValue::Kind::tuple) || w->is(PyValue::Kind::list)) &&
                                    w->items.size() == 2) {
    flags.insert(flags.end(), {"--window-size", std::to_string(w->items[0]->integer) + "," +
                                                    std::to_string(w->items[1]->integer)});
    list("window_attn_skip_freq", "--window-attn-skip-freq");
  }
  if (PyRef experts = get("num_experts"); experts && experts->integer > 0) {
    value("num_experts", "--num-experts");
    value("moe_router_topk", "--moe-router-topk");
    value("moe_ffn_hidden_size", "--moe-ffn-hidden-size");
    list("moe_layer_freq", "--moe-layer-freq");
    if (PyRef shared = get("moe_shared_expert_intermediate_size"); shared && shared->integer > 0)
      value("moe_shared_expert_intermediate_size", "--moe-shared-expert-intermediate-size");
    flag("moe_shared_expert_gate", "--moe-shared-expert-gate");
    flag("moe_router_pre_softmax", "--moe-router-pre-softmax");
    flag("moe_apply_probs_on_input", "--moe-apply-probs-on-input");
    value("moe_router_score_function", "--moe-router-score-function");
    flag("moe_router_enable_expert_bias", "--moe-router-enable-expert-bias");
    if (PyRef groups = get("moe_router_num_groups"); groups && groups->integer > 0) {
      value("moe_router_num_groups", "--moe-router-num-groups");
      value("moe_router_group_topk", "--moe-router-group-topk");
    }
    value("moe_router_topk_scaling_factor", "--moe-router-topk-scaling-factor");
    value("expert_model_parallel_size", "--expert-model-parallel-size");
  }
  if (PyRef depths = get("mtp_num_layers"); depths && depths->is(PyValue::Kind::integer) && depths->integer > 0) {
    value("mtp_num_layers", "--mtp-num-layers");
    value("mtp_loss_scaling_factor", "--mtp-loss-scaling-factor");
  }
  value("make_vocab_size_divisible_by", "--make-vocab-size-divisible-by");
  value("tensor_model_parallel_size", "--tensor-model-parallel-size");
  value("pipeline_model_parallel_size", "--pipeline-model-parallel-size");
  value("num_layers_per_virtual_pipeline_stage", "--num-layers-per-virtual-pipeline-stage");
  if (!get("num_layers_per_virtual_pipeline_stage"))
    value("num_virtual_stages_per_pipeline_rank", "--num-virtual-stages-per-pipeline-rank");
  value("decoder_first_pipeline_num_layers", "--decoder-first-pipeline-num-layers");
  value("decoder_last_pipeline_num_layers", "--decoder-last-pipeline-num-layers");
  flag("account_for_embedding_in_pipeline_split", "--account-for-embedding-in-pipeline-split");
  flag("account_for_loss_in_pipeline_split", "--account-for-loss-in-pipeline-split");
  return flags;
}

}  // namespace

MegatronArgs megatron_args(const PyValue& ns, const std::string& what) {
  std::vector<std::string> flags = model_flags(ns, what);
  const PyRef padded = ns.get("padded_vocab_size");
  if (!padded || !padded->is(PyValue::Kind::integer) || padded->integer <= 0)
    LATTICE_FAIL() << what << ": args.padded_vocab_size is " << (padded ? padded->describe() : "missing");
  flags.insert(flags.end(), {"--vocab-size", std::to_string(padded->integer)});
  // What the flags' validation requires of a training run, not the model's.
  flags.insert(flags.end(), {"--micro-batch-size", "1", "--train-iters", "1", "--mock-data"});
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  MegatronArgs out;
  try {
    out.args = parse_train_args(int(argv.size()), argv.data(), 0);
  } catch (const Error& e) {
    LATTICE_FAIL() << what << ": the saved args, as lattice's flags, are refused: " << e.what();
  }
  out.config = out.args.transformer_config();
  out.config.padded_vocab_size = padded->integer;
  out.config.finalize(1);
  return out;
}

}  // namespace lattice
