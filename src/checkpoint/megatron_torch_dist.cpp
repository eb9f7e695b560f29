// Megatron-Core's torch_dist checkpoints (megatron_torch_dist.h).
#include "checkpoint/megatron_torch_dist.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "checkpoint/torch_archive.h"
#include "checkpoint/megatron_distrib_optimizer.h"
#include "checkpoint/megatron_torch_optimizer.h"
#include "checkpoint/torch_dcp.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/gpt_model.h"
#include "optim/opt_param_scheduler.h"

namespace fs = std::filesystem;

namespace lattice {

namespace {

// A parameter's values in a torch_dist tensor: its name, the leading dims fixed (the layer's and the routed
// expert's index) and those dims' sizes (num_layers, num_experts).
struct Slice {
  std::string fqn;
  std::vector<int64_t> lead, stacked;
  std::string axes;  // what the leading dims are, in errors ("layers", "layers, experts", "experts")
};

// Where torch_dist keeps lattice's parameter `name`, in the order tried. A decoder layer's in the tensor every
// layer's <rest> is stacked in, decoder.layers.<rest> [num_layers, ...] at its layer (TransformerBlock's
// sharded_state_dict), else in its own, decoder.layers.<l>.<rest> (the non_homogeneous_layers form); a prediction
// depth's layer's in its own, mtp.layers.<k>.transformer_layer.<rest> (MultiTokenPredictionBlock's, not stacked). A
// routed expert's stacked as SequentialMLP's sharded_state_dict stacks them: decoder.layers.mlp.experts.experts.<tail>
// [num_layers, num_experts, ...] at (layer, expert), else <layer>.mlp.experts.experts.<tail> [num_experts, ...], else
// <layer>.mlp.experts.experts.<g>.<tail> (singleton_local_shards); each with Transformer Engine's fused norm names
// where they apply. Anything else: its own name.
std::vector<Slice> torch_dist_forms_of(const std::string& name, const TransformerConfig& c) {
  const auto [layer, rest] = split_layer_name(name);
  if (layer.empty()) return {Slice{name, {}, {}, ""}};
  const std::string layers = "decoder.layers.", experts = "mlp.experts.local_experts.";
  const bool decoder = layer.rfind(layers, 0) == 0;
  const int64_t l = decoder ? std::stoll(layer.substr(layers.size())) : 0;
  std::vector<Slice> forms;
  if (rest.rfind(experts, 0) == 0) {
    const size_t end = rest.find('.', experts.size());
    const int64_t g = std::stoll(rest.substr(experts.size(), end - experts.size()));
    const std::string tail = rest.substr(end + 1);
    if (decoder)
      forms.push_back(Slice{layers + "mlp.experts.experts." + tail, {l, g}, {c.num_layers, c.num_experts},
                            "layers then experts"});
    forms.push_back(Slice{layer + "mlp.experts.experts." + tail, {g}, {c.num_experts}, "experts"});
    forms.push_back(Slice{layer + "mlp.experts.experts." + std::to_string(g) + "." + tail, {}, {}, ""});
    return forms;
  }
  for (const std::string& r : {te_fused_norm_name(rest), rest}) {
    if (r.empty()) continue;
    if (decoder) forms.push_back(Slice{layers + r, {l}, {c.num_layers}, "layers"});
    forms.push_back(Slice{layer + r, {}, {}, ""});
  }
  return forms;
}

std::string slice_text(const Slice& s) {
  std::string at = s.fqn;
  for (size_t d = 0; d < s.lead.size(); ++d)
    at += std::string(d ? ", " : " at ") + (d == 1 || s.axes == "experts" ? "expert " : "layer ") +
          std::to_string(s.lead[d]);
  return at;
}

// Checks that tensor fqn has `size` and that its chunks hold every value of the slice at `lead` (numel of them);
// `expected` says what the size is, in the error, and `hint` ends either error.
void check_slice(const DcpCheckpoint& dcp, const Slice& s, const std::vector<int64_t>& size, int64_t numel,
                 const std::string& expected, const std::string& hint = "") {
  const std::vector<int64_t>& saved = dcp.tensors().at(s.fqn).size;
  if (saved != size)
    LATTICE_FAIL() << dcp.dir() << ": tensor " << s.fqn << " has size " << shape_str(saved) << ", expected "
                   << shape_str(size) << " (" << expected << ")" << hint;
  if (const int64_t held = dcp.covered(s.fqn, s.lead); held != numel)
    LATTICE_FAIL() << dcp.dir() << ": " << slice_text(s) << ": its chunks hold " << held << " of its " << numel
                   << " values" << hint;
}

// The optimizer-state tensors, [chained_<i>.]optimizer.state.<slot>.<model tensor> (the chained optimizer's prefix
// is that of Megatron-Core before 0.14), by model tensor and slot (exp_avg, exp_avg_sq, fp32_param, param).
std::map<std::string, std::map<std::string, std::string>> named_optimizer_state(const DcpCheckpoint& dcp) {
  std::map<std::string, std::map<std::string, std::string>> out;
  const std::string state = "optimizer.state.";
  for (const auto& [key, t] : dcp.tensors()) {
    size_t at = 0;
    if (key.rfind("chained_", 0) == 0) {
      at = key.find('.');
      if (at == std::string::npos) continue;
      ++at;
    }
    if (key.compare(at, state.size(), state) != 0) continue;
    const size_t dot = key.find('.', at + state.size());
    if (dot == std::string::npos) continue;
    out[key.substr(dot + 1)][key.substr(at + state.size(), dot - at - state.size())] = key;
  }
  return out;
}

// The distributed optimizer's own layouts: its flat buffers (dp_reshardable, Megatron-Core's default with
// --use-distributed-optimizer since 0.13; dp_zero_gather_scatter before it), optimizer.distributed.*.
bool has_optimizer_buffers(const DcpCheckpoint& dcp) {
  auto buffer = [](const std::string& k) { return k.find("optimizer.distributed.") != std::string::npos; };
  for (const auto& [key, t] : dcp.tensors())
    if (buffer(key)) return true;
  for (const std::string& key : dcp.bytes_items())
    if (buffer(key)) return true;
  return false;
}

// Every 'step' of the param groups (Transformer Engine's and Apex's FusedAdam keep it there) and every common_step
// (torch.optim's per-parameter step, saved once) under common.pt's 'optimizer': a dict, a list of them (the chained
// optimizer: dense, then experts), or a dict of them by index.
void collect_steps(const PyRef& v, const TorchArchive& archive, const std::string& at, std::vector<double>& steps) {
  if (!v) return;
  if (v->is(PyValue::Kind::list) || v->is(PyValue::Kind::tuple)) {
    for (size_t i = 0; i < v->items.size(); ++i) collect_steps(v->items[i], archive, at + "[" + std::to_string(i) + "]", steps);
    return;
  }
  if (!v->is(PyValue::Kind::dict)) return;
  for (const auto& [k, item] : v->entries) {
    const std::string key = k->is(PyValue::Kind::string) ? k->text : k->is(PyValue::Kind::integer) ? std::to_string(k->integer) : "";
    if (key == "param_groups" && (item->is(PyValue::Kind::list) || item->is(PyValue::Kind::tuple))) {
      for (size_t i = 0; i < item->items.size(); ++i)
        if (const auto s = archive.number(item->items[i]->is(PyValue::Kind::dict) ? item->items[i]->get("step") : nullptr,
                                          at + ".param_groups[" + std::to_string(i) + "].step"))
          steps.push_back(*s);
    } else if (key == "common_step") {
      if (const auto s = archive.number(item, at + ".common_step")) steps.push_back(*s);
    } else if (!key.empty()) {
      collect_steps(item, archive, at + "." + key, steps);
    }
  }
}

// fp16's dynamic loss scaler under common.pt's 'optimizer' ({'scale': tensor [1], 'growth_tracker',
// 'hysteresis_tracker'}); nullopt without one (bf16, fp32, a constant --loss-scale).
std::optional<LossScalerState> find_grad_scaler(const PyRef& v, const TorchArchive& archive, const std::string& at) {
  if (!v) return std::nullopt;
  if (v->is(PyValue::Kind::list) || v->is(PyValue::Kind::tuple)) {
    for (size_t i = 0; i < v->items.size(); ++i)
      if (auto s = find_grad_scaler(v->items[i], archive, at + "[" + std::to_string(i) + "]")) return s;
    return std::nullopt;
  }
  if (!v->is(PyValue::Kind::dict)) return std::nullopt;
  if (const PyRef g = v->get("grad_scaler"); g && g->is(PyValue::Kind::dict) && g->get("scale"))
    return megatron_grad_scaler(*g, archive, at + ".grad_scaler");
  for (const auto& [k, item] : v->entries)
    if (auto s = find_grad_scaler(item, archive, at + "." + (k->is(PyValue::Kind::string) ? k->text : "?"))) return s;
  return std::nullopt;
}

// The optimizer's state where lattice reads it (MegatronOptimizerState) into out.optimizer, with source.fill reading
// the fp32 main parameters where the optimizer keeps them; else out.optimizer_note says why not. Named state is
// checked whole: every parameter's moments there, of its tensor's size, every value in a chunk, nothing left over.
void read_optimizer_state(MegatronSource& out, const std::shared_ptr<DcpCheckpoint>& dcp,
                          const std::shared_ptr<std::map<std::string, Slice>>& plan, const TorchArchive& common,
                          const ParamBuffer& whole, const MegatronArgs& parsed) {
  const TransformerConfig& c = parsed.config;
  const std::string& iter = out.iteration_dir;
  const PyRef root = common.root();
  const PyRef ns = root->get("args");
  if (out.optimizer_note = megatron_non_adam_note(ns); !out.optimizer_note.empty()) return;
  if (has_optimizer_buffers(*dcp)) {  // the distributed optimizer's own layouts (megatron_distrib_optimizer.h)
    read_megatron_dp_reshardable(out, dcp, common, parsed, [dcp, plan](const ParamInfo& info, float* dst) {
      const Slice& slice = plan->at(info.name);
      dcp->read_float(slice.fqn, slice.lead, dst);
    });
    return;
  }
  const auto named = named_optimizer_state(*dcp);
  if (named.empty()) {
    out.optimizer_note = "none saved (--no-save-optim)";
    return;
  }
  const std::string& hint = kNoLoadOptimHint;
  struct State {
    Slice exp_avg, exp_avg_sq;
    std::optional<Slice> main;  // the fp32 main parameter (fp32_param; the fully reshardable layout's param)
  };
  auto states = std::make_shared<std::map<std::string, State>>();
  std::set<std::string> used;
  for (const ParamInfo& info : whole.infos()) {
    const Slice& model = plan->at(info.name);
    const auto it = named.find(model.fqn);
    auto slot = [&](const std::string& name, bool required) -> std::optional<Slice> {
      const auto s = it == named.end() ? std::map<std::string, std::string>::const_iterator()
                                       : it->second.find(name);
      if (it == named.end() || s == it->second.end()) {
        if (required)
          LATTICE_FAIL() << iter << ": no tensor optimizer.state." << name << "." << model.fqn << " (Adam's state of "
                         << "lattice's " << info.name << ") in .metadata, where other parameters have theirs" << hint;
        return std::nullopt;
      }
      Slice state{s->second, model.lead, model.stacked, model.axes};
      check_slice(*dcp, state, dcp->tensors().at(model.fqn).size, info.numel,
                  "its parameter's, " + model.fqn + "; the distributed optimizer's flattened form (Megatron-Core "
                  "0.8-0.13, --ckpt-fully-parallel-save) is read where .metadata's mcore_data names its shape",
                  hint);
      used.insert(s->second);
      return state;
    };
    State s{*slot("exp_avg", true), *slot("exp_avg_sq", true), slot("fp32_param", false)};
    if (!s.main) s.main = slot("param", false);
    (*states)[info.name] = s;
  }
  for (const auto& [fqn, slots] : named)
    for (const auto& [slot, key] : slots) {
      if (used.count(key) || (fqn == "output_layer.weight" && !c.untie_embeddings_and_output_weights)) continue;
      LATTICE_FAIL() << iter << ": tensor " << key << " is not Adam's state of a parameter of the model its args "
                     << "describe" << hint;
    }

  MegatronOptimizerState o;
  o.form = "the non-distributed optimizer's named state (torch_dist)";
  for (const auto& [name, st] : *states) {
    if (st.main && dcp->tensors().at(st.main->fqn).stored.size())
      o.form = "the distributed optimizer's flattened state (torch_dist, fully_sharded_model_space)";
    else if (st.main && st.main->fqn.find("optimizer.state.param.") != std::string::npos)
      o.form = "the distributed optimizer's fully reshardable state (torch_dist)";
  }
  std::vector<double> steps;
  collect_steps(root->get("optimizer"), common, "optimizer", steps);
  o.step = megatron_adam_step(steps, common.path());
  o.opt_param_scheduler = megatron_scheduler_state(common);
  o.grad_scaler = find_grad_scaler(root->get("optimizer"), common, "optimizer");
  o.exp_avg = [dcp, states](const ParamInfo& info, float* dst) {
    const Slice& s = states->at(info.name).exp_avg;
    dcp->read_float(s.fqn, s.lead, dst);
  };
  o.exp_avg_sq = [dcp, states](const ParamInfo& info, float* dst) {
    const Slice& s = states->at(info.name).exp_avg_sq;
    dcp->read_float(s.fqn, s.lead, dst);
  };
  out.source.fill = [dcp, plan, states](const ParamInfo& info, float* dst) {
    const State& s = states->at(info.name);
    const Slice& from = s.main ? *s.main : plan->at(info.name);
    dcp->read_float(from.fqn, from.lead, dst);
  };
  out.optimizer = std::move(o);
}

}  // namespace

// Megatron-Core's torch_dist checkpoint (dist_checkpointing's torch_dist backend): common.pt (torch.save of what
// is not sharded: the args) and a torch.distributed.checkpoint (checkpoint/torch_dcp.h) of the sharded state,
// whose model tensors are named as the state dict names them but for the layers: one tensor
// decoder.layers.<rest> [num_layers, ...] for every layer's <rest> (sharded_state_dict prepends the global layer
// number), each rank's part a chunk. The layout that saved it does not matter: every tensor is whole here.
MegatronSource open_megatron_torch_dist(MegatronSource out, bool load_optim) {
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
  MegatronArgs parsed = read_megatron_saved_state(archive, out);
  const TransformerConfig& c = parsed.config;
  out.torch_dist = true;
  auto dcp = std::make_shared<DcpCheckpoint>(iter);
  for (const auto& [fqn, t] : dcp->tensors())
    if (fqn.find("layer_norm_weight") != std::string::npos) out.transformer_engine = true;

  // Each parameter's tensor and its slice of it; shapes checked.
  auto plan = std::make_shared<std::map<std::string, Slice>>();
  std::set<std::string> used;
  const ParamBuffer whole = GPTModel::parameter_registry(c, TensorParallel{}, ModelPlacement{}, 0, 1);
  for (const ParamInfo& info : whole.infos()) {
    const std::vector<Slice> forms = torch_dist_forms_of(info.name, c);
    const Slice* found = nullptr;
    for (const Slice& f : forms)
      if (!found && dcp->tensors().count(f.fqn)) found = &f;
    if (!found)
      LATTICE_FAIL() << iter << ": no tensor " << forms.front().fqn << " (lattice's " << info.name << ") in .metadata";
    std::vector<int64_t> size = found->stacked;  // the stacked axes first
    size.insert(size.end(), info.shape.begin(), info.shape.end());
    check_slice(*dcp, *found, size, info.numel,
                "the model its args describe" + (found->axes.empty() ? "" : ", " + found->axes + " first"));
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
    const Slice& slice = plan->at(info.name);
    dcp->read_float(slice.fqn, slice.lead, dst);
  };
  if (!load_optim) {
    out.optimizer_note = "not read (--no-load-optim)";
    return out;
  }
  read_optimizer_state(out, dcp, plan, archive, whole, parsed);
  return out;
}

}  // namespace lattice
