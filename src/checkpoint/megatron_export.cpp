#include "checkpoint/megatron_export.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "checkpoint/durable_fs.h"
#include "checkpoint/megatron_checkpoint.h"
#include "checkpoint/tensor_parts.h"
#include "checkpoint/torch_archive.h"
#include "checkpoint/torch_pickle.h"
#include "core/error.h"
#include "dist/layout_only_comm.h"
#include "pipeline/schedule.h"

namespace fs = std::filesystem;

namespace lattice {

namespace {

// An args value: None, a bool, an int, a float, a string or a list of ints.
struct ArgValue {
  enum class Kind { none, boolean, integer, floating, string, ints } kind = Kind::none;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> list;
};
ArgValue arg_none() { return {}; }
ArgValue arg_bool(bool v) { return {ArgValue::Kind::boolean, v, 0, 0, "", {}}; }
ArgValue arg_int(int64_t v) { return {ArgValue::Kind::integer, false, v, 0, "", {}}; }
ArgValue arg_float(double v) { return {ArgValue::Kind::floating, false, 0, v, "", {}}; }
ArgValue arg_str(std::string v) { return {ArgValue::Kind::string, false, 0, 0, std::move(v), {}}; }
ArgValue arg_ints(const std::vector<int>& v) { return {ArgValue::Kind::ints, false, 0, 0, "", {v.begin(), v.end()}}; }
ArgValue arg_int_or_none(int64_t v) { return v > 0 ? arg_int(v) : arg_none(); }

}  // namespace

bool is_megatron_tokenizer(const std::string& type) {
  static const std::set<std::string> types = {"BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
                                              "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
                                              "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
                                              "NullTokenizer"};
  return types.count(type) != 0;
}

namespace {

// Megatron's args for the model c under the layout o (their names are Megatron's arguments'). A tokenizer
// Megatron does not have is written as its NullTokenizer of the model's vocabulary (ids 0..V-2, eod V-1).
std::vector<std::pair<std::string, ArgValue>> megatron_args_of(const LoadedModel& lm, const TransformerConfig& c,
                                                               const MegatronExportOptions& o) {
  const bool learned = c.position_embedding_type == "learned_absolute";
  const bool null_tokenizer = !is_megatron_tokenizer(lm.tokenizer.type) || lm.tokenizer.type == "NullTokenizer";
  std::vector<std::pair<std::string, ArgValue>> a = {
      {"num_layers", arg_int(c.num_layers)},
      {"hidden_size", arg_int(c.hidden_size)},
      {"ffn_hidden_size", arg_int(c.ffn_hidden_size)},
      {"num_attention_heads", arg_int(c.num_attention_heads)},
      {"kv_channels", arg_int(c.kv_channels)},
      {"group_query_attention", arg_bool(c.num_query_groups != c.num_attention_heads)},
      {"num_query_groups", arg_int(c.num_query_groups)},
      {"max_position_embeddings", arg_int(c.max_position_embeddings)},
      {"seq_length", arg_int(lm.seq_length > 0 ? lm.seq_length : c.max_position_embeddings)},
      {"position_embedding_type", arg_str(c.position_embedding_type)},
      {"add_position_embedding", arg_bool(learned)},
      {"use_rotary_position_embeddings", arg_bool(c.rope())},
      {"rotary_percent", arg_float(c.rotary_percent)},
      {"rotary_base", arg_int(int64_t(c.rotary_base))},
      {"rotary_interleaved", arg_bool(c.rotary_interleaved)},
      {"rotary_seq_len_interpolation_factor",
       c.rotary_seq_len_interpolation_factor > 0 ? arg_float(c.rotary_seq_len_interpolation_factor) : arg_none()},
      {"use_rope_scaling", arg_bool(c.use_rope_scaling)},
      {"rope_scaling_factor", arg_float(c.rope_scaling_factor)},
      {"no_rope_freq", c.no_rope_pattern.empty() ? arg_none() : arg_ints(c.no_rope_pattern)},
      {"normalization", arg_str(c.normalization)},
      {"norm_epsilon", arg_float(c.layernorm_epsilon)},
      {"apply_layernorm_1p", arg_bool(c.apply_layernorm_1p)},
      {"swiglu", arg_bool(c.swiglu)},
      {"squared_relu", arg_bool(c.gelu == GeluKind::squared_relu)},
      {"openai_gelu", arg_bool(c.gelu == GeluKind::tanh)},
      {"quick_geglu", arg_bool(c.quick_geglu)},
      {"untie_embeddings_and_output_weights", arg_bool(c.untie_embeddings_and_output_weights)},
      {"add_bias_linear", arg_bool(c.add_bias_linear)},
      {"add_qkv_bias", arg_bool(c.add_qkv_bias)},
      {"qk_layernorm", arg_bool(c.qk_layernorm)},
      {"attention_output_gate", arg_bool(c.attention_output_gate)},
      {"softmax_type", arg_str(c.softmax_type)},
      {"num_experts", arg_int_or_none(c.num_experts)},
      {"padded_vocab_size", arg_int(c.padded_vocab_size)},
      {"make_vocab_size_divisible_by", arg_int(c.make_vocab_size_divisible_by)},
      {"tokenizer_type", arg_str(null_tokenizer ? "NullTokenizer" : lm.tokenizer.type)},
      {"vocab_size", null_tokenizer ? arg_int(lm.tokenizer.type == "NullTokenizer" && lm.tokenizer.vocab_size > 0
                                                  ? lm.tokenizer.vocab_size
                                                  : c.vocab_size - 1)
                                    : arg_none()},  // NullTokenizer adds the eod
      {"vocab_file", null_tokenizer || lm.tokenizer.vocab_file.empty() ? arg_none() : arg_str(lm.tokenizer.vocab_file)},
      {"merge_file", null_tokenizer || lm.tokenizer.merge_file.empty() ? arg_none() : arg_str(lm.tokenizer.merge_file)},
      {"tokenizer_model", null_tokenizer || lm.tokenizer.model.empty() ? arg_none() : arg_str(lm.tokenizer.model)},
      {"tensor_model_parallel_size", arg_int(o.tp)},
      {"pipeline_model_parallel_size", arg_int(o.pp)},
      {"virtual_pipeline_model_parallel_size", arg_none()},
      {"num_layers_per_virtual_pipeline_stage", arg_none()},
      {"expert_model_parallel_size", arg_int(o.ep)},
      {"expert_tensor_parallel_size", arg_int(o.tp)},
      {"transformer_impl", arg_str(o.transformer_engine ? "transformer_engine" : "local")},
      {"use_legacy_models", arg_bool(false)},
      {"ckpt_format", arg_str("torch")},
      {"iteration", arg_int(0)},
      {"consumed_train_samples", arg_int(0)},
      {"consumed_valid_samples", arg_int(0)},
  };
  if (c.window_size >= 0) {
    a.emplace_back("window_size", arg_ints({int(c.window_size), 0}));
    if (!c.window_attn_pattern.empty()) a.emplace_back("window_attn_skip_freq", arg_ints(c.window_attn_pattern));
  }
  if (c.moe()) {
    a.insert(a.end(), {{"moe_router_topk", arg_int(c.moe_router_topk)},
                       {"moe_ffn_hidden_size", arg_int(c.moe_ffn_hidden_size)},
                       {"moe_layer_freq", c.moe_layer_pattern.empty() ? arg_int(1) : arg_ints(c.moe_layer_pattern)},
                       {"moe_shared_expert_intermediate_size", arg_int_or_none(c.moe_shared_expert_intermediate_size)},
                       {"moe_shared_expert_gate", arg_bool(c.moe_shared_expert_gate)},
                       {"moe_router_pre_softmax", arg_bool(c.moe_router_pre_softmax)},
                       {"moe_apply_probs_on_input", arg_bool(c.moe_apply_probs_on_input)},
                       {"moe_router_score_function", arg_str(c.moe_router_score_function)},
                       {"moe_router_enable_expert_bias", arg_bool(c.moe_router_enable_expert_bias)},
                       {"moe_router_num_groups", arg_int_or_none(c.moe_router_num_groups)},
                       {"moe_router_group_topk", arg_int_or_none(c.moe_router_group_topk)},
                       {"moe_router_topk_scaling_factor", c.moe_router_topk_scaling_factor != 1.0f
                                                              ? arg_float(c.moe_router_topk_scaling_factor)
                                                              : arg_none()},
                       {"moe_grouped_gemm", arg_bool(false)}});
  }
  return a;
}

// argparse.Namespace(**args) as pickle pushes it: cls () NEWOBJ {args} BUILD.
void pickle_namespace(PickleWriter& w, const std::vector<std::pair<std::string, ArgValue>>& args) {
  w.global("argparse", "Namespace").empty_tuple().newobj().empty_dict().mark();
  for (const auto& [name, v] : args) {
    w.string(name);
    switch (v.kind) {
      case ArgValue::Kind::none: w.none(); break;
      case ArgValue::Kind::boolean: w.boolean(v.b); break;
      case ArgValue::Kind::integer: w.integer(v.i); break;
      case ArgValue::Kind::floating: w.floating(v.f); break;
      case ArgValue::Kind::string: w.string(v.s); break;
      case ArgValue::Kind::ints:
        w.empty_list().mark();
        for (int64_t x : v.list) w.integer(x);
        w.append_items();
        break;
    }
  }
  w.set_items().build();
}

// Megatron-Core's name, in rank (t, p, e)'s file, of lattice's parameter `name` (global layer and expert numbers).
std::string megatron_name(const std::string& name, const std::vector<std::pair<int64_t, int64_t>>& chunks,
                          int64_t first_expert, bool te) {
  const std::string layers = "decoder.layers.";
  if (name.rfind(layers, 0) != 0) return name;
  const size_t dot = name.find('.', layers.size());
  const int64_t l = std::stoll(name.substr(layers.size(), dot - layers.size()));
  std::string rest = name.substr(dot + 1);
  if (te)
    if (const std::string fused = te_fused_norm_name(rest); !fused.empty()) rest = fused;
  const std::string experts = "mlp.experts.local_experts.";
  if (rest.rfind(experts, 0) == 0) {
    const size_t end = rest.find('.', experts.size());
    const int64_t g = std::stoll(rest.substr(experts.size(), end - experts.size()));
    rest = experts + std::to_string(g - first_expert) + rest.substr(end);
  }
  return layers + std::to_string(l - chunks.front().first) + "." + rest;
}

// The layers' modules in this file that save an _extra_state, by the names of their parameters: the linear
// layers (Transformer Engine's, or Megatron-Core's ColumnParallelLinear and RowParallelLinear, which keep its
// state dict's shape) and, with Transformer Engine's spec, its core attention.
std::set<std::string> extra_state_modules(const std::vector<std::string>& names, bool te) {
  std::set<std::string> out;
  for (const std::string& n : names) {
    if (n.rfind("decoder.layers.", 0) != 0) continue;
    for (const std::string module :
         {"self_attention.linear_qkv.", "self_attention.linear_proj.", "linear_fc1.", "linear_fc2."})
      if (const size_t at = n.find(module); at != std::string::npos) out.insert(n.substr(0, at + module.size() - 1));
    if (const size_t at = n.find("self_attention.linear_qkv."); te && at != std::string::npos)
      out.insert(n.substr(0, at) + "self_attention.core_attention");
  }
  return out;
}

// Rank (t, p, e)'s model_optim_rng.pt under `staged` (its stage's layer chunks `chunks`): the checkpoint's dict
// with the rank's state dict, each tensor read when the zip writer reaches it (one parameter in memory at a time,
// the pages read given back).
void write_rank_file(const fs::path& staged, const LoadedModel& lm, const TransformerConfig& c,
                     const MegatronExportOptions& o, const std::vector<std::pair<std::string, ArgValue>>& args,
                     const std::vector<std::pair<int64_t, int64_t>>& chunks, int t, int p, int e) {
  LayoutOnlyComm group(t, o.tp);
  const ModelPlacement place{chunks, p == 0, p == o.pp - 1, 1};
  const ParamBuffer reg = GPTModel::parameter_registry(c, TensorParallel{&group, false}, place, e, o.ep);
  const int64_t first_expert = c.moe() ? e * (c.num_experts / o.ep) : 0;
  TorchSaveWriter files;
  PickleWriter w;
  w.empty_dict().mark();
  w.string("args");
  pickle_namespace(w, args);
  w.string("checkpoint_version").floating(3.0).string("iteration").integer(0);
  w.string("num_floating_point_operations_so_far").integer(0);
  w.string("model").empty_dict().mark();
  std::vector<std::string> names;
  for (const ParamInfo& info : reg.infos()) {
    auto produce = [&lm, info] {
      std::vector<uint8_t> bytes(size_t(info.numel) * sizeof(float));
      read_param_part(*lm.reader, info.name, info, reinterpret_cast<float*>(bytes.data()));
      lm.reader->release(info.name);
      return bytes;
    };
    const std::string name = info.shared_embedding_copy
                                 ? "output_layer.weight"
                                 : megatron_name(info.name, chunks, first_expert, o.transformer_engine);
    names.push_back(name);
    w.string(name);
    TorchSaveWriter::pickle_tensor(w, files.add_storage(uint64_t(info.numel) * sizeof(float), produce),
                                   "FloatStorage", info.numel, info.shape);
  }
  // The extra state: a Transformer Engine module's pickle.dumps(None) as a uint8 tensor (what it saves without
  // fp8), Megatron-Core's own linear layers' None, the output layer's (Megatron-Core's) None.
  const std::vector<uint8_t> none = {0x80, 0x02, 'N', '.'};
  for (const std::string& module : extra_state_modules(names, o.transformer_engine)) {
    w.string(module + "._extra_state");
    if (o.transformer_engine)
      TorchSaveWriter::pickle_tensor(w, files.add_storage(none), "ByteStorage", int64_t(none.size()),
                                     {int64_t(none.size())});
    else
      w.none();
  }
  if (p == o.pp - 1) w.string("output_layer._extra_state").none();
  w.set_items();  // the model's entries
  w.set_items();  // the checkpoint's
  const fs::path rank_dir = staged / megatron_rank_dir(t, p, e, o.pp > 1, o.ep > 1);
  fs::create_directories(rank_dir);
  files.write((rank_dir / "model_optim_rng.pt").string(), "model_optim_rng", w.finish());
  fsync_dir(rank_dir.string());
}

}  // namespace

std::string save_megatron_checkpoint(const std::string& dir, const LoadedModel& lm, const MegatronExportOptions& o) {
  if (o.tp < 1 || o.pp < 1 || o.ep < 1) LATTICE_FAIL() << "--to-megatron: the target parallel sizes must be >= 1";
  if (fs::exists(fs::path(dir) / "latest_checkpointed_iteration.txt"))
    LATTICE_FAIL() << "--to-megatron " << dir << " already holds a checkpoint; choose a new directory";
  // The model under the target layout: the vocabulary padded as Megatron pads it for o.tp ranks, by the
  // --make-vocab-size-divisible-by the checkpoint was trained (or converted) with.
  TransformerConfig c = lm.config;
  const nlohmann::json& saved = lm.reader->state().args;
  if (saved.contains("make-vocab-size-divisible-by") && saved["make-vocab-size-divisible-by"].is_number_integer())
    c.make_vocab_size_divisible_by = saved["make-vocab-size-divisible-by"].get<int64_t>();
  c.padded_vocab_size = pad_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by, o.tp);
  if (o.ep > 1 && (!c.moe() || c.num_experts % o.ep != 0))
    LATTICE_FAIL() << "--target-expert-parallel-size " << o.ep << " must divide the model's "
                   << (c.moe() ? std::to_string(c.num_experts) : std::string("0")) << " experts";
  const auto args = megatron_args_of(lm, c, o);
  // The args read back as --from-megatron reads them must make this very model (and the layout must be valid).
  {
    PickleWriter w;
    pickle_namespace(w, args);
    const std::string bytes = w.finish();
    const PyRef ns = unpickle(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "--to-megatron's args");
    TransformerConfig back;
    try {
      back = megatron_args(*ns, "--to-megatron").config;
      back.vocab_size = c.vocab_size;  // the args carry the padded rows; the tokenizer says the vocabulary
      check_model_config(model_config_json(c), back, "the model Megatron's args describe");
    } catch (const Error& e) {
      LATTICE_FAIL() << "--to-megatron: the checkpoint's model cannot be written as Megatron-LM's (" << e.what() << ")";
    }
  }
  const PipelineLayout layout = make_pipeline_layout(c.num_layers, o.pp, 0, 0, 0);
  // Written into DIR/release.tmp, published as DIR/release whole, then the tracker (durable_fs.h): a crash
  // leaves no checkpoint Megatron would load half-written.
  const fs::path release = fs::path(dir) / "release", staged = fs::path(dir) / "release.tmp";
  if (fs::exists(release)) LATTICE_FAIL() << "--to-megatron " << dir << ": " << release.string() << " already exists";
  fs::remove_all(staged);  // an earlier run's, cut short
  fs::create_directories(staged);
  try {
    for (int t = 0; t < o.tp; ++t)
      for (int p = 0; p < o.pp; ++p)
        for (int e = 0; e < o.ep; ++e) write_rank_file(staged, lm, c, o, args, stage_layers(layout, p), t, p, e);
  } catch (...) {  // nothing of a failed run is left behind
    std::error_code ec;
    fs::remove_all(staged, ec);
    throw;
  }
  publish_dir(staged.string(), release.string());
  write_file_atomic((fs::path(dir) / "latest_checkpointed_iteration.txt").string(), "release");
  return release.string();
}

}  // namespace lattice
