// The distributed optimizer's flat buffers in a torch_dist checkpoint, saved 'dp_reshardable'
// (megatron_distrib_optimizer.h).
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "checkpoint/megatron_distrib_optimizer.h"
#include "checkpoint/tensor_parts.h"
#include "checkpoint/torch_archive.h"
#include "checkpoint/torch_dcp.h"
#include "core/error.h"
#include "dist/layout_only_comm.h"
#include "model/gpt_model.h"
#include "pipeline/schedule.h"

namespace lattice {

namespace {

const std::string& kHint = kNoLoadOptimHint;

PyRef present(const PyRef& v) { return v && !v->is(PyValue::Kind::none) ? v : nullptr; }

std::string text_at(const PyRef& d, const std::string& key) {
  const PyRef v = d && d->is(PyValue::Kind::dict) ? d->get(key) : nullptr;
  return v && v->is(PyValue::Kind::string) ? v->text : "";
}

// Where a decoder layer's parameter comes in named_parameters: its rank among the layer's (Megatron-Core's
// TransformerLayer registers input_layernorm, self_attention (Attention's linear_proj before SelfAttention's
// linear_qkv, q_layernorm, k_layernorm), pre_mlp_layernorm, mlp (linear_fc1, linear_fc2); a module's weight before
// its bias; Transformer Engine's LayerNormLinear its layer_norm_weight, layer_norm_bias, weight, bias), or -1 for a
// name lattice does not place.
int layer_rank(const std::string& rest) {
  static const std::vector<std::string> order = {
      "input_layernorm.weight", "input_layernorm.bias",
      "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
      "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
      "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
      "self_attention.q_layernorm.weight", "self_attention.q_layernorm.bias",
      "self_attention.k_layernorm.weight", "self_attention.k_layernorm.bias",
      "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
      "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias",
      "mlp.linear_fc1.weight", "mlp.linear_fc1.bias",
      "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};
  const auto it = std::find(order.begin(), order.end(), rest);
  return it == order.end() ? -1 : int(it - order.begin());
}

// One parameter of a model chunk as Megatron names it there, with its place in named_parameters order.
struct ChunkParam {
  std::string megatron;  // its name in the chunk (decoder.layers.<j>.<rest>, the layer spec's names)
  std::string lattice;   // lattice's parameter ("": the last stage's copy of a tied word embedding)
  std::tuple<int, int64_t, int> order;
};

// Where one tensor-parallel rank's part of a parameter is: its bucket tensor (less the slot) and elements.
struct Piece {
  int tp;
  std::string bucket;  // optimizer.distributed.dp_group_idx_<i>.gbuf_idx_<g>.dtype_<...>.bucket_idx_<b>
  int64_t start, numel;
};

}  // namespace

void read_megatron_dp_reshardable(MegatronSource& out, const std::shared_ptr<DcpCheckpoint>& dcp,
                                  const TorchArchive& common, const MegatronArgs& m,
                                  std::function<void(const ParamInfo&, float*)> model_values) {
  const std::string& iter = out.iteration_dir;
  const PyRef root = common.root();
  const PyRef ns = root->get("args");
  const TransformerConfig& c = m.config;
  const std::string not_read = "saved as the distributed optimizer's flat buffers (optimizer.distributed.*: "
                               "Megatron-Core's default with --use-distributed-optimizer), which lattice does not "
                               "read in torch_dist ";
  const std::string resave = "; Megatron re-saves it in a form lattice reads when loading it with "
                             "--ckpt-convert-format torch --ckpt-convert-save DIR (distrib_optim.pt), or saving "
                             "with --dist-ckpt-optim-fully-reshardable";
  std::string sharding = text_at(present(root->get("content_metadata")), "distrib_optim_sharding_type");
  if (sharding.empty()) sharding = text_at(present(root->get("optimizer")), "param_state_sharding_type");
  if (sharding != "dp_reshardable") {
    out.optimizer_note = not_read + "(" + (sharding.empty() ? "no sharding type" : "sharding type " + sharding) +
                         " in common.pt; lattice reads dp_reshardable's)" + resave;
    return;
  }
  std::string why;
  if (c.moe()) why = "a mixture of experts' (its expert buffers)";
  if (c.mtp_num_layers > 0) why = "a model with prediction depths'";
  for (const auto& [fqn, t] : dcp->tensors())
    if (fqn.rfind("chained_", 0) == 0) why = "a chained optimizer's";
  if (const PyRef b = ns ? present(ns->get("ddp_num_buckets")) : nullptr) why = "buckets sized by --ddp-num-buckets";
  if (!why.empty()) {
    out.optimizer_note = not_read + "for " + why + resave;
    return;
  }

  // Each tensor-parallel rank's parameters (its parts' shapes), and each stage's model chunks' layers.
  const int T = out.tp, P = out.pp, V = out.vp;
  std::vector<std::unique_ptr<LayoutOnlyComm>> groups;
  auto rank_infos = std::make_shared<std::vector<std::map<std::string, ParamInfo>>>(size_t(T));
  for (int t = 0; t < T; ++t) {
    groups.push_back(std::make_unique<LayoutOnlyComm>(t, T));
    const ParamBuffer reg = GPTModel::parameter_registry(c, TensorParallel{groups.back().get(), false},
                                                         ModelPlacement{}, 0, 1);
    for (const ParamInfo& info : reg.infos()) (*rank_infos)[size_t(t)][info.name] = info;
  }
  const PipelineLayout layout = pipeline_layout_of(m.args);
  std::map<int64_t, std::tuple<int, int, int64_t>> layer_home;  // global layer -> (stage, chunk, its number there)
  for (int p = 0; p < P; ++p) {
    const auto chunks = stage_layers(layout, p);
    for (size_t v = 0; v < chunks.size(); ++v)
      for (int64_t l = chunks[v].first; l < chunks[v].second; ++l) layer_home[l] = {p, int(v), l - chunks[v].first};
  }

  // Every model chunk's parameters in named_parameters order: the embeddings, the layers, the final norm, the
  // output layer (LanguageModelEmbedding's word then position embeddings; GPTModel's embedding, decoder,
  // output_layer).
  std::map<std::pair<int, int>, std::vector<ChunkParam>> chunk_params;
  const std::string layers = "decoder.layers.";
  for (const auto& [name, info] : (*rank_infos)[0]) {
    ChunkParam cp{name, name, {0, 0, 0}};
    int p = P - 1, v = V - 1;
    if (name == "embedding.word_embeddings.weight" || name == "embedding.position_embeddings.weight") {
      p = v = 0;
      cp.order = {name == "embedding.word_embeddings.weight" ? 0 : 1, 0, 0};
    } else if (name.rfind(layers, 0) == 0) {
      const auto [prefix, rest] = split_layer_name(name);
      const int64_t l = std::stoll(prefix.substr(layers.size()));
      const auto& [stage, chunk, j] = layer_home.at(l);
      p = stage;
      v = chunk;
      const std::string fused = out.transformer_engine ? te_fused_norm_name(rest) : "";
      const std::string megatron_rest = fused.empty() ? rest : fused;
      const int rank = layer_rank(megatron_rest);
      if (rank < 0) {
        out.optimizer_note = not_read + "for a layer's " + megatron_rest + ", whose place in Megatron-Core's "
                             "named_parameters order lattice does not know" + resave;
        return;
      }
      cp.megatron = layers + std::to_string(j) + "." + megatron_rest;
      cp.order = {2, j, rank};
    } else if (name == "decoder.final_layernorm.weight" || name == "decoder.final_layernorm.bias") {
      cp.order = {3, name.ends_with("bias") ? 1 : 0, 0};
    } else if (name == "output_layer.weight") {
      cp.order = {4, 0, 0};
    } else {
      out.optimizer_note = not_read + "for " + name + ", whose place in Megatron-Core's named_parameters order "
                           "lattice does not know" + resave;
      return;
    }
    chunk_params[{p, v}].push_back(cp);
  }
  const bool tied = !c.untie_embeddings_and_output_weights;
  if (tied && P > 1)  // the last stage's copy of the word embeddings, a parameter there (its state the first's)
    chunk_params[{P - 1, V - 1}].push_back(ChunkParam{"output_layer.weight", "", {4, 0, 0}});
  for (auto& [at, list] : chunk_params)
    std::sort(list.begin(), list.end(), [](const ChunkParam& a, const ChunkParam& b) { return a.order < b.order; });

  // Each rank's buffers: model-parallel rank i = p T + t (Megatron's tp-pp group), buffer g = its model chunk v.
  auto flag = [&](const char* name) {
    const PyRef v = ns ? ns->get(name) : nullptr;
    return v && v->is(PyValue::Kind::boolean) && v->boolean;
  };
  const std::string dtype = flag("bf16") ? "bfloat16" : flag("fp16") ? "float16" : "float32";  // the model's
  const std::optional<int64_t> overlap_bucket_size = megatron_overlap_bucket_size(ns);
  auto plan = std::make_shared<std::map<std::string, std::vector<Piece>>>();
  std::set<std::string> used;
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) {
      const int i = p * T + t;
      for (int v = 0; v < V; ++v) {
        const std::string prefix = "optimizer.distributed.dp_group_idx_" + std::to_string(i) + ".gbuf_idx_" +
                                   std::to_string(v) + ".dtype_";
        std::string buffer_dtype;
        for (const auto& [fqn, tensor] : dcp->tensors())
          if (fqn.rfind(prefix, 0) == 0) {
            const size_t end = fqn.find(".bucket_idx_", prefix.size());
            const std::string d = end == std::string::npos ? fqn : fqn.substr(prefix.size(), end - prefix.size());
            if (!buffer_dtype.empty() && d != buffer_dtype)
              LATTICE_FAIL() << iter << ": rank " << i << "'s buffer " << v << " holds parameters of " << buffer_dtype
                             << " and " << d << "; lattice reads one dtype a model chunk" << kHint;
            buffer_dtype = d;
          }
        if (buffer_dtype.rfind("(torch." + dtype + ",", 0) != 0)
          LATTICE_FAIL() << iter << ": no tensor " << prefix << "(torch." << dtype << ", ...).bucket_idx_0.param (the "
                         << "distributed optimizer's buffer of tensor-parallel rank " << t << ", stage " << p
                         << ", model chunk " << v << ")" << (buffer_dtype.empty() ? "" : ", but " + buffer_dtype)
                         << kHint;
        const bool first = p == 0 && v == 0, last = p == P - 1 && v == V - 1;
        const std::vector<ChunkParam>& list = chunk_params[{p, v}];
        std::vector<MegatronBufferParam> sizes;
        for (const ChunkParam& cp : list) {
          const ParamInfo& part = (*rank_infos)[size_t(t)].at(cp.lattice.empty() ? "embedding.word_embeddings.weight"
                                                                                 : cp.lattice);
          sizes.push_back({part.numel, megatron_shared_embedding(cp.megatron, first, last, P, tied, false)});
        }
        const MegatronBufferLayout buffer = megatron_buffer_layout(sizes, first ? overlap_bucket_size : std::nullopt,
                                                                   true);
        const std::string bucket_of = prefix + buffer_dtype + ".bucket_idx_";
        for (size_t b = 0; b < buffer.bucket_numel.size(); ++b)
          for (const char* slot : {"param", "exp_avg", "exp_avg_sq"}) {
            const std::string fqn = bucket_of + std::to_string(b) + "." + slot;
            const auto it = dcp->tensors().find(fqn);
            if (it == dcp->tensors().end() || it->second.size != std::vector<int64_t>{buffer.bucket_numel[b]})
              LATTICE_FAIL() << iter << ": " << (it == dcp->tensors().end() ? "no tensor " + fqn
                                                 : fqn + " has size " + shape_str(it->second.size))
                             << ", where the " << list.size() << " parameters of tensor-parallel rank " << t
                             << ", stage " << p << ", model chunk " << v << " laid out as Megatron-Core's "
                             << "data-parallel buffer lays them make bucket " << b << " of " << buffer.bucket_numel[b]
                             << kHint;
            used.insert(fqn);
          }
        for (size_t k = 0; k < list.size(); ++k) {
          if (list[k].lattice.empty()) continue;
          const ParamInfo& part = (*rank_infos)[size_t(t)].at(list[k].lattice);
          if (part.tp_duplicated && t > 0) continue;  // every rank holds it whole: rank 0's
          (*plan)[list[k].lattice].push_back(
              Piece{t, bucket_of + std::to_string(buffer.bucket[k]), buffer.start[k], part.numel});
        }
      }
    }
  for (const auto& [fqn, t] : dcp->tensors())
    if (fqn.rfind("optimizer.distributed.", 0) == 0 && !used.count(fqn))
      LATTICE_FAIL() << iter << ": tensor " << fqn << " is not a bucket of the buffers the model its args describe "
                     << "makes" << kHint;

