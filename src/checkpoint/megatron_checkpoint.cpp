#include "checkpoint/megatron_checkpoint.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "checkpoint/tensor_parts.h"
#include "checkpoint/torch_archive.h"
#include "checkpoint/torch_dcp.h"
#include "core/error.h"
#include "dist/layout_only_comm.h"
#include "model/gpt_model.h"
#include "pipeline/schedule.h"
#include "train/arguments.h"

namespace fs = std::filesystem;

namespace lattice {

namespace {

// DIR/iter_NNNNNNN (or DIR/release) that DIR's tracker names, or DIR itself when it has none.
std::string resolve_iteration_dir(const std::string& dir) {
  const fs::path tracker = fs::path(dir) / "latest_checkpointed_iteration.txt";
  if (!fs::exists(tracker)) return dir;
  std::ifstream f(tracker);
  std::string text;
  f >> text;
  if (text == "release") return (fs::path(dir) / "release").string();
  if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string::npos)
    LATTICE_FAIL() << tracker.string() << ": holds '" << text << "', not an iteration number or 'release'";
  char name[40];
  std::snprintf(name, sizeof name, "iter_%07lld", std::stoll(text));
  return (fs::path(dir) / name).string();
}

fs::path rank_file(const std::string& iter_dir, int t, int p, int e, bool pipeline, bool expert) {
  return fs::path(iter_dir) / megatron_rank_dir(t, p, e, pipeline, expert) / "model_optim_rng.pt";
}

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
      {"mtp_num_layers", "multi-token prediction"},
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
  if (PyRef etp = get("expert_tensor_parallel_size"); etp && etp->is(PyValue::Kind::integer)) {
    const PyRef tp = get("tensor_model_parallel_size");
    if (tp && etp->integer != tp->integer)
      LATTICE_FAIL() << what << ": saved with --expert-tensor-parallel-size " << etp->integer
                     << " and --tensor-model-parallel-size " << tp->integer
                     << ", whose expert files lattice does not read (equal sizes only)";
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

// A state dict's tensors by their dotted names (nested dicts joined with '.').
void flatten(const PyRef& d, const std::string& prefix, std::map<std::string, PyRef>& out) {
  for (const auto& [k, v] : d->entries) {
    if (!k->is(PyValue::Kind::string)) continue;
    const std::string name = prefix + k->text;
    if (v->is(PyValue::Kind::dict)) flatten(v, name + ".", out);
    else out[name] = v;
  }
}

// The legacy (pre-Megatron-Core) GPT model's state dict (--use-legacy-models, and Megatron-LM before Megatron-Core)
// by Megatron-Core's names: language_model.embedding.* -> embedding.*, language_model.encoder.layers.<l>.
// {input_layernorm, self_attention.query_key_value, self_attention.dense, post_attention_layernorm,
// mlp.dense_h_to_4h, mlp.dense_4h_to_h} -> decoder.layers.<l>.{input_layernorm, self_attention.linear_qkv,
// self_attention.linear_proj, pre_mlp_layernorm, mlp.linear_fc1, mlp.linear_fc2}, its final_layernorm ->
// decoder.final_layernorm, language_model.output_layer -> output_layer, and a last stage's word_embeddings_for_head
// (the tied copy) -> output_layer. The tensors' layouts are the same (checkpoint_version 3.0). A state dict with
// Megatron-Core's names is returned as it is; `legacy` says whether it had the legacy ones.
std::map<std::string, PyRef> from_legacy_names(std::map<std::string, PyRef> tensors, bool& legacy) {
  bool any = false;
  for (const auto& [k, v] : tensors)
    any = any || k.rfind("language_model.", 0) == 0 || k.rfind("word_embeddings_for_head.", 0) == 0;
  if (!any) return tensors;
  legacy = true;
  static const std::pair<const char*, const char*> layer_parts[] = {
      {"self_attention.query_key_value.", "self_attention.linear_qkv."},
      {"self_attention.dense.", "self_attention.linear_proj."},
      {"post_attention_layernorm.", "pre_mlp_layernorm."},
      {"mlp.dense_h_to_4h.", "mlp.linear_fc1."},
      {"mlp.dense_4h_to_h.", "mlp.linear_fc2."}};
  std::map<std::string, PyRef> out;
  for (auto& [k, v] : tensors) {
    std::string name = k;
    auto replace_prefix = [&](const std::string& from, const std::string& to) {
      if (name.rfind(from, 0) != 0) return false;
      name = to + name.substr(from.size());
      return true;
    };
    if (replace_prefix("language_model.encoder.layers.", "decoder.layers.")) {
      const size_t dot = name.find('.', std::strlen("decoder.layers."));
      for (const auto& [from, to] : layer_parts)
        if (name.compare(dot + 1, std::strlen(from), from) == 0) {
          name = name.substr(0, dot + 1) + to + name.substr(dot + 1 + std::strlen(from));
          break;
        }
    } else if (!replace_prefix("language_model.encoder.final_layernorm.", "decoder.final_layernorm.") &&
               !replace_prefix("language_model.embedding.", "embedding.") &&
               !replace_prefix("language_model.output_layer.", "output_layer.")) {
      replace_prefix("word_embeddings_for_head.", "output_layer.");
    }
    if (name.size() >= 9 && name.compare(name.size() - 9, 9, ".inv_freq") == 0) continue;  // rope's buffer
    out[name] = std::move(v);
  }
  return out;
}

// One rank file: its archive and its state dicts' tensors (chunk v's under 'model', or 'model<v>').
struct RankFile {
  std::unique_ptr<TorchArchive> archive;
  std::vector<std::map<std::string, PyRef>> chunks;
  std::set<std::string> used;  // keys a parameter reads
};

// Where one rank's part of a parameter is: its file (RankFile index), state dict and key, and the rank's
// registry (tensor-parallel rank t and expert-parallel rank e at t * EP + e).
struct Source {
  ptrdiff_t file;
  int chunk;
  size_t rank;
  std::string key;
};

// Megatron-Core's names of lattice's parameter `name` (the same, but the norms Transformer Engine fuses).
std::vector<std::string> megatron_names(const std::string& name) {
  std::vector<std::string> names{name};
  // Transformer Engine's grouped experts (--moe-grouped-gemm): mlp.experts.linear_fc1.weight<e> for
  // SequentialMLP's mlp.experts.local_experts.<e>.linear_fc1.weight.
  const std::string experts = ".mlp.experts.local_experts.";
  if (const size_t at = name.find(experts); at != std::string::npos) {
    const size_t dot = name.find('.', at + experts.size());
    const std::string e = name.substr(at + experts.size(), dot - at - experts.size());
    names.push_back(name.substr(0, at) + ".mlp.experts" + name.substr(dot) + e);
  }
  const std::string layers = "decoder.layers.";
  if (name.rfind(layers, 0) == 0) {  // decoder.layers.<l>.<rest>
    const size_t dot = name.find('.', layers.size());
    if (const std::string te = te_fused_norm_name(name.substr(dot + 1)); !te.empty())
      names.push_back(name.substr(0, dot + 1) + te);
  }
  return names;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) t += ", ";
    t += std::to_string(s[i]);
  }
  return t + "]";
}

}  // namespace

