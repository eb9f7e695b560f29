#include "checkpoint/megatron_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "checkpoint/megatron_torch_dist.h"
#include "checkpoint/megatron_distrib_optimizer.h"
#include "checkpoint/megatron_torch_optimizer.h"
#include "checkpoint/tensor_parts.h"
#include "checkpoint/torch_archive.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/layout_only_comm.h"
#include "kernels/cast_math.h"
#include "model/gpt_model.h"
#include "optim/opt_param_scheduler.h"
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

// A state dict's entries by their dotted names (nested dicts joined with '.'), in its order.
using Entries = std::vector<std::pair<std::string, PyRef>>;
void flatten(const PyRef& d, const std::string& prefix, Entries& out) {
  for (const auto& [k, v] : d->entries) {
    if (!k->is(PyValue::Kind::string)) continue;
    const std::string name = prefix + k->text;
    if (v->is(PyValue::Kind::dict)) flatten(v, name + ".", out);
    else out.emplace_back(name, v);
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
Entries from_legacy_names(Entries tensors, bool& legacy) {
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
  Entries out;
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
    out.emplace_back(name, std::move(v));
  }
  return out;
}

using RankFile = MegatronRankFile;

}  // namespace

void check_main_rounds_to_model(const float* main, const float* model, size_t n, const std::string& dtype,
                                const std::string& where, const std::string& key, const std::string& why) {
  for (size_t i = 0; i < n; ++i) {
    const float r = dtype == "bfloat16" ? math::round_bf16(main[i])
                    : dtype == "float16" ? math::fp16_to_fp32(math::fp32_to_fp16(main[i]))
                                         : main[i];
    if (r != model[i] && !(std::isnan(r) && std::isnan(model[i])))
      LATTICE_FAIL() << where << ": the fp32 main parameter read for " << key << " is " << main[i] << " at element "
                     << i << ", which does not round to the model's " << model[i] << " (" << why << ")"
                     << kNoLoadOptimHint;
  }
}

namespace {

// The fp32 main parameter `main` read for the rank file's model tensor `key` must round to its values: a check that
// the optimizer's numbering (or the distributed optimizer's buffer layout) was read right.
void check_main_params(const TorchArchive& archive, const PyRef& model, const std::string& key, const float* main) {
  const TorchTensor& t = *TorchArchive::tensor(model);
  std::vector<float> m(size_t(t.numel()));
  archive.read_float(t, key, m.data());
  check_main_rounds_to_model(main, m.data(), m.size(), t.dtype, archive.path(), key,
                             "the optimizer's state is not where lattice reads it: the state dict's order against "
                             "the param groups, or the distributed optimizer's buffer layout");
}

// Where one rank's part of a parameter is: its file (RankFile index), state dict and key, and the rank's
// registry (tensor-parallel rank t and expert-parallel rank e at t * EP + e).
struct Source {
  ptrdiff_t file;
  int chunk;
  size_t rank;
  std::string key;
};

// Megatron-Core's names of lattice's parameter `name` (the same, but the norms Transformer Engine fuses, and a
// prediction depth's layer under its newer name).
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
  // A layer's: decoder.layers.<l>.<rest>, or a prediction depth's mtp.layers.<k>.transformer_layer.<rest> (newer
  // Megatron-Core's state dict names it mtp_model_layer).
  if (const auto [prefix, rest] = split_layer_name(name); !prefix.empty()) {
    if (const std::string te = te_fused_norm_name(rest); !te.empty()) names.push_back(prefix + te);
    const std::string mtp = ".transformer_layer.";
    if (const size_t at = prefix.find(mtp); at != std::string::npos)
      for (size_t k = 0, n = names.size(); k < n; ++k)
        names.push_back(names[k].substr(0, at) + ".mtp_model_layer." + names[k].substr(at + mtp.size()));
  }
  return names;
}

}  // namespace