  // The step (each rank's param groups') and fp16's loss scaler, from the ShardedObjects (torch.save of [object]).
  MegatronOptimizerState o;
  std::vector<double> steps;
  for (int i = 0; i < T * P; ++i) {
    const std::string base = "optimizer.distributed.dp_group_idx_" + std::to_string(i) + ".";
    const std::string groups_item = base + "optimizer/shard_0_1";
    if (!dcp->bytes_items().count(groups_item))
      LATTICE_FAIL() << iter << ": no bytes item " << groups_item << " (the optimizer's param groups and step)" << kHint;
    const TorchArchive groups(iter + ": " + groups_item, dcp->read_bytes_item(groups_item));
    const PyRef list = groups.root();
    const PyRef obj = list && list->is(PyValue::Kind::list) && list->items.size() == 1 ? list->items[0] : nullptr;
    const PyRef pg = obj && obj->is(PyValue::Kind::dict) ? obj->get("param_groups") : nullptr;
    if (!pg || !pg->is(PyValue::Kind::list))
      LATTICE_FAIL() << iter << ": " << groups_item << " is " << (obj ? obj->describe() : list->describe())
                     << ", not [{'param_groups': [...]}]" << kHint;
    for (size_t g = 0; g < pg->items.size(); ++g)
      if (const auto s = groups.number(present(pg->items[g]->get("step")), groups_item + " param group step"))
        steps.push_back(*s);
    const std::string scaler_item = base + "grad_scaler/shard_0_1";
    if (!o.grad_scaler && dcp->bytes_items().count(scaler_item)) {
      const TorchArchive scaler(iter + ": " + scaler_item, dcp->read_bytes_item(scaler_item));
      const PyRef l = scaler.root();
      if (l && l->is(PyValue::Kind::list) && l->items.size() == 1 && present(l->items[0]) &&
          l->items[0]->is(PyValue::Kind::dict))
        o.grad_scaler = megatron_grad_scaler(*l->items[0], scaler, scaler_item);
    }
  }
  o.form = "the distributed optimizer's dp_reshardable buckets (torch_dist)";
  o.step = megatron_adam_step(steps, common.path());
  o.opt_param_scheduler = megatron_scheduler_state(common);