std::string megatron_rank_dir(int t, int p, int e, bool pipeline, bool expert) {
  char name[40];
  int n = std::snprintf(name, sizeof name, "mp_rank_%02d", t);
  if (pipeline) n += std::snprintf(name + n, sizeof name - size_t(n), "_%03d", p);
  if (expert) std::snprintf(name + n, sizeof name - size_t(n), "_%03d", e);
  return name;
}

std::string te_fused_norm_name(const std::string& rest) {
  static const std::map<std::string, std::string> fused = {
      {"input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"},
      {"input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias"},
      {"pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"},
      {"pre_mlp_layernorm.bias", "mlp.linear_fc1.layer_norm_bias"}};
  const auto it = fused.find(rest);
  return it == fused.end() ? std::string() : it->second;
}

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

namespace {

// What a checkpoint saves beside the model (a rank file's, or torch_dist's common.pt): the args as the model's
// configuration and train flags, the iteration, the layout, the tokenizer.
MegatronArgs read_saved_state(const TorchArchive& archive, MegatronSource& out) {
  const std::string& what = archive.path();
  const PyRef root = archive.root();
  if (!root->is(PyValue::Kind::dict)) LATTICE_FAIL() << what << ": holds " << root->describe() << ", not a dict";
  const PyRef ns = root->get("args");
  if (!ns || ns->qualified_name() != "argparse.Namespace")
    LATTICE_FAIL() << what << ": no args (argparse.Namespace) saved; not a Megatron training checkpoint";
  const PyRef version = root->get("checkpoint_version");
  const double v = !version ? 0.0 : version->is(PyValue::Kind::floating) ? version->floating : double(version->integer);
  if (v < 3.0)
    LATTICE_FAIL() << what << ": checkpoint_version " << v << " (before 3.0, whose query-key-value layout lattice does "
                   << "not read)";
  if (const PyRef it = root->get("iteration"); it && it->is(PyValue::Kind::integer)) out.iteration = it->integer;
  MegatronArgs parsed = megatron_args(*ns, what);
  const TrainArgs& a = parsed.args;
  out.tp = int(a.tensor_model_parallel_size);
  out.pp = int(a.pipeline_model_parallel_size);
  out.ep = parsed.config.moe() ? int(a.expert_model_parallel_size) : 1;
  out.vp = pipeline_layout_of(a).virtual_stages;
  out.seq_length = a.seq_length;
  auto text = [&](const char* key) {
    const PyRef t = ns->get(key);
    return t && t->is(PyValue::Kind::string) ? t->text : std::string();
  };
  out.tokenizer.type = text("tokenizer_type");
  out.tokenizer.vocab_file = text("vocab_file");
  out.tokenizer.merge_file = text("merge_file");
  out.tokenizer.model = text("tokenizer_model");
  if (const PyRef n = ns->get("vocab_size");
      n && n->is(PyValue::Kind::integer) && out.tokenizer.type == "NullTokenizer")
    out.tokenizer.vocab_size = n->integer;
  return parsed;
}

// Where torch_dist keeps lattice's parameter `name`, in the order tried: a layer's in the tensor every layer's
// <rest> is stacked in, decoder.layers.<rest> [num_layers, ...] at its layer (TransformerBlock's
// sharded_state_dict), else in its own, decoder.layers.<l>.<rest> (the non_homogeneous_layers form); a routed
// expert's, stacked as SequentialMLP's sharded_state_dict stacks them, decoder.layers.mlp.experts.experts.<rest>
// [num_layers, num_experts, ...] at (layer, expert), else decoder.layers.<l>.mlp.experts.experts.<rest>
// [num_experts, ...], else decoder.layers.<l>.mlp.experts.experts.<g>.<rest> (singleton_local_shards); each with
// Transformer Engine's fused norm names where they apply. Anything else: its own name.
template <typename Slice>
std::vector<Slice> torch_dist_forms_of(const std::string& name) {
  const std::string layers = "decoder.layers.", experts = "mlp.experts.local_experts.";
  if (name.rfind(layers, 0) != 0) return {Slice{name, {}}};
  const size_t dot = name.find('.', layers.size());
  const int64_t l = std::stoll(name.substr(layers.size(), dot - layers.size()));
  std::string rest = name.substr(dot + 1);
  const std::string lstr = std::to_string(l) + ".";
  if (rest.rfind(experts, 0) == 0) {
    const size_t end = rest.find('.', experts.size());
    const int64_t g = std::stoll(rest.substr(experts.size(), end - experts.size()));
    const std::string tail = rest.substr(end + 1);
    return {Slice{layers + "mlp.experts.experts." + tail, {l, g}},
            Slice{layers + lstr + "mlp.experts.experts." + tail, {g}},
            Slice{layers + lstr + "mlp.experts.experts." + std::to_string(g) + "." + tail, {}}};
  }
  std::vector<Slice> forms;
  for (const std::string& r : {te_fused_norm_name(rest), rest}) {
    if (r.empty()) continue;
    forms.push_back(Slice{layers + r, {l}});
    forms.push_back(Slice{layers + lstr + r, {}});
  }
  return forms;
}

// Megatron-Core's torch_dist checkpoint (dist_checkpointing's torch_dist backend): common.pt (torch.save of what
// is not sharded: the args) and a torch.distributed.checkpoint (checkpoint/torch_dcp.h) of the sharded state,
// whose model tensors are named as the state dict names them but for the layers: one tensor
// decoder.layers.<rest> [num_layers, ...] for every layer's <rest> (sharded_state_dict prepends the global layer
// number), each rank's part a chunk. The layout that saved it does not matter: every tensor is whole here.
MegatronSource open_torch_dist(MegatronSource out) {
  const std::string& iter = out.iteration_dir;
  const fs::path meta_json = fs::path(iter) / "metadata.json";
  if (fs::exists(meta_json)) {
    std::ifstream f(meta_json);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      LATTICE_FAIL() << meta_json.string() << ": not JSON (" << e.what() << ")";
    }
    const std::string backend = j.value("sharded_backend", std::string());
    if (backend != "torch_dist")
      LATTICE_FAIL() << meta_json.string() << ": sharded_backend '" << backend << "', which lattice does not read "
                     << "(torch_dist only)";
  }
  const fs::path common = fs::path(iter) / "common.pt";
  if (!fs::exists(common))
    LATTICE_FAIL() << "--from-megatron " << iter << ": a torch_dist checkpoint (.metadata) without common.pt, where "
                   << "Megatron saves its args";
  const TorchArchive archive(common.string());
  MegatronArgs parsed = read_saved_state(archive, out);
  const TransformerConfig& c = parsed.config;
  out.torch_dist = true;
  auto dcp = std::make_shared<DcpCheckpoint>(iter);
  for (const auto& [fqn, t] : dcp->tensors())
    if (fqn.find("layer_norm_weight") != std::string::npos) out.transformer_engine = true;