std::string megatron_rank_dir(int t, int p, int e, bool pipeline, bool expert) {
  char name[40];
  int n = std::snprintf(name, sizeof name, "mp_rank_%02d", t);
  if (pipeline) n += std::snprintf(name + n, sizeof name - size_t(n), "_%03d", p);
  if (expert) std::snprintf(name + n, sizeof name - size_t(n), "_%03d", e);
  return name;
}

std::pair<std::string, std::string> split_layer_name(const std::string& name) {
  const std::string layers = "decoder.layers.", depths = "mtp.layers.", layer = "transformer_layer.";
  if (name.rfind(layers, 0) == 0) {
    const size_t dot = name.find('.', layers.size());
    if (dot != std::string::npos) return {name.substr(0, dot + 1), name.substr(dot + 1)};
  } else if (name.rfind(depths, 0) == 0) {
    const size_t dot = name.find('.', depths.size());
    if (dot != std::string::npos && name.compare(dot + 1, layer.size(), layer) == 0)
      return {name.substr(0, dot + 1 + layer.size()), name.substr(dot + 1 + layer.size())};
  }
  return {};
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

int64_t megatron_adam_step(const std::vector<double>& steps, const std::string& where) {
  const std::string& hint = kNoLoadOptimHint;
  if (steps.empty())
    LATTICE_FAIL() << where << ": no optimizer step (the param groups' 'step' or the states') beside Adam's state"
                   << hint;
  const double step = *std::max_element(steps.begin(), steps.end());
  for (double s : steps)  // (a param group without parameters may never have stepped)
    if (s != step && s != 0)
      LATTICE_FAIL() << where << ": the optimizer's steps disagree (" << s << " and " << step
                     << "); lattice keeps one count" << hint;
  if (step < 0 || step != std::floor(step))
    LATTICE_FAIL() << where << ": optimizer step " << step << " is not a count" << hint;
  return int64_t(step);
}

nlohmann::json megatron_scheduler_state(const TorchArchive& archive) {
  const std::string what = archive.path() + ": opt_param_scheduler";
  const PyRef d = archive.root()->get("opt_param_scheduler");
  if (!d || !d->is(PyValue::Kind::dict))
    LATTICE_FAIL() << archive.path() << ": no opt_param_scheduler beside the optimizer state; give --no-load-optim to "
                   << "convert the weights alone";
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : d->entries) {
    if (!k->is(PyValue::Kind::string)) continue;
    if (v->is(PyValue::Kind::integer)) j[k->text] = v->integer;
    else if (v->is(PyValue::Kind::floating)) j[k->text] = v->floating;
    else if (v->is(PyValue::Kind::string)) j[k->text] = v->text;
    else if (v->is(PyValue::Kind::boolean)) j[k->text] = v->boolean;
    else if (v->is(PyValue::Kind::none)) j[k->text] = nullptr;
    else LATTICE_FAIL() << what << ": " << k->text << " is " << v->describe() << ", not a number or a string";
  }
  OptimizerParamSchedulerState::from_json(j, what);  // Megatron's fields, which are lattice's: checked here
  return j;
}

