// Megatron-Core's torch_dist checkpoints (megatron_torch_dist.h).
#include "checkpoint/megatron_torch_dist.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "checkpoint/torch_archive.h"
#include "checkpoint/torch_dcp.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/gpt_model.h"

namespace fs = std::filesystem;

namespace lattice {

namespace {

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

}  // namespace

// Megatron-Core's torch_dist checkpoint (dist_checkpointing's torch_dist backend): common.pt (torch.save of what
// is not sharded: the args) and a torch.distributed.checkpoint (checkpoint/torch_dcp.h) of the sharded state,
// whose model tensors are named as the state dict names them but for the layers: one tensor
// decoder.layers.<rest> [num_layers, ...] for every layer's <rest> (sharded_state_dict prepends the global layer
// number), each rank's part a chunk. The layout that saved it does not matter: every tensor is whole here.
MegatronSource open_megatron_torch_dist(MegatronSource out) {
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
      LATTICE_FAIL() << iter << ": tensor " << found->fqn << " has size " << shape_str(saved) << ", expected "
                     << shape_str(size) << " (the model its args describe"
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

}  // namespace lattice