  // A parameter's slot, whole: each tensor-parallel rank's part from its bucket, placed where Megatron's split puts
  // it. The weights are the fp32 main parameters, each checked to round to the model's values.
  const std::string model_dtype = dtype;
  auto fill = [dcp, plan, rank_infos, model_values, model_dtype, iter](const std::string& slot) {
    return [=](const ParamInfo& info, float* dst) {
      for (const Piece& piece : plan->at(info.name)) {
        ParamInfo part = (*rank_infos)[size_t(piece.tp)].at(info.name);
        const bool whole = part.shape == info.shape;
        std::vector<float> local(whole ? 0 : size_t(part.numel));
        float* into = whole ? dst : local.data();
        dcp->read_float_range(piece.bucket + "." + slot, piece.start, piece.numel, into);
        if (whole) continue;
        part.offset = 0;
        for (const TensorPart& box : param_parts({part}, local.data(), part.tp_duplicated ? 0 : piece.tp))
          place_part(box, dst);
      }
      if (slot != "param") return;
      std::vector<float> model(size_t(info.numel));
      model_values(info, model.data());
      check_main_rounds_to_model(dst, model.data(), model.size(), model_dtype, iter, info.name,
                                 "the distributed optimizer's buffers are not laid out as lattice reads them");
    };
  };
  o.exp_avg = fill("exp_avg");
  o.exp_avg_sq = fill("exp_avg_sq");
  out.source.fill = fill("param");
  out.optimizer = std::move(o);
}

}  // namespace lattice