// What a checkpoint saves beside the model (a rank file's, or torch_dist's common.pt): the args as the model's
// configuration and train flags, the iteration, the layout, the tokenizer.
MegatronArgs read_megatron_saved_state(const TorchArchive& archive, MegatronSource& out) {
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
  if (const PyRef f = root->get("num_floating_point_operations_so_far"); f && f->is(PyValue::Kind::floating))
    out.flops_so_far = f->floating;
  if (const PyRef n = ns->get("consumed_train_samples"); n && n->is(PyValue::Kind::integer))
    out.consumed_train_samples = n->integer;
  if (const PyRef s = ns->get("seed"); s && s->is(PyValue::Kind::integer)) out.seed = uint64_t(s->integer);
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

MegatronSource open_megatron_checkpoint(const std::string& dir, bool load_optim) {
  if (!fs::is_directory(dir)) LATTICE_FAIL() << "--from-megatron " << dir << ": no such directory";
  MegatronSource out;
  out.iteration_dir = resolve_iteration_dir(dir);
  const std::string& iter = out.iteration_dir;
  if (!fs::is_directory(iter))
    LATTICE_FAIL() << "--from-megatron " << dir << ": its latest_checkpointed_iteration.txt names " << iter
                   << ", which is missing";
  if (fs::exists(fs::path(iter) / ".metadata")) return open_megatron_torch_dist(std::move(out), load_optim);
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
  MegatronArgs parsed = read_megatron_saved_state(*archive0, out);
  const TrainArgs& a = parsed.args;
  // Experts split otherwise than the dense layers: which rank files hold them depends on Megatron's rank order
  // (torch_dist's tensors are whole whatever the split: read there).
  if (const PyRef etp = archive0->root()->get("args")->get("expert_tensor_parallel_size");
      parsed.config.moe() && etp && etp->is(PyValue::Kind::integer) && etp->integer != out.tp)
    LATTICE_FAIL() << what0 << ": saved with --expert-tensor-parallel-size " << etp->integer
                   << " and --tensor-model-parallel-size " << out.tp << ", whose expert rank files lattice does not "
                   << "read from --ckpt-format torch (equal sizes only; --ckpt-format torch_dist is read)";
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
          Entries entries;
          flatten(m, "", entries);
          entries = from_legacy_names(std::move(entries), out.legacy);
          std::map<std::string, PyRef> tensors;
          std::vector<std::string>& order = rf.order.emplace_back();
          for (auto& [k, v] : entries) {  // Transformer Engine's extra state: no weights
            const bool extra = k.size() >= 12 && k.compare(k.size() - 12, 12, "_extra_state") == 0;
            if (k.find("layer_norm_weight") != std::string::npos) out.transformer_engine = true;
            if (k.find(".mlp.experts.weight1") != std::string::npos)
              LATTICE_FAIL() << path.string() << ": " << k << " is the legacy GroupedMLP's (--moe-grouped-gemm "
                             << "without Transformer Engine), which lattice does not read";
            if (extra) continue;
            order.push_back(k);
            tensors[k] = std::move(v);
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
    } else if (info.name.rfind("decoder.final_layernorm", 0) == 0 || info.name == "output_layer.weight" ||
               info.name.rfind("mtp.", 0) == 0) {  // (the prediction depths: on the last stage)
      p = P - 1;
      ch = out.vp - 1;
    }
    // A routed expert: expert-parallel rank g / (E / EP)'s local expert g % (E / EP).
    if (const size_t x = local.find(experts_infix); x != std::string::npos) {
      const size_t begin = x + experts_infix.size(), end = local.find('.', begin);
      const int64_t g = std::stoll(local.substr(begin, end - begin));
      e = int(g / experts_per_rank);
      local = local.substr(0, begin) + std::to_string(g % experts_per_rank) + local.substr(end);
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
        LATTICE_FAIL() << path << ": tensor " << found << " has shape " << shape_str(tensor->shape) << ", expected "
                       << shape_str(part.shape) << " (tensor-parallel rank " << t << " of " << T
                       << " of the model its args describe)";
      rf.used.insert(found);
      sources.push_back({&files[at(t, p, e)] - files.data(), ch, rank, found});
    }
  }
  // Nothing left over (the last stage's copy of a tied word embedding is the first stage's, as is the prediction
  // depths' stage's copy of the word embeddings; a tensor every tensor- or expert-parallel rank of a stage holds is
  // read from one of them).
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
            if (key == "embedding.word_embeddings.weight" && p == P - 1 && c.mtp_num_layers > 0) continue;
            LATTICE_FAIL() << files[at(t, p, e)].archive->path() << ": tensor " << key
                           << " is not a parameter of the model its args describe";
          }
  }

  // Adam's state: every rank file's, where lattice reads it (the weights then from its fp32 main parameters).
  using RankStates = std::vector<std::optional<MegatronRankOptimizer>>;
  auto states = std::make_shared<RankStates>(files.size());
  if (!load_optim) {
    out.optimizer_note = "not read (--no-load-optim)";
  } else {
    // The distributed optimizer's state in each rank directory's distrib_optim.pt, else numbered in the rank file.
    const bool distributed = fs::exists(first.parent_path() / "distrib_optim.pt");
    auto distrib_optim = [&](size_t k) {
      return fs::path(files[k].archive->path()).parent_path() / "distrib_optim.pt";
    };
    for (size_t k = 0; distributed && k < files.size(); ++k)
      if (!fs::exists(distrib_optim(k)))
        LATTICE_FAIL() << distrib_optim(k).string() << " is missing (the distributed optimizer's state, which "
                       << distrib_optim(0).string() << " has)" << kNoLoadOptimHint;
    for (size_t k = 0; k < files.size(); ++k) {
      const int stage = int(k / size_t(E)) % P;
      (*states)[k] = distributed ? read_megatron_distrib_optimizer(files[k], distrib_optim(k).string(), stage,
                                                                   out.optimizer_note)
                                 : read_megatron_rank_optimizer(files[k], out.optimizer_note);
      if (!(*states)[k]) {
        *states = RankStates(files.size());
        break;
      }
    }
  }
  if ((*states)[0]) {
    std::vector<double> steps;
    for (const auto& s : *states) steps.insert(steps.end(), s->steps.begin(), s->steps.end());
    MegatronOptimizerState o;
    o.form = (*states)[0]->archive ? "the distributed optimizer's distrib_optim.pt (--ckpt-format torch)"
                                   : "the optimizer's numbered state (--ckpt-format torch)";
    o.step = megatron_adam_step(steps, iter);
    o.opt_param_scheduler = megatron_scheduler_state(*files[0].archive);
    o.grad_scaler = (*states)[0]->grad_scaler;
    out.optimizer = std::move(o);
  }
  out.source.config = c;
  auto shared_files = std::make_shared<std::vector<RankFile>>(std::move(files));
  // A fill of each parameter from its ranks' parts of it: the weights (the fp32 main parameter where the optimizer
  // keeps one, checked against the model's rounded copy), or a state (`which`: exp_avg, exp_avg_sq).
  auto fill = [shared_files, states, rank_infos, plan, E](const std::string& which) {
    return [=](const ParamInfo& info, float* dst) {
      for (const Source& s : plan->at(info.name)) {
        const RankFile& rf = (*shared_files)[s.file];
        const PyRef& model = rf.chunks[size_t(s.chunk)].at(s.key);
        const auto& st = (*states)[size_t(s.file)];
        const MegatronParamState* ps = st ? &st->chunks[size_t(s.chunk)].at(s.key) : nullptr;
        const PyRef& value = which == "exp_avg" ? ps->exp_avg : which == "exp_avg_sq" ? ps->exp_avg_sq
                             : ps && ps->main ? ps->main : model;
        const TorchArchive& from = value != model && st->archive ? *st->archive : *rf.archive;
        ParamInfo part = (*rank_infos)[s.rank].at(info.name);
        const bool whole = part.shape == info.shape;  // the rank holds it whole (one rank, or a copy on every rank)
        std::vector<float> local(whole ? 0 : size_t(part.numel));
        float* into = whole ? dst : local.data();
        const std::string what = value == model ? s.key : which + " of " + s.key;
        from.read_float(*TorchArchive::tensor(value), what, into);
        if (value != model && which == "weights") check_main_params(*rf.archive, model, s.key, into);
        if (whole) continue;
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
  };
  out.source.fill = fill("weights");
  if (out.optimizer) {
    out.optimizer->exp_avg = fill("exp_avg");
    out.optimizer->exp_avg_sq = fill("exp_avg_sq");
  }
  return out;
}

}  // namespace lattice
