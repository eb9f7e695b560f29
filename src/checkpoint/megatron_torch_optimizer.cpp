// Adam's state in a Megatron-LM --ckpt-format torch rank file (megatron_torch_optimizer.h).
#include "checkpoint/megatron_torch_optimizer.h"


#include "core/error.h"
#include "core/tensor.h"

namespace lattice {

namespace {

const std::string& kHint = kNoLoadOptimHint;

// A saved param group: its parameters' numbers and what decides which parameters it holds.
struct SavedGroup {
  PyRef params;                  // list of ints
  double wd_mult = 1;
  std::optional<bool> expert;    // is_expert_parallel
  std::optional<bool> decoupled; // is_decoupled_lr
  double step = -1;              // FusedAdam's per-group step (-1: none)
  std::vector<std::pair<int, std::string>> members;  // (chunk, key) in order, as this reading assigns them
};

// One of a rank's optimizers (one, or a chained optimizer's dense and expert ones).
struct SavedOptimizer {
  PyRef state;           // {int: {'exp_avg', 'exp_avg_sq', 'step'?}}
  PyRef mains;           // fp32_from_fp16_params: a list per group, or null
  std::vector<SavedGroup> groups;
  bool expert = false;   // the routed experts' optimizer
  bool decoupled = false;  // a group of --decoupled-lr's (the embedding's and output layer's learning rate)
};

PyRef dict_at(const PyRef& d, const std::string& key) {
  PyRef v = d && d->is(PyValue::Kind::dict) ? d->get(key) : nullptr;
  return v && !v->is(PyValue::Kind::none) ? v : nullptr;
}

bool is_list(const PyRef& v) { return v && (v->is(PyValue::Kind::list) || v->is(PyValue::Kind::tuple)); }

// The state of parameter number `index`: state's entry under that integer key, or null.
PyRef state_of(const PyRef& state, int64_t index) {
  for (auto it = state->entries.rbegin(); it != state->entries.rend(); ++it)
    if (it->first->is(PyValue::Kind::integer) && it->first->integer == index) return it->second;
  return nullptr;
}

}  // namespace

std::optional<MegatronRankOptimizer> read_megatron_rank_optimizer(const MegatronRankFile& f, std::string& note) {
  const TorchArchive& archive = *f.archive;
  const std::string& path = archive.path();
  const PyRef root = archive.root();
  const PyRef ns = root->get("args");
  if (note = megatron_non_adam_note(ns); !note.empty()) return std::nullopt;
  const PyRef saved = dict_at(root, "optimizer");
  if (!saved) {
    note = "none saved (--no-save-optim)";
    return std::nullopt;
  }
  // The optimizers: one, or a chained optimizer's list (its older versions: a list of one too).
  std::vector<PyRef> entries = is_list(saved) ? saved->items : std::vector<PyRef>{saved};
  std::vector<SavedOptimizer> optimizers;
  MegatronRankOptimizer out;
  for (size_t n = 0; n < entries.size(); ++n) {
    const PyRef& e = entries[n];
    const std::string at = "optimizer" + (is_list(saved) ? "[" + std::to_string(n) + "]" : std::string());
    if (!e || e->is(PyValue::Kind::none)) continue;  // a chained optimizer with no parameters on this rank
    SavedOptimizer o;
    PyRef inner = e;
    if (const PyRef wrapped = dict_at(e, "optimizer")) {  // Float16OptimizerWithFloat16Params (or the distributed one)
      inner = wrapped;
      o.mains = dict_at(e, "fp32_from_fp16_params");
      if (const PyRef g = dict_at(e, "grad_scaler"); g && g->is(PyValue::Kind::dict) && !out.grad_scaler)
        out.grad_scaler = megatron_grad_scaler(*g, archive, at + ".grad_scaler");
    }
    const PyRef state = dict_at(inner, "state"), groups = dict_at(inner, "param_groups");
    if (!state || !is_list(groups)) {
      note = "the distributed optimizer's (its state in distrib_optim.pt's flat buffers), which lattice does not "
             "read; Megatron saves Adam's state by parameter name with --ckpt-format torch_dist";
      return std::nullopt;
    }
    o.state = state;
    for (size_t g = 0; g < groups->items.size(); ++g) {
      const PyRef& gd = groups->items[g];
      const std::string gat = at + ".param_groups[" + std::to_string(g) + "]";
      SavedGroup sg;
      sg.params = dict_at(gd, "params");
      if (!is_list(sg.params)) LATTICE_FAIL() << path << ": " << gat << " has no 'params' list" << kHint;
      const auto wd = archive.number(dict_at(gd, "wd_mult"), gat + ".wd_mult");
      if (!wd) {
        note = gat + " has no wd_mult (a Megatron-LM older than lattice reads)";
        return std::nullopt;
      }
      sg.wd_mult = *wd;
      if (const PyRef x = dict_at(gd, "is_expert_parallel"); x && x->is(PyValue::Kind::boolean)) sg.expert = x->boolean;
      if (const PyRef x = dict_at(gd, "is_decoupled_lr"); x && x->is(PyValue::Kind::boolean)) sg.decoupled = x->boolean;
      if (const auto s = archive.number(dict_at(gd, "step"), gat + ".step")) out.steps.push_back(*s);
      o.groups.push_back(std::move(sg));
    }
    bool all_expert = !o.groups.empty();
    for (const SavedGroup& g : o.groups) all_expert = all_expert && g.expert.value_or(false);
    o.expert = all_expert || (entries.size() == 2 && n == 1 && !o.groups.empty() && !o.groups[0].expert);
    for (const SavedGroup& g : o.groups) o.decoupled = o.decoupled || g.decoupled.value_or(false);
    optimizers.push_back(std::move(o));
  }
  const PyRef wd_qk = ns ? ns->get("apply_wd_to_qk_layernorm") : nullptr;
  const bool qk_decay = wd_qk && wd_qk->is(PyValue::Kind::boolean) && wd_qk->boolean;

  // Each parameter, in named_parameters order (model chunks in turn, each state dict's order), into its group.
  for (size_t ch = 0; ch < f.order.size(); ++ch)
    for (const std::string& key : f.order[ch]) {
      if (key.ends_with("_extra_state") || key.ends_with(".expert_bias")) continue;  // not parameters
      const TorchTensor* t = TorchArchive::tensor(f.chunks[ch].at(key));
      if (!t) continue;
      const bool expert = key.find(".mlp.experts.") != std::string::npos;
      const bool qk_norm = key.find("q_layernorm.") != std::string::npos || key.find("k_layernorm.") != std::string::npos;
      const bool no_wd = (key.ends_with(".bias") || t->shape.size() == 1) && !(qk_decay && qk_norm);
      const bool embedding_or_output = key == "embedding.word_embeddings.weight" || key == "output_layer.weight";
      SavedGroup* home = nullptr;
      int matches = 0;
      for (SavedOptimizer& o : optimizers) {
        if (o.expert != expert) continue;
        for (SavedGroup& g : o.groups) {
          if (g.wd_mult != (no_wd ? 0.0 : 1.0)) continue;
          if (o.decoupled && g.decoupled.value_or(false) != embedding_or_output) continue;
          if (g.expert && *g.expert != expert) continue;
          home = &g;
          ++matches;
        }
      }
      if (matches != 1)
        LATTICE_FAIL() << path << ": " << (matches == 0 ? "no" : std::to_string(matches)) << " param groups of the "
                       << (expert ? "experts' " : "") << "optimizer for " << key << " (weight decay "
                       << (no_wd ? "off" : "on") << "); lattice tells its groups apart by wd_mult, "
                       << "is_expert_parallel and is_decoupled_lr" << kHint;
      home->members.emplace_back(int(ch), key);
    }

  out.chunks.resize(f.order.size());
  for (const SavedOptimizer& o : optimizers)
    for (size_t g = 0; g < o.groups.size(); ++g) {
      const SavedGroup& sg = o.groups[g];
      if (sg.members.size() != sg.params->items.size())
        LATTICE_FAIL() << path << ": " << (o.expert ? "the experts' " : "") << "param group " << g << " (wd_mult "
                       << sg.wd_mult << ") numbers " << sg.params->items.size() << " parameters; the rank's state "
                       << "dict gives it " << sg.members.size() << kHint;
      const PyRef mains = o.mains && is_list(o.mains) && g < o.mains->items.size() ? o.mains->items[g] : nullptr;
      if (o.mains && (!is_list(mains) || mains->items.size() != sg.members.size()))
        LATTICE_FAIL() << path << ": fp32_from_fp16_params[" << g << "] does not hold one main parameter for each of "
                       << "the group's " << sg.members.size() << kHint;
      for (size_t k = 0; k < sg.members.size(); ++k) {
        const auto& [ch, key] = sg.members[k];
        const PyRef index = sg.params->items[k];
        if (!index->is(PyValue::Kind::integer))
          LATTICE_FAIL() << path << ": param group " << g << " numbers a parameter " << index->describe() << kHint;
        const PyRef st = state_of(o.state, index->integer);
        if (!st || !st->is(PyValue::Kind::dict))
          LATTICE_FAIL() << path << ": no optimizer state for parameter " << index->integer << " (" << key << ")"
                         << kHint;
        const std::vector<int64_t>& shape = TorchArchive::tensor(f.chunks[size_t(ch)].at(key))->shape;
        MegatronParamState ps{st->get("exp_avg"), st->get("exp_avg_sq"), mains ? mains->items[k] : nullptr};
        for (const auto& [what, v] : {std::pair<const char*, PyRef>{"exp_avg", ps.exp_avg},
                                      {"exp_avg_sq", ps.exp_avg_sq}, {"fp32_from_fp16_params", ps.main}}) {
          if (!v && std::string(what) == "fp32_from_fp16_params") continue;
          const TorchTensor* t = v ? TorchArchive::tensor(v) : nullptr;
          if (!t)
            LATTICE_FAIL() << path << ": parameter " << index->integer << " (" << key << ") has no " << what
                           << " tensor" << kHint;
          if (t->shape != shape)
            LATTICE_FAIL() << path << ": " << what << " of parameter " << index->integer << " has shape "
                           << shape_str(t->shape) << ", but the parameter it is numbered for, " << key << ", has "
                           << shape_str(shape) << " (the state dict's order and param groups disagree)" << kHint;
        }
        if (const auto s = archive.number(st->get("step"), "state " + std::to_string(index->integer) + ".step"))
          out.steps.push_back(*s);
        out.chunks[size_t(ch)][key] = ps;
      }
    }
  return out;
}

std::string megatron_non_adam_note(const PyRef& args) {
  const PyRef o = args ? args->get("optimizer") : nullptr;
  if (!o || !o->is(PyValue::Kind::string) || o->text == "adam") return "";
  return "args.optimizer is '" + o->text + "'; lattice brings Adam's state over only";
}

std::optional<LossScalerState> megatron_grad_scaler(const PyValue& g, const TorchArchive& archive,
                                                     const std::string& name) {
  const auto scale = archive.number(g.get("scale"), name + ".scale");
  const auto growth = archive.number(g.get("growth_tracker"), name + ".growth_tracker");
  const auto hysteresis = archive.number(g.get("hysteresis_tracker"), name + ".hysteresis_tracker");
  if (!scale || !growth || !hysteresis) return std::nullopt;  // a constant scaler: nothing to carry
  return LossScalerState{*scale, int64_t(*growth), int64_t(*hysteresis)};
}

}  // namespace lattice