  // Each parameter's tensor and its slice of it; shapes checked.
  struct Slice {
    std::string fqn;
    std::vector<int64_t> lead;  // the leading dims fixed: the layer's (and the routed expert's) index
  };
  auto plan = std::make_shared<std::map<std::string, Slice>>();
  std::set<std::string> used;
  const ParamBuffer whole = GPTModel::parameter_registry(c, TensorParallel{}, ModelPlacement{}, 0, 1);
  for (const ParamInfo& info : whole.infos()) {
    const std::vector<Slice> forms = torch_dist_forms_of<Slice>(info.name);
    const Slice* found = nullptr;
    for (const Slice& f : forms)
      if (!found && dcp->tensors().count(f.fqn)) found = &f;
    if (!found)
      LATTICE_FAIL() << iter << ": no tensor " << forms.front().fqn << " (lattice's " << info.name << ") in .metadata";
    std::vector<int64_t> size = info.shape;
    for (size_t d = found->lead.size(); d-- > 0;)  // the stacked axes: layers [num_layers], experts [num_experts]
      size.insert(size.begin(), d == 0 ? c.num_layers : c.num_experts);
    const std::vector<int64_t>& saved = dcp->tensors().at(found->fqn).size;
    if (saved != size)
      LATTICE_FAIL() << iter << ": tensor " << found->fqn << " has size " << shape_text(saved) << ", expected "
                     << shape_text(size) << " (the model its args describe"
                     << (found->lead.empty()       ? ""
                         : found->lead.size() == 1 ? ", layers first"
                                                   : ", layers then experts first")
                     << ")";
    if (const int64_t held = dcp->covered(found->fqn, found->lead); held != info.numel) {
      std::string at;
      if (!found->lead.empty()) at = " at layer " + std::to_string(found->lead[0]);
      if (found->lead.size() > 1) at += ", expert " + std::to_string(found->lead[1]);
      LATTICE_FAIL() << iter << ": " << found->fqn << at << ": its chunks hold " << held << " of its " << info.numel
                     << " values";
    }
    used.insert(found->fqn);
    (*plan)[info.name] = *found;
  }
  // Nothing of the model left over (the optimizer's state and Transformer Engine's extra state are not the model's).
  for (const auto& [fqn, t] : dcp->tensors()) {
    const bool model =
        fqn.rfind("embedding.", 0) == 0 || fqn.rfind("decoder.", 0) == 0 || fqn.rfind("output_layer.", 0) == 0;
    if (!model || used.count(fqn)) continue;
    if (fqn == "output_layer.weight" && !c.untie_embeddings_and_output_weights) continue;
    LATTICE_FAIL() << iter << ": tensor " << fqn << " is not a parameter of the model its args describe";
  }
  out.source.config = c;
  out.source.fill = [dcp, plan](const ParamInfo& info, float* dst) {
    const auto& slice = plan->at(info.name);
    dcp->read_float(slice.fqn, slice.lead, dst);
  };
  return out;
}

}  // namespace

