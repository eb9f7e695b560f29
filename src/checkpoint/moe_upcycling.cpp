#include "checkpoint/moe_upcycling.h"

#include <algorithm>
#include <cmath>

#include "checkpoint/checkpoint.h"
#include "checkpoint/host_staging.h"
#include "checkpoint/model_checkpoint.h"
#include "checkpoint/tensor_parts.h"
#include "core/error.h"

namespace lattice {
namespace {

constexpr const char* kExperts = ".mlp.experts.local_experts.";

// This rank's boxes of p (one, unless tensor parallelism splits it in blocks).
std::vector<ParamBox> boxes_of(const ParamInfo& p) {
  if (p.tp_blocks > 1) return param_boxes(p, param_tp_rank(p));
  ParamBox b;
  b.offsets = p.global_offsets;
  b.lengths = p.shape;
  return {b};
}

// An expert parameter's name: "<layer>.mlp.experts.local_experts.<e>.<rest>" -> (dense name, e).
bool parse_expert(const std::string& name, std::string* dense, int64_t* expert) {
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return false;
  const size_t first = at + std::string(kExperts).size(), dot = name.find('.', first);
  *expert = std::stoll(name.substr(first, dot - first));
  *dense = name.substr(0, at) + ".mlp." + name.substr(dot + 1);
  return true;
}

}  // namespace

TransformerConfig dense_config_of(const TransformerConfig& moe) {
  TransformerConfig d = moe;
  const TransformerConfig none;
  d.num_experts = none.num_experts;
  d.moe_router_topk = none.moe_router_topk;
  d.moe_ffn_hidden_size = none.moe_ffn_hidden_size;
  d.moe_router_pre_softmax = none.moe_router_pre_softmax;
  d.moe_router_topk_scaling_factor = none.moe_router_topk_scaling_factor;
  d.moe_apply_probs_on_input = none.moe_apply_probs_on_input;
  d.moe_layer_pattern = none.moe_layer_pattern;
  d.moe_router_score_function = none.moe_router_score_function;
  d.moe_router_num_groups = none.moe_router_num_groups;
  d.moe_router_group_topk = none.moe_router_group_topk;
  d.moe_router_enable_expert_bias = none.moe_router_enable_expert_bias;
  d.moe_shared_expert_intermediate_size = none.moe_shared_expert_intermediate_size;
  d.moe_shared_expert_gate = none.moe_shared_expert_gate;
  d.moe_latent_size = none.moe_latent_size;
  return d;
}

int64_t upcycle_from_dense_checkpoint(const std::string& dir, GPTModel& moe, int64_t granularity) {
  const TransformerConfig& c = moe.config();
  const std::string flag = "--moe-use-upcycling: --load " + dir;
  if (!c.moe()) LATTICE_FAIL() << "--moe-use-upcycling needs --num-experts (the mixture of experts to make)";
  if (c.moe_latent_size > 0)
    LATTICE_FAIL() << "--moe-use-upcycling with --moe-latent-size is not possible: a latent expert's input is not the "
                      "dense MLP's";
  const CheckpointReader r = CheckpointReader::open(dir);
  const std::string where = r.iter_dir();
  const nlohmann::json& saved = r.state().model_config;
  if (saved.value("num_experts", int64_t(0)) > 0)
    LATTICE_FAIL() << flag << ": " << where << " is a mixture of experts already (num_experts "
                   << saved["num_experts"].dump() << "); upcycling starts from a dense model";
  check_model_config(saved, dense_config_of(c), where);

  // Megatron's granularity and weight scale.
  const int64_t Fd = c.ffn_hidden_size, Fe = c.moe_ffn_hidden_size, E = c.num_experts, k = c.moe_router_topk;
  if (Fe <= 0 || Fd % Fe != 0)
    LATTICE_FAIL() << "--moe-use-upcycling: the dense --ffn-hidden-size " << Fd
                   << " must be a multiple of --moe-ffn-hidden-size " << Fe;
  const int64_t g = Fd / Fe;
  if (g != granularity)
    LATTICE_FAIL() << "--moe-upcycling-granularity " << granularity << ": the dense --ffn-hidden-size " << Fd << " is "
                   << g << " x --moe-ffn-hidden-size " << Fe << " (give --moe-ffn-hidden-size "
                   << (granularity > 0 && Fd % granularity == 0 ? std::to_string(Fd / granularity) : std::string("Fd / G"))
                   << ")";
  if (E % g != 0)
    LATTICE_FAIL() << "--moe-use-upcycling: --num-experts " << E << " must be a multiple of the granularity " << g
                   << " (--ffn-hidden-size / --moe-ffn-hidden-size)";
  const double activation = c.moe_router_pre_softmax ? double(E / g) * double(g * g) / double(k) : double(g);
  const bool glu = c.gated_linear_unit();
  const bool degree3 = glu || c.gelu == GeluKind::squared_relu;  // Megatron: a^(1/3) for GLU and squared ReLU
  const float scale = float(degree3 ? std::cbrt(activation) : std::sqrt(activation));

  HostStaging params(moe.params().params(), moe.params().numel(), true);
  for (const ParamInfo& p : moe.params().infos()) {
    float* dst = params.data() + p.offset;
    std::string dense;
    int64_t e = 0;
    if (parse_expert(p.name, &dense, &e)) {
      const int64_t j = e % g;  // the dense MLP's piece this expert holds
      if (!r.has_tensor(dense)) LATTICE_FAIL() << flag << ": " << where << " has no tensor '" << dense << "'";
      const bool fc1 = dense.ends_with("linear_fc1.weight") || dense.ends_with("linear_fc1.bias");
      const bool fc2_bias = dense.ends_with("linear_fc2.bias");
      if (fc2_bias) {  // whole, unscaled (Megatron's _process_fc2_bias_param)
        read_param_part(r, dense, p, dst);
        continue;
      }
      for (const ParamBox& box : boxes_of(p)) {
        const int64_t cols = box.lengths.size() > 1 ? box.lengths[1] : 1;
        if (fc1) {  // rows: GLU's gate and up halves each cut in g pieces
          const int64_t r0 = box.offsets[0], rows = box.lengths[0];
          for (int64_t at = r0; at < r0 + rows;) {
            const int64_t half = glu ? at / Fe : 0, end = std::min(r0 + rows, (half + 1) * Fe);
            std::vector<int64_t> off = box.offsets, len = box.lengths;
            off[0] = half * Fd + j * Fe + (at - half * Fe);
            len[0] = end - at;
            r.read_slice(dense, "F32", off, len, dst + box.local_offset + (at - r0) * cols);
            at = end;
          }
        } else {  // fc2's weight: columns
          std::vector<int64_t> off = box.offsets;
          off[1] += j * Fe;
          r.read_slice(dense, "F32", off, box.lengths, dst + box.local_offset);
        }
      }
      for (int64_t i = 0; i < p.numel; ++i) dst[i] *= scale;
      continue;
    }
    if (p.name.ends_with(".mlp.router.weight")) {  // row i <- row i / g of its initial values
      for (int64_t i = E - 1; i >= 0; --i)
        std::copy(dst + (i / g) * c.hidden_size, dst + (i / g + 1) * c.hidden_size, dst + i * c.hidden_size);
      continue;
    }
    if (p.name.find(".mlp.router.") != std::string::npos || p.name.find(".mlp.shared_experts.") != std::string::npos)
      continue;  // the router's bias, the expert bias, the shared experts: their initial values
    if (!r.has_tensor(p.name)) LATTICE_FAIL() << flag << ": " << where << " has no tensor '" << p.name << "'";
    read_param_part(r, p.name, p, dst);
  }
  params.upload(moe.params().params());
  return g;
}

}  // namespace lattice