MegatronSource open_megatron_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) LATTICE_FAIL() << "--from-megatron " << dir << ": no such directory";
  MegatronSource out;
  out.iteration_dir = resolve_iteration_dir(dir);
  const std::string& iter = out.iteration_dir;
  if (!fs::is_directory(iter))
    LATTICE_FAIL() << "--from-megatron " << dir << ": its latest_checkpointed_iteration.txt names " << iter
                   << ", which is missing";
  if (fs::exists(fs::path(iter) / ".metadata")) return open_torch_dist(std::move(out));
  // Rank 0's file names the layout's kinds: mp_rank_00, mp_rank_00_000 (pipeline or expert parallelism),
  // mp_rank_00_000_000 (both); the args say which.
  fs::path first;
  for (const auto& [pipeline, expert] : {std::pair{false, false}, {true, false}, {true, true}})
    if (first.empty() && fs::exists(rank_file(iter, 0, 0, 0, pipeline, expert)))
      first = rank_file(iter, 0, 0, 0, pipeline, expert);
  if (first.empty())
    LATTICE_FAIL() << "--from-megatron " << iter << ": no mp_rank_00/model_optim_rng.pt or mp_rank_00_000/"
                   << "model_optim_rng.pt (not a Megatron checkpoint saved with --ckpt-format torch)";

  // The saved args: the model's flags and the layout, checked as `lattice train` checks them.
  auto archive0 = std::make_unique<TorchArchive>(first.string());
  const std::string what0 = first.string();
  MegatronArgs parsed = read_saved_state(*archive0, out);
  const TrainArgs& a = parsed.args;
  TransformerConfig& c = parsed.config;
  const bool pipeline = out.pp > 1, expert = out.ep > 1;
  if (rank_file(iter, 0, 0, 0, pipeline, expert) != first)
    LATTICE_FAIL() << first.string() << ": the file's name disagrees with args.pipeline_model_parallel_size " << out.pp
                   << " and args.expert_model_parallel_size " << out.ep;
  if (c.padded_vocab_size % out.tp != 0)
    LATTICE_FAIL() << what0 << ": args.padded_vocab_size " << c.padded_vocab_size << " is not divisible by the "
                   << out.tp << " tensor-parallel ranks";
  const PipelineLayout layout = pipeline_layout_of(a);

  // Every rank file, opened (its pickle read, no tensor yet), at (t * pp + p) * ep + e.
  const int T = out.tp, P = out.pp, E = out.ep;
  auto at = [&](int t, int p, int e) { return size_t((t * P + p) * E + e); };
  std::vector<RankFile> files(size_t(T * P * E));
  for (int t = 0; t < T; ++t)
    for (int p = 0; p < P; ++p)
      for (int e = 0; e < E; ++e) {
        const fs::path path = rank_file(iter, t, p, e, pipeline, expert);
        RankFile& rf = files[at(t, p, e)];
        if (t == 0 && p == 0 && e == 0) {
          rf.archive = std::move(archive0);
        } else {
          if (!fs::exists(path))
            LATTICE_FAIL() << "--from-megatron " << iter << ": " << path.string() << " is missing (the args say " << T
                           << " tensor- and " << P << " pipeline-parallel ranks"
                           << (expert ? " and " + std::to_string(E) + " expert-parallel ones" : std::string()) << ")";
          rf.archive = std::make_unique<TorchArchive>(path.string());
        }
        const PyRef r = rf.archive->root();
        for (int ch = 0; ch < out.vp; ++ch) {
          const std::string key = out.vp == 1 ? "model" : "model" + std::to_string(ch);
          const PyRef m = r->is(PyValue::Kind::dict) ? r->get(key) : nullptr;
          if (!m || !m->is(PyValue::Kind::dict))
            LATTICE_FAIL() << path.string() << ": no '" << key << "' state dict (saved with --no-save-optim? "
                           << "--ckpt-format torch saves the model under '" << key << "')";
          std::map<std::string, PyRef> tensors;
          flatten(m, "", tensors);
          tensors = from_legacy_names(std::move(tensors), out.legacy);
          for (auto it = tensors.begin(); it != tensors.end();) {  // Transformer Engine's extra state: no weights
            const std::string& k = it->first;
            const bool extra = k.size() >= 12 && k.compare(k.size() - 12, 12, "_extra_state") == 0;
            if (k.find("layer_norm_weight") != std::string::npos) out.transformer_engine = true;
            if (k.find(".mlp.experts.weight1") != std::string::npos)
              LATTICE_FAIL() << path.string() << ": " << k << " is the legacy GroupedMLP's (--moe-grouped-gemm "
                             << "without Transformer Engine), which lattice does not read";
            it = extra ? tensors.erase(it) : std::next(it);
          }
          rf.chunks.push_back(std::move(tensors));
        }
      }

  // Where each global layer lives: (stage, chunk, its number in that chunk's state dict).
  std::map<int64_t, std::tuple<int, int, int64_t>> layer_home;
  for (int p = 0; p < P; ++p) {
    const auto chunks = stage_layers(layout, p);
    for (size_t ch = 0; ch < chunks.size(); ++ch)
      for (int64_t l = chunks[ch].first; l < chunks[ch].second; ++l) layer_home[l] = {p, int(ch), l - chunks[ch].first};
  }
  // Each tensor- and expert-parallel rank's parameters: its part of every tensor, as Megatron splits them (the
  // experts under their global numbers).
  std::vector<std::unique_ptr<LayoutOnlyComm>> groups;
  auto rank_infos = std::make_shared<std::vector<std::map<std::string, ParamInfo>>>(size_t(T * E));
  for (int t = 0; t < T; ++t) {
    groups.push_back(std::make_unique<LayoutOnlyComm>(t, T));
    for (int e = 0; e < E; ++e) {
      const ParamBuffer reg =
          GPTModel::parameter_registry(c, TensorParallel{groups.back().get(), false}, ModelPlacement{}, e, E);
      for (const ParamInfo& info : reg.infos()) (*rank_infos)[size_t(t * E + e)][info.name] = info;
    }
  }

  // The plan: for every parameter and rank, the file and key holding its part; shapes checked.
  auto plan = std::make_shared<std::map<std::string, std::vector<Source>>>();
  const ParamBuffer whole = GPTModel::parameter_registry(c, TensorParallel{}, ModelPlacement{}, 0, 1);
  const std::string layers_prefix = "decoder.layers.", experts_infix = ".mlp.experts.local_experts.";
  const int64_t experts_per_rank = c.moe() ? c.num_experts / E : 0;
  for (const ParamInfo& info : whole.infos()) {
    int p = 0, ch = 0, e = 0;
    std::string local = info.name;
    if (info.name.rfind(layers_prefix, 0) == 0) {
      const size_t dot = info.name.find('.', layers_prefix.size());
      const int64_t l = std::stoll(info.name.substr(layers_prefix.size(), dot - layers_prefix.size()));
      const auto& [stage, chunk, j] = layer_home.at(l);
      p = stage;
      ch = chunk;
      local = layers_prefix + std::to_string(j) + info.name.substr(dot);
      // A routed expert: expert-parallel rank g / (E / EP)'s local expert g % (E / EP).
      if (const size_t x = local.find(experts_infix); x != std::string::npos) {
        const size_t begin = x + experts_infix.size(), end = local.find('.', begin);
        const int64_t g = std::stoll(local.substr(begin, end - begin));
        e = int(g / experts_per_rank);
        local = local.substr(0, begin) + std::to_string(g % experts_per_rank) + local.substr(end);
      }
    } else if (info.name.rfind("decoder.final_layernorm", 0) == 0 || info.name == "output_layer.weight") {
      p = P - 1;
      ch = out.vp - 1;
    }
    std::vector<Source>& sources = (*plan)[info.name];
    for (int t = 0; t < T; ++t) {
      const size_t rank = size_t(t * E + e);
      const ParamInfo& part = (*rank_infos)[rank].at(info.name);
      if (part.tp_duplicated && t > 0) continue;  // every rank holds it whole: rank 0's
      RankFile& rf = files[at(t, p, e)];
      const std::map<std::string, PyRef>& tensors = rf.chunks[size_t(ch)];
      const std::string& path = rf.archive->path();
      std::string found;
      for (const std::string& name : megatron_names(local))
        if (tensors.count(name)) found = name;
      if (found.empty())
        LATTICE_FAIL() << path << ": no tensor " << local << (out.vp > 1 ? " in model" + std::to_string(ch) : "")
                       << " (lattice's " << info.name << ")";
      const TorchTensor* tensor = TorchArchive::tensor(tensors.at(found));
      if (!tensor)
        LATTICE_FAIL() << path << ": " << found << " is " << tensors.at(found)->describe() << ", not a tensor";
      if (tensor->shape != part.shape)
        LATTICE_FAIL() << path << ": tensor " << found << " has shape " << shape_text(tensor->shape) << ", expected "
                       << shape_text(part.shape) << " (tensor-parallel rank " << t << " of " << T
                       << " of the model its args describe)";
      rf.used.insert(found);
      sources.push_back({&files[at(t, p, e)] - files.data(), ch, rank, found});
    }
  }
  // Nothing left over (the last stage's copy of a tied word embedding is the first stage's; a tensor every
  // tensor- or expert-parallel rank of a stage holds is read from one of them).
  for (int p = 0; p < P; ++p) {
    std::set<std::string> stage_used;
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) stage_used.insert(files[at(t, p, e)].used.begin(), files[at(t, p, e)].used.end());
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e)
        for (const auto& chunk : files[at(t, p, e)].chunks)
          for (const auto& [key, value] : chunk) {
            if (stage_used.count(key)) continue;
            if (key == "output_layer.weight" && !c.untie_embeddings_and_output_weights) continue;
            LATTICE_FAIL() << files[at(t, p, e)].archive->path() << ": tensor " << key
                           << " is not a parameter of the model its args describe";
          }
  }

  out.source.config = c;
  auto shared_files = std::make_shared<std::vector<RankFile>>(std::move(files));
  out.source.fill = [shared_files, rank_infos, plan, E](const ParamInfo& info, float* dst) {
    for (const Source& s : plan->at(info.name)) {
      const RankFile& rf = (*shared_files)[s.file];
      const TorchTensor& tensor = *TorchArchive::tensor(rf.chunks[size_t(s.chunk)].at(s.key));
      ParamInfo part = (*rank_infos)[s.rank].at(info.name);
      if (part.shape == info.shape) {  // the rank holds it whole (one rank, or a copy on every rank): read in place
        rf.archive->read_float(tensor, s.key, dst);
        continue;
      }
      std::vector<float> local(size_t(part.numel));
      rf.archive->read_float(tensor, s.key, local.data());
      part.offset = 0;
      // The part's boxes in the whole tensor (a blocked tensor, SwiGLU's fc1, has one per block).
      const int tp_rank = int(s.rank) / E;
      for (const TensorPart& box : param_parts({part}, local.data(), part.tp_duplicated ? 0 : tp_rank)) {
        LATTICE_CHECK(box.global_shape == info.shape)
            << info.name << ": filled for another shape than the checkpoint's";
        place_part(box, dst);
      }
    }
  };
  return out;
}

}  // namespace lattice
